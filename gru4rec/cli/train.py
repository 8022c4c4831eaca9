"""``gru4rec train``: train a model on an event file, optionally save and evaluate it.

:func:`build_config` and :func:`train_model` are shared with ``demo`` and ``run.py``;
:func:`interruption` (what Ctrl-C or SIGTERM leaves behind) with ``run.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.cli import observe
from gru4rec.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    FORCE_FLAG,
    MODEL_FILE_EXAMPLE,
    PRECISION_FLAG,
    PROG,
    ColumnFlags,
    EvalFlags,
    Interrupted,
    MachineFlags,
    UsageError,
    add_flags,
    check_readable,
    check_writable_target,
    column_flags,
    flag,
    flag_field,
    item_map_of,
    log_device_memory,
    nonnegative_int,
    not_a_flag,
    reset_device_memory_peak,
    uses_threads,
    write_json,
)
from gru4rec.cli.evaluate import check_test_files, evaluate_files
from gru4rec.cli.items import ItemFeatureFlags, item_feature_options
from gru4rec.errors import Gru4RecError

if TYPE_CHECKING:  # the heavy imports (torch, pandas) happen inside the functions
    from gru4rec.config import Config
    from gru4rec.recommender import GRU4Rec

__all__ = [
    "FLAGS",
    "TrainSettings",
    "add_arguments",
    "build_config",
    "interruption",
    "kept_after_failure",
    "run",
    "save_elsewhere",
    "train_model",
]

log = logging.getLogger(__name__)


def hyperparameter_epilog() -> str:
    """The hyperparameters ``-ps``/``-pf`` take, with their defaults, for ``train --help``."""
    import textwrap

    from gru4rec.config import Config

    defaults = Config().to_param_string().split(",")
    return ("hyperparameters (-ps NAME=VALUE,... or -pf FILE) and their defaults; each is explained in\n"
            "docs/behaviour.md §7 (Hyperparameters):\n" + textwrap.fill(", ".join(defaults), width=90,
                                                                 initial_indent="  ", subsequent_indent="  "))


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


_PARAMS = "hyperparameters (docs/behaviour.md §7; -ps is applied on top of -pf)"
_OUTPUT = "output"
#: The flags whose help differs from the shared one: the columns' default is the params', -f is an output flag.
FLAGS = {**column_flags("the params"), "force": dataclasses.replace(FORCE_FLAG, group=_OUTPUT)}


@dataclass(frozen=True, kw_only=True)
class TrainSettings(ItemFeatureFlags, observe.ObserveFlags, EvalFlags, ColumnFlags, MachineFlags):
    """The settings of ``gru4rec train``: a field per flag, declared with it (``command_line`` as it was run)."""

    data: str = flag(metavar="DATA",
                     help="training events: TSV/CSV/Parquet (optionally .gz) with session, item "
                          "and time columns (try 'gru4rec demo' for a run on synthetic data)")
    params: str | None = flag("-ps", "--params", metavar="STR", group=_PARAMS, default=None,
                              help="parameter string, e.g. 'loss=bpr-max,layers=200/200,n_epochs=5' (lists use '/')")
    param_file: str | None = flag("-pf", "--param-file", metavar="FILE", group=_PARAMS, default=None,
                                  help="parameter file: the original's .py (OrderedDict, read without "
                                       "executing it), .json, .toml or .yaml, e.g. paramfiles/<name>.py")
    seed: int | None = flag("--seed", type=int, group=_PARAMS, default=None,
                            help="random seed for weights, sampling and dropout (overrides the params)")
    sample_store_size: int | None = flag("-ss", "--sample-store-size", metavar="N", type=nonnegative_int, group=_PARAMS,
                                         default=None, help="negative-sample ids pre-drawn at once (overrides the params; "
                                                            "default 10,000,000)")
    init_from: str | None = flag("--init-from", metavar="MODEL", group=_PARAMS, default=None,
                                 help="warm start: continue the model in MODEL on DATA (its items keep their rows, new items "
                                      "get fresh ones; MODEL's parameters are the defaults of -ps/-pf: give only what "
                                      "changes, e.g. n_epochs; a different network parameter is an error; its optimiser "
                                      "state is carried if MODEL was saved with --save-optimizer; docs/retraining.md)")
    save: str | None = flag("-s", "--save", metavar="MODEL", group=_OUTPUT, default=None,
                            help=f"save the trained model to MODEL (a safe single-file format, e.g. {MODEL_FILE_EXAMPLE})")
    save_optimizer: bool = flag("--save-optimizer", action="store_true", group=_OUTPUT, default=False,
                                help="also save the optimiser's state in MODEL, for a later --init-from (a larger file)")
    checkpoint_dir: str | None = flag("--checkpoint-dir", metavar="DIR", group=_OUTPUT, default=None,
                                      help="keep a resumable checkpoint in DIR: after every epoch, every --checkpoint-every "
                                           "minutes, and on Ctrl-C/SIGTERM (at the next step); removed when training "
                                           "completes")
    checkpoint_every: float | None = flag("--checkpoint-every", metavar="MINUTES", type=positive_float, group=_OUTPUT,
                                          default=None, help="also checkpoint inside an epoch, at the first step after "
                                                             "every MINUTES minutes")
    resume: bool = flag("--resume", action="store_true", group=_OUTPUT, default=False,
                        help="continue the run whose checkpoint is in --checkpoint-dir, to the same final model "
                             "as an uninterrupted run (an error if there is none)")
    keep_checkpoint: bool = flag("--keep-checkpoint", action="store_true", group=_OUTPUT, default=False,
                                 help="keep the checkpoint after training completes (e.g. to resume with more n_epochs)")
    precision: str = flag_field(PRECISION_FLAG, "float32")
    command_line: list[str] | None = not_a_flag()  # set by the dispatcher: the command as run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec train`` (:class:`TrainSettings`), and the hyperparameters in the epilog."""
    parser.epilog = hyperparameter_epilog()
    add_flags(parser, TrainSettings, FLAGS)


@uses_threads
def run(args: TrainSettings) -> int:
    """Run ``gru4rec train``: every check first, then train, save, evaluate."""
    if args.checkpoint_dir is None:
        given = [flag for flag, on in (("--resume", args.resume), ("--checkpoint-every", args.checkpoint_every),
                                       ("--keep-checkpoint", args.keep_checkpoint)) if on]
        if given:
            raise UsageError(f"{', '.join(given)} needs --checkpoint-dir (where the checkpoint is)")
    if args.save_optimizer and not args.save:
        raise UsageError("--save-optimizer needs --save (the model file to write)")
    check_writable_target(args.save, args.force, "model file")
    check_writable_target(args.metrics_json, args.force, "metrics file")
    check_writable_target(args.checkpoint_dir, True, "checkpoint folder", folder=True)  # fit checks its content
    check_readable([args.data], "training data")
    if args.init_from is not None:
        check_readable([args.init_from], "model to warm-start from")
    check_readable(args.test, "test file")
    watch = observe.Observation(args, command=args.command_line or [PROG, "train"],
                                cutoffs=args.measure, mode=args.eval_mode, force=args.force)
    config = build_config(
        args.param_file, args.params, seed=args.seed, sample_store_size=args.sample_store_size,
        session_key=args.session_key, item_key=args.item_key, time_key=args.time_key,
    )
    if args.init_from is not None:  # the model's fields are the defaults; a different network is refused now
        from gru4rec.formats.model_file import read_model_config
        from gru4rec.training.warm_start import inherit_config

        config = inherit_config(read_model_config(args.init_from), config, args.init_from)
    check_test_files(args.test, config)  # the model will have config's column names
    features = item_feature_options(args, config.item_key)
    saved = None
    try:
        try:
            fit_options = watch.start(config, device=args.device, precision=args.precision, data=args.data, tests=args.test)
            fit_options = {**(fit_options or {}), **features}
            model = train_model(args.data, config, device=args.device, precision=args.precision, threads=args.threads,
                                checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                                checkpoint_every=args.checkpoint_every, fit_options=fit_options, init_from=args.init_from)
        finally:
            watch.close()
        try:
            watch.trained(model)
            if watch.run_folder is not None:
                saved = str(watch.run_folder.model_path)
            if args.save:
                model.save(args.save, overwrite=args.force, optimizer=args.save_optimizer)
                saved = args.save
                log.info("Saved model to %s", args.save)
            if args.checkpoint_dir and not args.keep_checkpoint:
                _remove_checkpoint(args.checkpoint_dir)  # only now: the saved model replaces it
            if args.test:
                report = evaluate_files(model, args.test, cutoffs=args.measure, mode=args.eval_mode,
                                        batch_size=args.eval_batch_size, extended=True, json_cutoffs=watch.eval_cutoffs)
                watch.evaluated(report)
                if args.metrics_json:
                    write_json(args.metrics_json, report, force=args.force)
        except KeyboardInterrupt:  # during the evaluation: the trained model is kept all the same
            saved = saved if saved is not None else save_elsewhere(model)
            raise
        except Exception as exc:
            kept = kept_after_failure(exc, model, saved)
            if kept is exc:
                raise
            raise kept from exc
    except KeyboardInterrupt as exc:
        command = args.command_line
        raise interruption(exc, checkpoint_dir=args.checkpoint_dir, argv=command[1:] if command else None,
                           saved=saved) from exc
    return EXIT_OK


def _remove_checkpoint(folder: str) -> None:
    from gru4rec.training.resume import CHECKPOINT_NAME

    (Path(folder) / CHECKPOINT_NAME).unlink(missing_ok=True)


def interruption(exc: KeyboardInterrupt, *, checkpoint_dir: str | None, argv: Sequence[str] | None,
                 saved: str | None = None, program: str = PROG) -> Interrupted:
    """What to tell a user whose training was stopped by Ctrl-C or SIGTERM: the exact command
    that resumes it when a checkpoint exists, else that nothing was kept (or what was)."""
    from gru4rec.errors import TrainingInterrupted
    from gru4rec.training.resume import CHECKPOINT_NAME

    code = 128 + exc.signal_number if isinstance(exc, TrainingInterrupted) else EXIT_INTERRUPTED
    ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir else None
    if saved is not None:
        return Interrupted(f"training had finished: the model was saved to {saved}", code)
    if ckpt is not None and ckpt.exists() and argv is not None:
        words = [program, *argv] + ([] if "--resume" in argv else ["--resume"])
        return Interrupted(f"checkpoint in {ckpt}; resume with: {shlex.join(words)}", code)
    if checkpoint_dir:
        return Interrupted("nothing was kept: no checkpoint had been written yet", code)
    return Interrupted("nothing was kept (gru4rec train --checkpoint-dir DIR makes a run resumable)", code)


class TrainedModelKept(Gru4RecError):
    """What followed training failed; the message names the file that holds the trained model."""


def kept_after_failure(exc: Exception, model: GRU4Rec, saved: str | None) -> Exception:
    """What to raise when what follows training (saving, evaluating) fails with ``exc``: the
    trained model is never lost with it. ``saved``: where it was already saved (``-s``, the run
    folder), else it is saved now to a new file in the working folder (the temporary folder if
    that cannot be written). A user error comes back as one :class:`TrainedModelKept` naming
    both the problem and the file; any other exception (a bug, which keeps its traceback) is
    returned as it is, after a log line naming the file."""
    from gru4rec.cli.common import error_message

    where = saved if saved is not None else save_elsewhere(model)
    kept = (f"the trained model was saved to {where} (evaluate it with: {PROG} evaluate {shlex.quote(where)} -t TEST)"
            if where is not None else "the trained model could not be saved anywhere")
    if isinstance(exc, (Gru4RecError, OSError, MemoryError)):
        return TrainedModelKept(f"{error_message(exc)}; training had finished: {kept}")
    log.error("Training had finished: %s", kept)
    return exc


def save_elsewhere(model: GRU4Rec) -> str | None:
    """Save ``model`` to a new ``gru4rec-unsaved-<time>.safetensors`` in the working folder, else
    in the temporary folder; returns the path (None if neither could be written)."""
    import tempfile

    name = f"gru4rec-unsaved-{time.strftime('%Y%m%d-%H%M%S')}"
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        n = 0
        while (path := folder / f"{name}{f'-{n}' if n else ''}.safetensors").exists():
            n += 1
        try:
            model.save(path)
        except (Gru4RecError, OSError) as exc:
            log.warning("Could not save the trained model to %s: %s", path, exc)
            continue
        return str(path)
    return None


def build_config(
    param_file: str | None,
    param_string: str | None,
    *,
    seed: int | None = None,
    sample_store_size: int | None = None,
    session_key: str | None = None,
    item_key: str | None = None,
    time_key: str | None = None,
) -> Config:
    """Config from ``-pf`` then ``-ps`` on top, then the dedicated flags on top of both."""
    from gru4rec.config import Config

    config = Config.from_file(param_file) if param_file else Config()
    if param_string:
        config = config.replace_from_string(param_string)
    overrides: dict[str, Any] = {
        "seed": seed,
        "sample_store_size": sample_store_size,
        "session_key": session_key,
        "item_key": item_key,
        "time_key": time_key,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return config.replace(**overrides) if overrides else config


def train_model(
    data: str,
    config: Config,
    *,
    device: str,
    precision: str = "float32",
    threads: int | None = None,
    checkpoint_dir: str | None = None,
    resume: bool = False,
    checkpoint_every: float | None = None,
    fit_options: dict[str, Any] | None = None,
    init_from: str | None = None,
) -> GRU4Rec:
    """Train a GRU4Rec on the event file ``data``, with the original's per-epoch lines and a
    progress bar (on a terminal), then the time it took and (on CUDA) the peak memory. A
    checkpoint in ``checkpoint_dir`` is kept (the caller removes it once the model is safe).
    ``fit_options``: more keyword arguments of ``fit`` (validation, callbacks: see
    :class:`gru4rec.cli.observe.Observation`). ``init_from``: a model file to warm-start from."""
    from gru4rec.recommender import GRU4Rec

    log.info("Training GRU4Rec on %s", data)
    log.info("Parameters: %s", config.to_param_string())
    model = GRU4Rec(config, device=device, precision=precision, threads=threads)
    reset_device_memory_peak(model)
    start = time.perf_counter()
    model.fit(data, checkpoint_dir=checkpoint_dir, resume=resume, checkpoint_every=checkpoint_every,
              keep_checkpoint=True, progress=True, init_from=init_from, **(fit_options or {}))
    elapsed = time.perf_counter() - start
    log.info("Training took %.2fs on %s (%d items)", elapsed, model.device, len(item_map_of(model)))
    log_device_memory(model, "training")
    return model
