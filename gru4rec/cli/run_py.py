"""The original GRU4Rec ``run.py`` command line, flag for flag, over the same code as
``gru4rec train`` and ``gru4rec evaluate``.

As in the original, everything is on standard output (the messages through the package's
default console, see :mod:`gru4rec.cli.console`); :func:`gru4rec.cli.run_py_main` runs it.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gru4rec.cli import observe
from gru4rec.cli.common import (
    EVAL_MODES,
    EXIT_OK,
    MODEL_FILE_EXAMPLE,
    PRECISION_FLAG,
    THREADS_FLAG,
    UsageError,
    add_flags,
    check_readable,
    check_writable_target,
    flag,
    flag_field,
    load_model,
    nonnegative_int,
    not_a_flag,
    positive_int,
    uses_threads,
)
from gru4rec.cli.evaluate import check_test_files, evaluate_files
from gru4rec.cli.items import ItemFeatureFlags, item_feature_options
from gru4rec.cli.train import build_config, interruption, kept_after_failure, save_elsewhere, train_model

if TYPE_CHECKING:
    from gru4rec.evaluation.metrics import TieMode

__all__ = ["PROG", "RunPySettings", "build_parser", "run"]

log = logging.getLogger(__name__)

PROG = "run.py"


@dataclass(frozen=True, kw_only=True)
class RunPySettings(ItemFeatureFlags, observe.ObserveFlags):
    """The settings of ``run.py``: a field per flag, declared with it, the original's names
    (``command_line`` as run)."""

    path: str = flag(metavar="PATH", help="training data (TSV/CSV/Parquet) or, with -l, a saved model file")
    # One of -ps, -pf, -l is required, -l goes with neither (checked by run: argparse's groups
    # cannot say "-ps and -pf together, -l alone"). -ps and -pf together is this package's
    # addition: the original refuses it.
    parameter_string: str | None = flag("-ps", "--parameter_string", metavar="PARAM_STRING", default=None,
                                        help="parameters as 'name=value,name=value' (lists with '/'), e.g. "
                                             "'loss=bpr-max,layers=100,n_sample=2048'; with -pf, overrides of the "
                                             "file's values (e.g. -ps n_epochs=2)")
    parameter_file: str | None = flag("-pf", "--parameter_file", metavar="PARAM_PATH", default=None,
                                      help="parameter file (the original's OrderedDict .py, or .json/.toml/.yaml)")
    load_model: bool = flag("-l", "--load_model", action="store_true", default=False,
                            help="PATH is a saved model: load it instead of training (not with -ps/-pf)")
    save_model: str | None = flag("-s", "--save_model", metavar="MODEL_PATH", default=None,
                                  help=f"save the trained model to MODEL_PATH, e.g. {MODEL_FILE_EXAMPLE} (refuses to "
                                       "overwrite an existing file unless --force)")
    test: list[str] | None = flag("-t", "--test", metavar="TEST_PATH", nargs="+", default=None,
                                  help="evaluate on these test files (one result block per file)")
    measure: list[int] = flag("-m", "--measure", metavar="AT", type=positive_int, nargs="*", default_factory=lambda: [20],
                              help="list lengths for Recall and MRR (default: 20)")
    eval_type: TieMode = flag("-e", "--eval_type", choices=EVAL_MODES, default="standard",
                              help="tie handling in ranks: standard, conservative, median, tiebreaking (default: standard)")
    sample_store_size: int | None = flag("-ss", "--sample_store_size", metavar="SS", type=nonnegative_int, default=None,
                                         help="negative-sample ids pre-drawn at once (default: 10,000,000)")
    gru4rec_model: str | None = flag("-g", "--gru4rec_model", metavar="GRFILE", default=None,
                                     help="accepted for compatibility and ignored (the original chose a "
                                          "gru4rec implementation module with it)")
    device: str = flag("-d", "--device", default="auto", help="torch device: auto, cpu, cuda, cuda:0, ... (default: auto)")
    precision: str = flag_field(PRECISION_FLAG, "float32")
    threads: int | None = flag_field(THREADS_FLAG, None)
    item_key: str | None = flag("-ik", "--item_key", metavar="IK", default=None,
                                help="item id column (default: ItemId, or the loaded model's)")
    session_key: str | None = flag("-sk", "--session_key", metavar="SK", default=None,
                                   help="session id column (default: SessionId, or the loaded model's)")
    time_key: str | None = flag("-tk", "--time_key", metavar="TK", default=None,
                                help="timestamp column (default: Time, or the loaded model's)")
    primary_metric: str = flag("-pm", "--primary_metric", choices=("recall", "mrr"), default="recall",
                               help="metric reported by -lpm (default: recall)")
    log_primary_metric: bool = flag("-lpm", "--log_primary_metric", action="store_true", default=False,
                                    help="print 'PRIMARY METRIC: x', the primary metric at the first -m cutoff")
    seed: int | None = flag("--seed", type=int, default=None, help="random seed (overrides the params)")
    force: bool = flag("--force", action="store_true", default=False, help="allow -s to overwrite an existing file")
    command_line: list[str] | None = not_a_flag()  # set by the dispatcher: the command as run


def build_parser() -> argparse.ArgumentParser:
    """The original GRU4Rec ``run.py`` command line, flag for flag (:class:`RunPySettings`)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train or load a GRU4Rec model, then evaluate it (the original run.py's flags; "
                    "see also the 'gru4rec' command).",
    )
    add_flags(parser, RunPySettings)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return parser


@uses_threads
def run(args: RunPySettings) -> int:
    """Train (or load with ``-l``), optionally save, then evaluate on every ``-t`` file."""
    if args.gru4rec_model is not None:
        log.info("Note: -g %s is ignored (this implementation is the gru4rec package)", args.gru4rec_model)
    measure = args.measure or [20]  # '-m' without a value keeps the default, as in the original
    keys = {"session_key": args.session_key, "item_key": args.item_key, "time_key": args.time_key}
    check_writable_target(args.save_model, args.force, "model file")
    check_readable(args.test, "test file")
    watch = None
    given = [flag for flag, value in (("-ps/--parameter_string", args.parameter_string),
                                      ("-pf/--parameter_file", args.parameter_file)) if value is not None]
    if not given and not args.load_model:
        raise UsageError("one of the arguments -ps/--parameter_string -pf/--parameter_file -l/--load_model is required")
    if given and args.load_model:
        raise UsageError(f"argument -l/--load_model: not allowed with argument {given[0]}")
    if args.load_model:
        if args.sample_store_size is not None or args.seed is not None:
            log.info("Note: -ss/--seed only affect training and are ignored with -l")
        if args.item_features is not None:
            raise UsageError("--item-features trains a model; it does not go with -l (a loaded model has its attributes)")
        if args.valid or args.run_dir or args.tensorboard:
            raise UsageError("--valid, --early-stop, --run-dir and --tensorboard watch a training run; they do not go with -l")
        model = load_model(args.path, args.device)
    else:
        check_readable([args.path], "training data")
        watch = observe.Observation(args, command=args.command_line or ["python", PROG],
                                    cutoffs=measure, mode=args.eval_type, force=args.force)
        config = build_config(args.parameter_file, args.parameter_string, seed=args.seed,
                              sample_store_size=args.sample_store_size, **keys)
        # Every test file is read now: the original's everyday command (no -s) would otherwise
        # train for hours, then fail on a test file's missing column and keep nothing.
        check_test_files(args.test, config)
        features = item_feature_options(args, config.item_key)
        try:
            fit_options = watch.start(config, device=args.device, precision=args.precision, data=args.path, tests=args.test)
            fit_options = {**(fit_options or {}), **features}
            model = train_model(args.path, config, device=args.device, precision=args.precision, threads=args.threads,
                                fit_options=fit_options)
        except KeyboardInterrupt as exc:  # run.py keeps no checkpoints (gru4rec train does)
            raise interruption(exc, checkpoint_dir=None, argv=None) from exc
        finally:
            watch.close()
        keys = {}  # the model's config carries them now
    saved = None
    try:
        if watch is not None:
            watch.trained(model)
            if watch.run_folder is not None:
                saved = str(watch.run_folder.model_path)
        if args.save_model:
            model.save(args.save_model, overwrite=args.force)
            saved = args.save_model
            log.info("Saved model to %s", args.save_model)
        if args.test:
            report = evaluate_files(model, args.test, cutoffs=measure, mode=args.eval_type, batch_size=512,
                                    extended=False,
                                    primary_metric=args.primary_metric if args.log_primary_metric else None,
                                    keys=keys, json_cutoffs=watch.eval_cutoffs if watch is not None else ())
            if watch is not None:
                watch.evaluated(report)
    except KeyboardInterrupt as exc:
        if watch is None:
            raise
        where = saved if saved is not None else save_elsewhere(model)
        raise interruption(exc, checkpoint_dir=None, argv=None, saved=where) from exc
    except Exception as exc:
        if watch is None:  # a loaded model (-l): its file is where it is kept
            raise
        kept = kept_after_failure(exc, model, saved)
        if kept is exc:
            raise
        raise kept from exc
    return EXIT_OK
