"""The ``gru4rec`` command line: one registry of subcommands, each a few lines over the Python API.

    gru4rec demo                                   synthetic data -> train -> evaluate, one command
    gru4rec train DATA [-ps STR] [-pf FILE] [--save MODEL] [--test TEST ...] [-m 1 5 10 20] ...
    gru4rec evaluate --model MODEL --test TEST [TEST ...] [-m ...] [-e MODE]
    gru4rec recommend --model MODEL --input SESSIONS --output RECS [--k 20] [--exclude-seen]
    gru4rec info MODEL
    gru4rec synth OUT_DIR
    gru4rec preprocess | split | paropt ...        (registered from their modules' hooks)

Conventions shared by every subcommand:

* exit code 0 on success, 1 for a runtime error (bad data, unreadable or corrupt file, ...),
  2 for a usage error (bad flags, invalid hyperparameters), 130 when interrupted;
* an error from :mod:`gru4rec.errors` (or a missing/unreadable file) prints one line
  ``gru4rec: error: ...`` and no traceback; ``--debug`` shows the traceback instead;
* results go to stdout, progress and timings to stderr (``run.py`` keeps the original's single
  stream on stdout);
* nothing a user made is overwritten without ``--force``.

``run.py`` at the repository root is the original GRU4Rec's command line (flag-compatible); its
parser lives here too (:func:`run_py_main`) so both share the training/evaluation code.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gru4rec.errors import ConfigError, Gru4RecError
from gru4rec.files import atomic_write

if TYPE_CHECKING:  # the heavy imports (torch, pandas) happen inside the commands
    from gru4rec.config import Config
    from gru4rec.recommender import GRU4Rec

__all__ = ["main", "run_py_main", "Command", "COMMANDS", "register", "build_parser", "build_run_py_parser"]

PROG = "gru4rec"
EVAL_MODES = ("standard", "conservative", "median", "tiebreaking")
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A problem with the command line itself (exit code 2); raised by the commands' checks."""


# --------------------------------------------------------------------------------------- output


@dataclasses.dataclass
class _Streams:
    """Where results and progress go (``run.py`` sends both to stdout, like the original)."""

    out: IO[str]
    log: IO[str]

    def result(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    def info(self, line: str) -> None:
        print(line, file=self.log, flush=True)


def _streams(args: argparse.Namespace) -> _Streams:
    log = sys.stdout if getattr(args, "_single_stream", False) else sys.stderr
    return _Streams(out=sys.stdout, log=log)


# ------------------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help, how to add its flags and how to run it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    description: str | None = None
    #: Returns why the command cannot run in this installation (None when it can).
    unavailable: Callable[[], str | None] = lambda: None


#: The one registry of subcommands, in the order ``gru4rec --help`` lists them.
COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    """Add (or replace) a subcommand in :data:`COMMANDS`."""
    COMMANDS[command.name] = command
    return command


def _hook_command(
    name: str,
    help: str,
    module: str,
    *,
    add: str = "add_arguments",
    run: str = "run",
    description: str | None = None,
) -> Command:
    """A subcommand implemented in another module by two hooks: ``<add>(parser)`` adds its
    flags and ``<run>(args) -> int`` runs it (by default named ``add_arguments`` and ``run``).

    The module is imported only when this subcommand is used, so ``gru4rec --help`` and every
    other command keep working when the module (or its optional dependency) is missing.
    """

    add_name, run_name = add, run

    def resolve() -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int | None]] | str:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            return f"the '{name}' command is not available: cannot import {module} ({exc})"
        add_hook = getattr(mod, add_name, None)
        run_hook = getattr(mod, run_name, None)
        if not callable(add_hook) or not callable(run_hook):
            return f"the '{name}' command is not available: {module} has no {add_name}/{run_name} hooks"
        return add_hook, run_hook

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        hooks = resolve()
        if not isinstance(hooks, str):
            hooks[0](parser)

    def run_command(args: argparse.Namespace) -> int | None:
        hooks = resolve()
        if isinstance(hooks, str):
            raise Gru4RecError(hooks)
        return hooks[1](args)

    def unavailable() -> str | None:
        hooks = resolve()
        return hooks if isinstance(hooks, str) else None

    return Command(name, help, add_arguments, run_command, description, unavailable)


# ------------------------------------------------------------------------------- shared flags


def _add_column_keys(parser: argparse.ArgumentParser, *, default_from: str) -> None:
    group = parser.add_argument_group("column names")
    group.add_argument("-sk", "--session-key", metavar="COLUMN", default=None,
                       help=f"session id column (default: {default_from}, normally SessionId)")
    group.add_argument("-ik", "--item-key", metavar="COLUMN", default=None,
                       help=f"item id column (default: {default_from}, normally ItemId)")
    group.add_argument("-tk", "--time-key", metavar="COLUMN", default=None,
                       help=f"timestamp column (default: {default_from}, normally Time)")


def _add_eval_flags(parser: argparse.ArgumentParser, *, test_required: bool) -> None:
    group = parser.add_argument_group("evaluation")
    group.add_argument("-t", "--test", metavar="TEST", nargs="+", required=test_required, default=None,
                       help="test event files; events with items unknown to the model are dropped"
                            + ("" if test_required else " (default: no evaluation)"))
    group.add_argument("-m", "--measure", metavar="K", type=_positive_int, nargs="+", default=[20],
                       help="cutoffs of the ranked lists for Recall@K, MRR@K, ... (default: 20)")
    group.add_argument("-e", "--eval-mode", choices=EVAL_MODES, default="standard",
                       help="how ties with the target's score count in its rank: standard "
                            "(optimistic, the original's default), conservative (pessimistic, "
                            "used for published comparisons), median, or tiebreaking (random "
                            "noise) (default: standard)")
    group.add_argument("--eval-batch-size", metavar="N", type=_positive_int, default=512,
                       help="test sessions evaluated in parallel (memory vs speed; default: 512)")
    group.add_argument("--metrics-json", metavar="FILE", default=None,
                       help="also write every metric of every test file to FILE as JSON")


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--device", default="auto",
                        help="torch device: auto (CUDA if available, else CPU), cpu, cuda, "
                             "cuda:1, ... (default: auto)")


def _add_precision(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                        help="training precision: float32 (default), or bfloat16 for 16-bit operands "
                             "in the matrix products (mixed precision; the loss, "
                             "the gates and the optimiser stay float32)")


def _add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--force", action="store_true",
                        help="overwrite output files that already exist")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


# ------------------------------------------------------------------------------- shared logic


def _build_config(
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


def _check_writable_target(path: str | None, force: bool, what: str) -> None:
    """Fail before hours of training, not after, when an output could not be written."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {p} is a directory")
    if p.exists() and not force:
        raise UsageError(f"{what} {p} already exists; use --force to overwrite it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {what} {p}: directory {parent} does not exist")


def _check_readable(paths: Sequence[str] | None, what: str) -> None:
    for path in paths or ():
        if not Path(path).exists():
            raise FileNotFoundError(2, f"{what} not found", path)


def _on_cuda(model: Any) -> bool:
    return getattr(getattr(model, "device", None), "type", None) == "cuda"


def _reset_device_memory_peak(model: Any) -> None:
    """Start a new peak so that each phase (training, evaluation) reports its own."""
    if _on_cuda(model):
        import torch

        torch.cuda.reset_peak_memory_stats(model.device)


def _device_memory_note(model: Any, phase: str) -> str | None:
    """Peak CUDA memory of the model's device since the last reset, or None off CUDA."""
    if not _on_cuda(model):
        return None
    import torch

    peak = torch.cuda.max_memory_allocated(model.device)
    reserved = torch.cuda.max_memory_reserved(model.device)
    return (f"Peak device memory ({phase}): {peak / 2**20:.1f} MiB allocated, "
            f"{reserved / 2**20:.1f} MiB reserved on {model.device}")


def _train(
    data: str,
    config: Config,
    *,
    device: str,
    streams: _Streams,
    precision: str = "float32",
    checkpoint_dir: str | None = None,
    resume: bool = False,
) -> GRU4Rec:
    from gru4rec.recommender import GRU4Rec

    streams.info(f"Training GRU4Rec on {data}")
    streams.info(f"Parameters: {config.to_param_string()}")
    model = GRU4Rec(config, device=device, precision=precision)
    _reset_device_memory_peak(model)
    start = time.perf_counter()
    # fit() logs the original's per-epoch lines (and draws a progress bar on a terminal); the
    # gru4rec logger's default handler writes them to stdout, here redirected to streams.log.
    with contextlib.redirect_stdout(streams.log):
        model.fit(data, checkpoint_dir=checkpoint_dir, resume=resume, progress=True)
    elapsed = time.perf_counter() - start
    streams.info(f"Training took {elapsed:.2f}s on {model.device} ({len(model.item_map)} items)")
    note = _device_memory_note(model, "training")
    if note:
        streams.info(note)
    return model


def _load_model(path: str, device: str, streams: _Streams) -> GRU4Rec:
    from gru4rec.recommender import GRU4Rec

    start = time.perf_counter()
    model = GRU4Rec.load(path, device=device)
    streams.info(f"Loaded model {path} ({len(model.item_map)} items) in {time.perf_counter() - start:.2f}s")
    return model


def _metric_lines(result: Any, cutoffs: Sequence[int], *, extended: bool) -> list[str]:
    lines = []
    for c in cutoffs:
        line = f"Recall@{c}: {result.recall[c]:.6f} MRR@{c}: {result.mrr[c]:.6f}"
        if extended:
            line += (f" NDCG@{c}: {result.ndcg[c]:.6f} Coverage@{c}: {result.coverage[c]:.6f}"
                     f" Popularity@{c}: {result.popularity[c]:.6f}")
        lines.append(line)
    return lines


def _evaluate_all(
    model: Any,
    tests: Sequence[str],
    *,
    cutoffs: Sequence[int],
    mode: str,
    batch_size: int,
    streams: _Streams,
    extended: bool,
    primary_metric: str | None = None,
    keys: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Evaluate on each test file, print the original's result lines; returns JSON-able metrics."""
    from gru4rec.data.events import read_events
    from gru4rec.evaluation.evaluator import evaluate

    config = model.config
    keys = keys or {}
    key_args = {
        "session_key": keys.get("session_key") or config.session_key,
        "item_key": keys.get("item_key") or config.item_key,
        "time_key": keys.get("time_key") or config.time_key,
    }
    cutoffs = list(dict.fromkeys(cutoffs))  # keep the order (the first is the primary), drop repeats
    report: dict[str, Any] = {}
    for test in tests:
        streams.info(f"Evaluating on {test} (mode: {mode})")
        _reset_device_memory_peak(model)
        start = time.perf_counter()
        frame = read_events(test, **key_args)
        # The model was trained on its own column names; present the test set under them.
        rename = {key_args[k]: getattr(config, k) for k in key_args if key_args[k] != getattr(config, k)}
        if rename:
            frame = frame.rename(columns=rename)
        result = evaluate(model, frame, cutoffs=tuple(cutoffs), mode=mode, batch_size=batch_size)
        elapsed = time.perf_counter() - start
        streams.info(
            f"Evaluation took {elapsed:.2f}s: {result.n_predictions} predictions, "
            f"{result.n_dropped_events} events with items unknown to the model dropped"
        )
        note = _device_memory_note(model, "evaluation")
        if note:
            streams.info(note)
        for line in _metric_lines(result, cutoffs, extended=extended):
            streams.result(line)
        if primary_metric is not None:
            table = result.recall if primary_metric == "recall" else result.mrr
            streams.result(f"PRIMARY METRIC: {table[cutoffs[0]]}")
        name = test if test not in report else f"{test}#{len(report) + 1}"  # the same file twice
        report[name] = {
            "mode": mode,
            "n_predictions": int(result.n_predictions),
            "n_dropped_events": int(result.n_dropped_events),
            "seconds": elapsed,
            **{name: {str(c): float(getattr(result, name)[c]) for c in cutoffs}
               for name in ("recall", "mrr", "ndcg", "coverage", "popularity")},
        }
    return report


def _write_json(path: str, payload: Any, *, force: bool) -> None:
    """Atomic JSON write that refuses to replace a user's file without ``force``."""
    p = Path(path)
    if p.exists() and not force:
        raise Gru4RecError(f"{p} already exists; use --force to overwrite it")
    atomic_write(p, lambda tmp: tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8"))


# ---------------------------------------------------------------------------------------- train


def _train_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA",
                        help="training events: TSV/CSV/Parquet (optionally .gz) with session, item "
                             "and time columns (try 'gru4rec demo' for a run on synthetic data)")
    params = parser.add_argument_group("hyperparameters (spec §7; -ps is applied on top of -pf)")
    params.add_argument("-ps", "--params", metavar="STR", default=None,
                        help="parameter string, e.g. 'loss=bpr-max,layers=200/200,n_epochs=5' "
                             "(lists use '/')")
    params.add_argument("-pf", "--param-file", metavar="FILE", default=None,
                        help="parameter file: the original's .py (OrderedDict, read without "
                             "executing it), .json, .toml or .yaml, e.g. paramfiles/<name>.py")
    params.add_argument("--seed", type=int, default=None,
                        help="random seed for weights, sampling and dropout (overrides the params)")
    params.add_argument("-ss", "--sample-store-size", metavar="N", type=_nonnegative_int, default=None,
                        help="negative-sample ids pre-drawn at once (overrides the params; "
                             "default 10,000,000)")
    _add_column_keys(parser, default_from="the params")
    out = parser.add_argument_group("output")
    out.add_argument("-s", "--save", metavar="MODEL", default=None,
                     help="save the trained model to MODEL (a safe single-file format)")
    out.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                     help="write a resumable checkpoint to DIR after every epoch")
    out.add_argument("--resume", action="store_true",
                     help="continue the run whose checkpoint is in --checkpoint-dir")
    _add_force(out)
    _add_eval_flags(parser, test_required=False)
    _add_device(parser)
    _add_precision(parser)


def _train_run(args: argparse.Namespace) -> int:
    if args.resume and not args.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir (where the checkpoint is)")
    _check_writable_target(args.save, args.force, "model file")
    _check_writable_target(args.metrics_json, args.force, "metrics file")
    _check_readable([args.data], "training data")
    _check_readable(args.test, "test file")
    streams = _streams(args)
    config = _build_config(
        args.param_file, args.params, seed=args.seed, sample_store_size=args.sample_store_size,
        session_key=args.session_key, item_key=args.item_key, time_key=args.time_key,
    )
    model = _train(args.data, config, device=args.device, streams=streams, precision=args.precision,
                   checkpoint_dir=args.checkpoint_dir, resume=args.resume)
    if args.save:
        model.save(args.save, overwrite=args.force)
        streams.info(f"Saved model to {args.save}")
    if args.test:
        report = _evaluate_all(model, args.test, cutoffs=args.measure, mode=args.eval_mode,
                               batch_size=args.eval_batch_size, streams=streams, extended=True)
        if args.metrics_json:
            _write_json(args.metrics_json, report, force=args.force)
    return EXIT_OK


# ------------------------------------------------------------------------------------- evaluate


def _evaluate_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="MODEL", required=True, help="a model file saved by train --save")
    _add_eval_flags(parser, test_required=True)
    _add_column_keys(parser, default_from="the model's")
    _add_device(parser)
    _add_force(parser)


def _evaluate_run(args: argparse.Namespace) -> int:
    _check_writable_target(args.metrics_json, args.force, "metrics file")
    _check_readable(args.test, "test file")
    streams = _streams(args)
    model = _load_model(args.model, args.device, streams)
    report = _evaluate_all(
        model, args.test, cutoffs=args.measure, mode=args.eval_mode, batch_size=args.eval_batch_size,
        streams=streams, extended=True,
        keys={"session_key": args.session_key, "item_key": args.item_key, "time_key": args.time_key},
    )
    if args.metrics_json:
        _write_json(args.metrics_json, report, force=args.force)
    return EXIT_OK


# ------------------------------------------------------------------------------------ recommend


def _recommend_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="MODEL", required=True, help="a model file saved by train --save")
    parser.add_argument("-i", "--input", metavar="SESSIONS", required=True,
                        help="events of the sessions to recommend for (session, item, time "
                             "columns; each session's items in time order)")
    parser.add_argument("-o", "--output", metavar="RECS", required=True,
                        help="where to write the recommendations: .tsv/.csv (optionally .gz) or "
                             ".parquet; one row per session and rank")
    parser.add_argument("-k", "--k", type=_positive_int, default=20, help="items per session (default: 20)")
    parser.add_argument("--exclude-seen", action="store_true",
                        help="never recommend an item the session already contains")
    _add_column_keys(parser, default_from="the model's")
    _add_device(parser)
    _add_force(parser)


def _recommend_run(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd

    from gru4rec.data.events import read_events, write_events

    _check_writable_target(args.output, args.force, "output file")
    _check_readable([args.input], "input file")
    streams = _streams(args)
    model = _load_model(args.model, args.device, streams)
    config = model.config
    sk = args.session_key or config.session_key
    ik = args.item_key or config.item_key
    tk = args.time_key or config.time_key
    events = read_events(args.input, session_key=sk, item_key=ik, time_key=tk)
    # Stable sort: events with equal times keep their file order.
    # Stable sort: events with equal times keep their file order.
    events = events.sort_values([sk, tk], kind="stable")
    sessions = events.groupby(sk, sort=False)[ik].agg(list)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = model.recommend_batch(sessions.tolist(), k=args.k, exclude_seen=args.exclude_seen)
    for w in caught:
        streams.info(f"{PROG}: warning: {w.message}")
    elapsed = time.perf_counter() - start
    counts = [len(r.item_ids) for r in recs]
    recs_frame = pd.DataFrame({
        sk: np.repeat(sessions.index.to_numpy(), counts),
        "Rank": np.concatenate([np.arange(1, n + 1) for n in counts]) if counts else np.zeros(0, np.int64),
        ik: np.concatenate([np.asarray(r.item_ids) for r in recs]) if recs else [],
        "Score": np.concatenate([np.asarray(r.scores, dtype=np.float64) for r in recs]) if recs else [],
        "Fallback": np.repeat([r.fallback for r in recs], counts).astype(bool),
    })
    n_fallback = sum(r.fallback for r in recs)
    if n_fallback:
        streams.info(f"{PROG}: warning: {n_fallback} session(s) had no item known to the model and "
                     "got the most popular items (Fallback=True)")
    write_events(recs_frame, args.output, force=args.force)
    streams.info(f"Wrote {len(recs_frame)} recommendations for {len(sessions)} sessions to {args.output} "
                 f"({elapsed:.2f}s)")
    return EXIT_OK


# ----------------------------------------------------------------------------------------- info


def _info_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a model file saved by train --save")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")


def _count_items(meta: dict[str, Any], tensors: dict[str, Any]) -> int | None:
    """The item count of a model file (item id list) or a training checkpoint (its data summary)."""
    for key in ("item_ids", "item_map"):
        if isinstance(meta.get(key), list):
            return len(meta[key])
    if "item_support" in tensors:
        return int(tensors["item_support"]["shape"][0])
    data = meta.get("data")
    if isinstance(data, dict) and isinstance(data.get("n_items"), int):
        return int(data["n_items"])
    return None


def _info_run(args: argparse.Namespace) -> int:
    from gru4rec.checkpoint import file_info

    info = file_info(args.model)
    meta = info["meta"]
    config = meta.get("config", {})
    n_items = _count_items(meta, info["tensors"])
    summary = {
        "file": args.model,
        "format_version": info["format_version"],
        "written_by": info["writer"],
        "size_bytes": info["size_bytes"],
        "n_items": n_items,
        "config": config,
        "tensors": info["tensors"],
    }
    # Large or structured entries (the item ids, resume RNG state) are not for reading.
    extra = {k: v for k, v in meta.items()
             if k not in ("config", "item_ids", "item_map", "item_support", "numpy_rng")}
    if extra:
        summary["meta"] = extra
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    print(f"file: {args.model} ({info['size_bytes']:,} bytes)")
    print(f"format version: {info['format_version']} (written by gru4rec {info['writer']})")
    print(f"items: {n_items if n_items is not None else 'unknown'}")
    for key, value in extra.items():
        print(f"{key}: {json.dumps(value)}")
    print("config:")
    for key, value in config.items():
        print(f"  {key} = {value if isinstance(value, str) else json.dumps(value)}")
    print("tensors:")
    for name, t in info["tensors"].items():
        print(f"  {name}: {t['dtype']} {'x'.join(map(str, t['shape'])) or 'scalar'}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- synth


def _synth_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="OUT_DIR",
                        help="folder for the files (created if missing)")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the generator")
    parser.add_argument("--n-sessions", type=_positive_int, default=None,
                        help="number of sessions (default: the generator's)")
    parser.add_argument("--n-items", type=_positive_int, default=None,
                        help="number of items (default: the generator's)")
    parser.add_argument("--test-days", type=float, default=None,
                        help="sessions starting in the last DAYS days form the test set (and, "
                             "the same way, train_valid) (default: the generator's)")
    _add_force(parser)


def _synth_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {"seed": args.seed, "n_sessions": args.n_sessions, "n_items": args.n_items,
              "test_days": args.test_days}
    return {k: v for k, v in kwargs.items() if v is not None}


def _synth_run(args: argparse.Namespace) -> int:
    from gru4rec.datasets.synthetic import write_synthetic

    streams = _streams(args)
    paths = write_synthetic(args.out_dir, force=args.force, **_synth_kwargs(args))
    for path in _as_paths(paths):
        streams.result(str(path))
    return EXIT_OK


def _as_paths(paths: Any) -> list[Any]:
    if isinstance(paths, dict):
        return list(paths.values())
    if isinstance(paths, (list, tuple)):
        return list(paths)
    return [paths]


# ----------------------------------------------------------------------------------------- demo

#: Small settings that learn the synthetic data well in about 20 s on one quiet CPU core
#: (≈3.5 s per epoch over the default 25,000 synthetic sessions).
DEMO_PARAMS = "loss=cross-entropy,layers=64,batch_size=32,n_sample=256,n_epochs=5,learning_rate=0.1,momentum=0.1,dropout_p_hidden=0.1,logq=1.0,sample_store_size=100000"


def _demo_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="where to write the synthetic data and the model (default: a "
                             "temporary folder, removed at the end)")
    parser.add_argument("-ps", "--params", metavar="STR", default=None,
                        help=f"parameters on top of the demo's ({DEMO_PARAMS})")
    parser.add_argument("--seed", type=int, default=None, help="seed of the data generator and the model")
    parser.add_argument("--n-sessions", type=_positive_int, default=None,
                        help="sessions in the synthetic data (default: the generator's; fewer is faster)")
    parser.add_argument("-m", "--measure", metavar="K", type=_positive_int, nargs="+", default=[1, 5, 10, 20],
                        help="cutoffs (default: 1 5 10 20)")
    _add_device(parser)
    _add_precision(parser)


def _demo_run(args: argparse.Namespace) -> int:
    from gru4rec.datasets.synthetic import write_synthetic

    streams = _streams(args)
    owned = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="gru4rec-demo-") if owned else args.workdir)
    try:
        data_dir = workdir / "synthetic"
        start = time.perf_counter()
        kwargs: dict[str, Any] = {"force": True}
        if args.seed is not None:
            kwargs["seed"] = args.seed
        if args.n_sessions is not None:
            kwargs["n_sessions"] = args.n_sessions
        paths = write_synthetic(data_dir, **kwargs)
        train_path, test_path = _pick_train_test(paths, data_dir)
        streams.info(f"Synthetic data in {data_dir} ({time.perf_counter() - start:.2f}s)")
        config = _build_config(None, DEMO_PARAMS, seed=args.seed)
        if args.params:
            config = config.replace_from_string(args.params)
        model = _train(str(train_path), config, device=args.device, streams=streams, precision=args.precision)
        model_path = workdir / "demo.gru4rec"
        model.save(model_path, overwrite=True)
        if not owned:
            streams.info(f"Saved model to {model_path}")
        _evaluate_all(model, [str(test_path)], cutoffs=args.measure, mode="conservative",
                      batch_size=512, streams=streams, extended=True)
        streams.info(f"Demo finished in {time.perf_counter() - start:.1f}s. Next: 'gru4rec train "
                     "YOUR_EVENTS.tsv -t YOUR_TEST.tsv --save model.gru4rec' (see gru4rec train --help)")
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
    return EXIT_OK


def _pick_train_test(paths: Any, data_dir: Path) -> tuple[Path, Path]:
    """The train_full/test pair among the generator's outputs (whatever container it returns)."""
    if isinstance(paths, dict) and "train_full" in paths and "test" in paths:
        return Path(paths["train_full"]), Path(paths["test"])
    candidates = [Path(p) for p in _as_paths(paths)] + sorted(data_dir.glob("*"))
    train = next((p for p in candidates if p.name.startswith("train_full")), None)
    test = next((p for p in candidates if p.name.startswith("test")), None)
    if train is None or test is None:
        raise Gru4RecError(f"the synthetic generator wrote no train_full/test pair into {data_dir}")
    return train, test


# ------------------------------------------------------------------------------------- registry

register(Command("train", "train a model on an event file (optionally save and evaluate it)",
                 _train_add_arguments, _train_run))
register(Command("evaluate", "evaluate a saved model on test files (Recall, MRR, NDCG, ...)",
                 _evaluate_add_arguments, _evaluate_run))
register(Command("recommend", "top-k recommendations for the sessions in a file",
                 _recommend_add_arguments, _recommend_run,
                 description="Top-k next items for every session in SESSIONS, given all its events.\n\n"
                             "Output columns: the session column, Rank (1..k), the item column, Score\n"
                             "(the model's raw score) and Fallback. Items the model does not know are\n"
                             "skipped with a counted warning; a session with no known item gets the\n"
                             "most popular items (Score = training support, Fallback = True)."))
register(Command("info", "show a model file's format version, item count and configuration",
                 _info_add_arguments, _info_run))
register(Command("synth", "write the synthetic data set (train_full, test, train_tr, train_valid)",
                 _synth_add_arguments, _synth_run))
register(Command("demo", "one-command quick start: synthetic data -> train -> evaluate",
                 _demo_add_arguments, _demo_run))
register(_hook_command("preprocess", "preprocess a public data set's raw files into train/test files",
                       "gru4rec.datasets", add="add_preprocess_arguments", run="run_preprocess"))
register(_hook_command("split", "split your own event file by time into train/test files",
                       "gru4rec.datasets.split", add="add_split_arguments", run="run_split"))
register(_hook_command("paropt", "hyperparameter optimisation with Optuna", "gru4rec.tune.study"))


# ----------------------------------------------------------------------------------------- main


def _add_global_flags(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    # On subparsers the default is suppressed so '--debug' before the command is not reset.
    parser.add_argument("--debug", action="store_true",
                        default=argparse.SUPPRESS if sub else False,
                        help="show the full traceback of an error")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gru4rec`` parser; only ``command``'s flags are added (the others stay unimported)."""
    from gru4rec import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="GRU4Rec session-based recommendation. Run 'gru4rec demo' for a one-minute "
                    "tour, 'gru4rec COMMAND --help' for a command's options.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_global_flags(parser, sub=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, cmd in COMMANDS.items():
        sub = subparsers.add_parser(name, help=cmd.help, description=cmd.description or cmd.help,
                                    formatter_class=_Formatter)
        _add_global_flags(sub, sub=True)
        sub.set_defaults(_command=name)
        if name == command:
            cmd.add_arguments(sub)
    return parser


def _selected_command(argv: Sequence[str]) -> str | None:
    for token in argv:
        if token == "--":
            return None
        if not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)) and exc.filename:
        reason = exc.strerror or str(exc)
        return f"{reason}: {exc.filename}"
    # Some messages list several problems on indented '- ' lines: keep them on one line.
    parts = [line.strip().removeprefix("- ").strip() for line in str(exc).strip().splitlines()]
    parts = [p for p in parts if p]
    if not parts:
        return type(exc).__name__
    head, rest = parts[0], parts[1:]
    if rest:
        return head + (" " if head.endswith(":") else "; ") + "; ".join(rest)
    return head


def _dispatch(parser: argparse.ArgumentParser, argv: Sequence[str],
              run: Callable[[argparse.Namespace], int | None], *, prog: str,
              single_stream: bool = False) -> int:
    """Parse, run, and turn user errors into one line and an exit code."""
    debug = "--debug" in argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    debug = bool(getattr(args, "debug", False)) or debug
    args._single_stream = single_stream
    try:
        code = run(args)
        return EXIT_OK if code is None else int(code)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, ConfigError) as exc:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {_error_message(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (Gru4RecError, FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {_error_message(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except ImportError as exc:
        # An optional dependency (pyarrow, optuna) missing: the message carries the install hint.
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {_error_message(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError as exc:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: out of host memory: {_error_message(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except RuntimeError as exc:
        # torch.OutOfMemoryError (a RuntimeError) is a resource problem the user can act on;
        # any other RuntimeError is a bug and keeps its traceback.
        if type(exc).__name__ != "OutOfMemoryError":
            raise
        if debug:
            traceback.print_exc()
        first = _error_message(exc).split(". ")[0]
        print(f"{prog}: error: out of device memory ({first}); try a smaller batch_size, "
              "n_sample, layers or --eval-batch-size", file=sys.stderr)
        return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gru4rec`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _selected_command(argv)
    if command is not None:
        reason = COMMANDS[command].unavailable()
        if reason:
            # Its flags are unknown, so parsing would only add a confusing usage error.
            print(f"{PROG}: error: {reason}", file=sys.stderr)
            return EXIT_ERROR
    parser = build_parser(command)
    if not [a for a in argv if a != "--debug"]:
        parser.print_help()
        return EXIT_OK

    def run(args: argparse.Namespace) -> int | None:
        name = getattr(args, "_command", None)
        if name is None:
            parser.print_help()
            return EXIT_OK
        return COMMANDS[name].run(args)

    return _dispatch(parser, argv, run, prog=PROG)


# ------------------------------------------------------------------------------------- run.py


def build_run_py_parser() -> argparse.ArgumentParser:
    """The original GRU4Rec ``run.py`` command line, flag for flag."""
    parser = argparse.ArgumentParser(
        prog="run.py",
        description="Train or load a GRU4Rec model, then evaluate it (the original run.py's flags; "
                    "see also the 'gru4rec' command).",
    )
    parser.add_argument("path", metavar="PATH",
                        help="training data (TSV/CSV/Parquet) or, with -l, a saved model file")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("-ps", "--parameter_string", metavar="PARAM_STRING",
                      help="parameters as 'name=value,name=value' (lists with '/'), e.g. "
                           "'loss=bpr-max,layers=100,n_sample=2048'")
    mode.add_argument("-pf", "--parameter_file", metavar="PARAM_PATH",
                      help="parameter file (the original's OrderedDict .py, or .json/.toml/.yaml)")
    mode.add_argument("-l", "--load_model", action="store_true",
                      help="PATH is a saved model: load it instead of training")
    parser.add_argument("-s", "--save_model", metavar="MODEL_PATH",
                        help="save the trained model to MODEL_PATH (refuses to overwrite an "
                             "existing file unless --force)")
    parser.add_argument("-t", "--test", metavar="TEST_PATH", nargs="+",
                        help="evaluate on these test files (one result block per file)")
    parser.add_argument("-m", "--measure", metavar="AT", type=_positive_int, nargs="*", default=[20],
                        help="list lengths for Recall and MRR (default: 20)")
    parser.add_argument("-e", "--eval_type", choices=EVAL_MODES, default="standard",
                        help="tie handling in ranks: standard, conservative, median, tiebreaking "
                             "(default: standard)")
    parser.add_argument("-ss", "--sample_store_size", metavar="SS", type=_nonnegative_int, default=None,
                        help="negative-sample ids pre-drawn at once (default: 10,000,000)")
    parser.add_argument("-g", "--gru4rec_model", metavar="GRFILE", default=None,
                        help="accepted for compatibility and ignored (the original chose a "
                             "gru4rec implementation module with it)")
    parser.add_argument("-d", "--device", default="auto",
                        help="torch device: auto, cpu, cuda, cuda:0, ... (default: auto)")
    _add_precision(parser)
    parser.add_argument("-ik", "--item_key", metavar="IK", default=None,
                        help="item id column (default: ItemId, or the loaded model's)")
    parser.add_argument("-sk", "--session_key", metavar="SK", default=None,
                        help="session id column (default: SessionId, or the loaded model's)")
    parser.add_argument("-tk", "--time_key", metavar="TK", default=None,
                        help="timestamp column (default: Time, or the loaded model's)")
    parser.add_argument("-pm", "--primary_metric", choices=("recall", "mrr"), default="recall",
                        help="metric reported by -lpm (default: recall)")
    parser.add_argument("-lpm", "--log_primary_metric", action="store_true",
                        help="print 'PRIMARY METRIC: x', the primary metric at the first -m cutoff")
    parser.add_argument("--seed", type=int, default=None, help="random seed (overrides the params)")
    parser.add_argument("--force", action="store_true", help="allow -s to overwrite an existing file")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return parser


def _run_py(args: argparse.Namespace) -> int:
    streams = _streams(args)
    if args.gru4rec_model is not None:
        streams.info(f"Note: -g {args.gru4rec_model} is ignored (this implementation is the gru4rec package)")
    measure = args.measure or [20]
    keys = {"session_key": args.session_key, "item_key": args.item_key, "time_key": args.time_key}
    _check_writable_target(args.save_model, args.force, "model file")
    _check_readable(args.test, "test file")
    if args.load_model:
        if args.sample_store_size is not None or args.seed is not None:
            streams.info("Note: -ss/--seed only affect training and are ignored with -l")
        model = _load_model(args.path, args.device, streams)
    else:
        _check_readable([args.path], "training data")
        config = _build_config(args.parameter_file, args.parameter_string, seed=args.seed,
                               sample_store_size=args.sample_store_size, **keys)
        model = _train(args.path, config, device=args.device, streams=streams, precision=args.precision)
        keys = {}  # the model's config carries them now
    if args.save_model:
        model.save(args.save_model, overwrite=args.force)
        streams.info(f"Saved model to {args.save_model}")
    if args.test:
        _evaluate_all(model, args.test, cutoffs=measure, mode=args.eval_type, batch_size=512,
                      streams=streams, extended=False,
                      primary_metric=args.primary_metric if args.log_primary_metric else None,
                      keys=keys)
    return EXIT_OK


def run_py_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the repository's ``run.py``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return _dispatch(build_run_py_parser(), argv, _run_py, prog="run.py", single_stream=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
