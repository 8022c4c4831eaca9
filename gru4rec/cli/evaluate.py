"""``gru4rec evaluate``: evaluate a saved model on test files (Recall, MRR, NDCG, ...).

:func:`evaluate_files` (the result lines of every test file) is shared with ``train``, ``demo``
and ``run.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from collections.abc import Sequence
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
    column_flags,
    eval_test_flag,
    flag,
    flag_field,
    load_model,
    log_device_memory,
    reset_device_memory_peak,
    uses_threads,
    write_json,
)
from gru4rec.cli.console import result
from gru4rec.errors import ConfigError
from gru4rec.tracking.runs import METRICS_FILE, RUN_CUTOFFS, metrics_entry, run_folder_of

if TYPE_CHECKING:
    from gru4rec.evaluation.metrics import TieMode

__all__ = ["FLAGS", "EvaluateSettings", "add_arguments", "check_test_files", "evaluate_files", "metric_lines", "run"]

log = logging.getLogger(__name__)



_REPEAT = "repeat-aware scoring"
#: The help sections' descriptions.
_GROUPS = {_REPEAT: "boost the items a session already holds (off by default: faithful GRU4Rec); "
                    "see docs/python.md#repeat-aware-scoring"}
#: The column flags' help: their default is the model's.
FLAGS = column_flags("the model's")


@dataclass(frozen=True, kw_only=True)
class EvaluateSettings(EvalFlags, ColumnFlags, MachineFlags):
    """The settings of ``gru4rec evaluate``: a field per flag, declared with it."""

    model: str = flag(metavar="MODEL", help="a model file saved by train --save")
    test: list[str] = flag_field(eval_test_flag(required=True))
    repeat_weight: float | None = flag("--repeat-weight", metavar="W", type=float, group=_REPEAT, default=None,
                                       help="the boost's weight, in units of the row's score spread (default: the model's, 0)")
    repeat_decay: float | None = flag("--repeat-decay", metavar="D", type=float, group=_REPEAT, default=None,
                                      help="weight of a click relative to the click after it, in [0, 1] (default: the model's, 1)")
    fit_repeat: str | None = flag("--fit-repeat", metavar="VALID", group=_REPEAT, default=None,
                                  help="choose weight and decay on the validation events VALID (a grid, by --fit-metric, "
                                       "the tie mode of -e), print the grid, then evaluate TEST with the winner")
    fit_metric: str | None = flag("--fit-metric", metavar="METRIC@K", group=_REPEAT, default=None,
                                  help="what --fit-repeat maximises: recall@K, mrr@K or ndcg@K (default: mrr at the first "
                                       "-m cutoff)")
    save: str | None = flag("--save", metavar="MODEL_OUT", group=_REPEAT, default=None,
                            help="write the model with the chosen repeat boost to MODEL_OUT (for gru4rec serve)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec evaluate`` (:class:`EvaluateSettings`)."""
    add_flags(parser, EvaluateSettings, FLAGS, _GROUPS)


def _fit_metric(args: EvaluateSettings) -> str:
    """The metric --fit-repeat maximises, as ``mrr@20`` (checked before any work)."""
    from gru4rec.fitting.validation import parse_metric

    if args.fit_metric is not None and args.fit_repeat is None:
        raise UsageError("--fit-metric needs --fit-repeat VALID (the data it is measured on)")
    text = args.fit_metric if args.fit_metric is not None else f"mrr@{args.measure[0]}"
    try:
        return parse_metric(text).key
    except ConfigError as exc:
        raise UsageError(f"--fit-metric: {exc}") from None


def _metric_label(metric: str) -> str:
    """``mrr@20`` as the result lines write it: ``MRR@20``."""
    name, cutoff = metric.split("@")
    return f"{'MRR' if name == 'mrr' else name.capitalize() if name == 'recall' else name.upper()}@{cutoff}"


def _repeat_boost(model: Any, args: EvaluateSettings, metric: str) -> tuple[Any, bool]:
    """The model with the repeat boost of --repeat-weight/--repeat-decay, then --fit-repeat (by
    ``metric``), and whether it now scores with a boost the loaded model did not have."""
    from gru4rec.data import read_events, sessions_from_events
    from gru4rec.data.overlap import warn_overlap
    from gru4rec.fitting.repeat_fit import fit_repeat_boost

    before = (model.config.repeat_weight, model.config.repeat_decay)
    changes = {k: v for k, v in (("repeat_weight", args.repeat_weight), ("repeat_decay", args.repeat_decay)) if v is not None}
    if changes:
        model = model.with_repeat_boost(changes.get("repeat_weight", model.config.repeat_weight),
                                        changes.get("repeat_decay", model.config.repeat_decay))
    if args.fit_repeat is not None:
        label = f"{_metric_label(metric)} ({args.eval_mode} ties)"
        log.info("Choosing the repeat boost on %s: the grid point with the best %s (--fit-metric)", args.fit_repeat, label)
        c = model.config
        keys = {"session_key": c.session_key, "item_key": c.item_key, "time_key": c.time_key}
        # Read once (not at every grid point), and checked once for sessions the model trained on.
        valid, _ = sessions_from_events(read_events(args.fit_repeat, **keys), model.item_map, order="id", drop_unknown=True, **keys)
        warn_overlap(model.train_fingerprint, valid, f"VALID {args.fit_repeat}")
        best, table = fit_repeat_boost(model, valid, metric=metric, mode=args.eval_mode, batch_size=args.eval_batch_size)
        for row in table:
            log.info("  repeat_weight=%g repeat_decay=%g: %s %.6f", row["weight"], row["decay"], _metric_label(metric), row[metric])
        plain = next(row[metric] for row in table if row["weight"] == 0)
        winner = next(row[metric] for row in table if (row["weight"], row["decay"]) == (best.weight, best.decay))
        if best.weight == 0:
            log.info("No boost helps on %s: every repeat_weight > 0 gives a lower %s than %.6f without one", args.fit_repeat, label, plain)
        else:
            log.info("Chosen on %s: repeat_weight=%g, repeat_decay=%g: %s %.6f, against %.6f without a boost",
                     args.fit_repeat, best.weight, best.decay, label, winner, plain)
        model = model.with_repeat_boost(best.weight, best.decay)
    if changes or args.fit_repeat is not None:
        log.info("Repeat-aware scoring: repeat_weight=%g, repeat_decay=%g", model.config.repeat_weight, model.config.repeat_decay)
    return model, (model.config.repeat_weight, model.config.repeat_decay) != before and model.config.repeat_weight > 0


@uses_threads
def run(args: EvaluateSettings) -> int:
    """Run ``gru4rec evaluate``."""
    check_writable_target(args.metrics_json, args.force, "metrics file")
    check_writable_target(args.save, args.force, "model file")
    check_readable(args.test, "test file")
    check_readable(None if args.fit_repeat is None else [args.fit_repeat], "validation file")
    metric = _fit_metric(args)
    model = load_model(args.model, args.device)
    keys = {"session_key": args.session_key, "item_key": args.item_key, "time_key": args.time_key}
    if args.fit_repeat is not None:  # the grid search comes first: a bad test file should not wait for it
        check_test_files(args.test, model.config, keys)
    model, boosted = _repeat_boost(model, args, metric)
    if args.save:
        model.save(args.save, overwrite=args.force)
        if boosted:
            log.info("Saved the model with its repeat boost (repeat_weight=%g, repeat_decay=%g) to %s",
                     model.config.repeat_weight, model.config.repeat_decay, args.save)
        elif args.fit_repeat is not None:
            log.info("No boost helps on %s: the model is saved unchanged to %s", args.fit_repeat, args.save)
        else:
            log.info("Saved the model unchanged (repeat_weight=%g) to %s", model.config.repeat_weight, args.save)
    # The model of a run folder (train --run-dir): its test figures go into the folder's
    # metrics.json, which `gru4rec report` draws — unless a repeat boost makes them another model's.
    folder = run_folder_of(args.model)
    changed = args.fit_repeat is not None or args.repeat_weight is not None or args.repeat_decay is not None
    report = evaluate_files(
        model, args.test, cutoffs=args.measure, mode=args.eval_mode, batch_size=args.eval_batch_size,
        extended=True, keys=keys, json_cutoffs=RUN_CUTOFFS if folder is not None else (),
    )
    if args.metrics_json:
        write_json(args.metrics_json, report, force=args.force)
    if folder is not None and changed:
        log.info("Not recorded in the run folder %s: with the repeat boost these are not its model's figures", folder.path)
    elif folder is not None:
        replaced = folder.add_metrics(report)
        log.info("Recorded the test metrics in %s%s (gru4rec report %s shows them)", folder.path / METRICS_FILE,
                 f", replacing the earlier ones of {', '.join(replaced)}" if replaced else "", folder.path)
        for name, old in replaced.items():  # said even with -q: the earlier figures were of other ties
            old_mode = old.get("mode") if isinstance(old, dict) else None
            if old_mode is not None and old_mode != report[name]["mode"]:
                log.warning("%s: the %s-ties figures of %s were replaced by %s-ties ones (-e %s records them again)",
                            folder.path / METRICS_FILE, old_mode, name, report[name]["mode"], old_mode)
    return EXIT_OK


def check_test_files(tests: Sequence[str] | None, columns: Any, keys: dict[str, str | None] | None = None) -> None:
    """Read every test file as :func:`evaluate_files` will (its columns, ids and times), so that
    a command that trains first fails on a bad test file before the first epoch, not after the
    last: a DataError naming the file (and the column or line). ``columns``: the model's config
    (or anything with its three column names); ``keys``: the test files' own names where they
    differ (``-sk/-ik/-tk``). The frames are dropped: training should not hold them in memory,
    and reading a test file again costs little beside the training it protects."""
    from gru4rec.data import ColumnKeys, read_events

    key_args = ColumnKeys.resolve(columns, **(keys or {})).as_dict()
    for test in tests or ():
        read_events(test, **key_args)


def metric_lines(outcome: Any, cutoffs: Sequence[int], *, extended: bool) -> list[str]:
    """The original's ``Recall@K: x MRR@K: y`` line per cutoff (6 decimals), with NDCG,
    coverage and popularity after them when ``extended``."""
    lines = []
    for c in cutoffs:
        line = f"Recall@{c}: {outcome.recall[c]:.6f} MRR@{c}: {outcome.mrr[c]:.6f}"
        if extended:
            line += (f" NDCG@{c}: {outcome.ndcg[c]:.6f} Coverage@{c}: {outcome.coverage[c]:.6f}"
                     f" Popularity@{c}: {outcome.popularity[c]:.6f}")
        lines.append(line)
    return lines


def evaluate_files(
    model: Any,
    tests: Sequence[str],
    *,
    cutoffs: Sequence[int],
    mode: TieMode,
    batch_size: int,
    extended: bool,
    primary_metric: str | None = None,
    keys: dict[str, str | None] | None = None,
    json_cutoffs: Sequence[int] = (),
) -> dict[str, Any]:
    """Evaluate on each test file and write its result lines; returns JSON-able metrics, with
    the breakdowns by session length and target popularity (:mod:`gru4rec.evaluation.breakdown`).

    primary_metric: 'recall' or 'mrr' adds ``PRIMARY METRIC: x`` (at the first cutoff) after
        each block, as the original's ``-lpm``.
    keys: the test files' column names where they differ from the model's (None = the model's).
    json_cutoffs: more cutoffs for the returned metrics only (not printed).
    """
    from gru4rec.data import ColumnKeys, read_events
    from gru4rec.evaluation import evaluate

    config = model.config
    key_args = ColumnKeys.resolve(config, **(keys or {})).as_dict()
    cutoffs = list(dict.fromkeys(cutoffs))  # keep the order (the first is the primary), drop repeats
    all_cutoffs = sorted(set(cutoffs) | set(json_cutoffs))
    report: dict[str, Any] = {}
    for test in tests:
        # Every published figure counts ties against the model; say which count these lines use.
        log.info("Evaluating on %s: Recall@K, MRR@K, ... with %s ties%s", test, mode,
                 " (published figures use -e conservative)" if mode != "conservative" else "")
        reset_device_memory_peak(model)
        start = time.perf_counter()
        # The model was trained on its own column names; present the test set under them (a
        # file under the model's names is read by evaluate, which names it in its messages).
        rename = {key_args[k]: getattr(config, k) for k in key_args if key_args[k] != getattr(config, k)}
        data = read_events(test, **key_args).rename(columns=rename) if rename else test
        outcome = evaluate(model, data, cutoffs=tuple(all_cutoffs), mode=mode, batch_size=batch_size, progress=True,
                           breakdown=True)
        elapsed = time.perf_counter() - start
        log.info("Evaluation took %.2fs: %s predictions, %s events with items unknown to the model dropped",
                 elapsed, outcome.n_predictions, outcome.n_dropped_events)
        log_device_memory(model, "evaluation")
        for line in metric_lines(outcome, cutoffs, extended=extended):
            result(line)
        if outcome.n_cold_items:  # a model with attributes ranked cold items: all/warm/cold figures
            for line in dataclasses.replace(outcome, cutoffs=tuple(cutoffs)).target_lines():
                result(line)
        if primary_metric is not None:
            table = outcome.recall if primary_metric == "recall" else outcome.mrr
            result(f"PRIMARY METRIC: {table[cutoffs[0]]}")
        name = test if test not in report else f"{test}#{len(report) + 1}"  # the same file twice
        report[name] = entry = metrics_entry(outcome, seconds=elapsed)
        if outcome.n_cold_items:
            entry["n_cold_items"] = outcome.n_cold_items
            entry["targets"] = {g.label: g.to_dict() for g in outcome.target_groups}
    return report
