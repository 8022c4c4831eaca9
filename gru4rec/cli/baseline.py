"""``gru4rec baseline pop|spop|itemknn TRAIN -t TEST ...``: fit a simple baseline
(:mod:`gru4rec.baselines`) and evaluate it exactly as ``gru4rec evaluate`` evaluates a GRU4Rec
model — same metric lines, cutoffs, tie modes and ``--metrics-json`` — so that the figures of
both go into one table."""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gru4rec.cli.common import (
    EXIT_OK,
    ColumnFlags,
    EvalFlags,
    MachineFlags,
    UsageError,
    add_flags,
    check_readable,
    check_writable_target,
    eval_test_flag,
    flag,
    flag_field,
    positive_int,
    settings_flags,
    uses_threads,
    write_json,
)
from gru4rec.cli.evaluate import evaluate_files

if TYPE_CHECKING:
    pass

__all__ = ["BASELINES", "BaselineSettings", "add_arguments", "run"]

log = logging.getLogger(__name__)

#: The baselines by command-line name: (class name in gru4rec.baselines, what it recommends).
BASELINES = {
    "pop": ("Pop", "the most popular items (training events), the same list for every session"),
    "spop": ("SessionPop", "the session's own items, most visited first, then the most popular ones"),
    "itemknn": ("ItemKNN", "the items most often in the same training sessions as the last item (cosine)"),
}

DESCRIPTION = (
    "Fit a baseline on TRAIN and evaluate it on the test files with the same metrics as\n"
    "'gru4rec evaluate' (cutoffs, tie modes, --metrics-json), to compare with GRU4Rec:\n\n"
    + "\n".join(f"  {name:<8} {what}" for name, (_, what) in BASELINES.items())
)


def _unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


_KNN = "itemknn"


@dataclass(frozen=True, kw_only=True)
class BaselineSettings(EvalFlags, ColumnFlags, MachineFlags):
    """The settings of ``gru4rec baseline``: a field per flag, declared with it."""

    baseline: str = flag(choices=tuple(BASELINES), help="which baseline (see above)")
    data: str = flag(metavar="TRAIN",
                     help="training events: TSV/CSV/Parquet (optionally .gz) with session, item and time columns")
    test: list[str] = flag_field(eval_test_flag(required=True))
    neighbors: int | None = flag("--neighbors", metavar="K", type=positive_int, group=_KNN, default=None,
                                 help="neighbours kept per item (default: 100)")
    knn_lambda: float | None = flag("--lambda", metavar="L", type=_nonnegative_float, group=_KNN, default=None,
                                    help="added to the items' session counts in the normalisation: damps rare items "
                                         "(default: 20)")
    knn_alpha: float | None = flag("--alpha", metavar="A", type=_unit_interval, group=_KNN, default=None,
                                   help="weight of the source item's count in the normalisation, 0.5 = cosine "
                                        "(default: 0.5)")


#: The itemknn flags by field, as the messages name them.
_KNN_FLAGS = {name: spec.names[0] for name in ("neighbors", "knn_lambda", "knn_alpha")
              if (spec := settings_flags(BaselineSettings)[name]) is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec baseline`` (:class:`BaselineSettings`)."""
    add_flags(parser, BaselineSettings)


def _fit(args: BaselineSettings) -> Any:
    """The fitted baseline of ``args``."""
    from gru4rec import baselines
    from gru4rec.data import ColumnKeys

    keys = ColumnKeys.resolve(None, session_key=args.session_key, item_key=args.item_key, time_key=args.time_key).as_dict()
    knn: dict[str, Any] = {name: getattr(args, name) for name in _KNN_FLAGS if getattr(args, name) is not None}
    if args.baseline != "itemknn" and knn:
        raise UsageError(f"{', '.join(_KNN_FLAGS[name] for name in knn)}: only with itemknn")
    cls = getattr(baselines, BASELINES[args.baseline][0])
    if args.baseline == "itemknn":
        renamed = {"neighbors": "n_neighbors", "knn_lambda": "lmbd", "knn_alpha": "alpha"}
        model = cls(**{renamed[k]: v for k, v in knn.items()}, device=args.device, **keys)
    else:
        model = cls(device=args.device, **keys)
    start = time.perf_counter()
    model.fit(args.data)
    log.info("Fitted %s on %s in %.2fs (%d items)", type(model).__name__, args.data, time.perf_counter() - start,
             len(model.item_map))
    return model


@uses_threads
def run(args: BaselineSettings) -> int:
    """Run ``gru4rec baseline``: fit, then the metric lines of every test file."""
    check_writable_target(args.metrics_json, args.force, "metrics file")
    check_readable([args.data], "training data")
    check_readable(args.test, "test file")
    model = _fit(args)
    report = evaluate_files(model, args.test, cutoffs=args.measure, mode=args.eval_mode,
                            batch_size=args.eval_batch_size, extended=True)
    if args.metrics_json:
        write_json(args.metrics_json, report, force=args.force)
    return EXIT_OK
