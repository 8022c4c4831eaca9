"""The command line of the search: ``python paropt.py``, ``gru4rec paropt`` and ``python -m
gru4rec.cli.paropt`` (the original's ``paropt.py`` flags plus the storage, parallel and pruning
options). The search itself is :mod:`gru4rec.tune`, which never imports this module.

Exit codes, as for every ``gru4rec`` command: 0 done; 1 a runtime error (a data file missing or
bad, the storage unreachable, ``--out`` holding files that are not this study's reports) or a run
that ended without a completed trial or with a worker stopped early; 2 a usage error (an invalid
option, search space, fixed parameter or ``--enqueue`` file; a study of that name that optimises
something else); 130 interrupted (the message says how to continue). Errors are one line, without
a traceback unless ``--debug``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gru4rec.cli.common import Flag, add_flags, declared_flag, settings_from
from gru4rec.cli.console import result
from gru4rec.cli.items import ItemFeatureFlags, item_types_argument
from gru4rec.tune.reports import StudyReport
from gru4rec.tune.runner import run_study
from gru4rec.tune.settings import DEFAULT_OUT, EVAL_MODES, METRICS, ParoptSettings, metric_label
from gru4rec.tune.storage import HEARTBEAT_GRACE_S, HEARTBEAT_INTERVAL_S, STORAGE_ENV

__all__ = [
    "FLAGS", "SETTINGS", "add_arguments", "build_parser", "flags", "main", "result_lines", "run", "run_settings",
    "settings_from_args",
]

log = logging.getLogger(__name__)

#: The script's name in its messages and help.
PROG = "paropt.py"


def flags(*, original: bool = False) -> dict[str, Flag | None]:
    """The flag of every field of :class:`~gru4rec.tune.settings.ParoptSettings` (a class of the
    search, which never imports the command line), by field name: each field's name, type and
    default are the flag's.

    ``original``: spell the original ``paropt.py``'s long options as it did (``--eval_type``,
    ``--item_key``, ...); otherwise they follow the ``gru4rec`` commands' convention
    (``--eval-mode``, ``--item-key``, ...). The short flags are the same.
    """

    def long(name: str, gru4rec_name: str | None = None) -> str:
        return "--" + (name if original else (gru4rec_name or name.replace("_", "-")))

    return {
        "train": Flag((), "training events (TSV/CSV/Parquet)", metavar="TRAIN"),
        "valid": Flag((), "validation events the objective is measured on", metavar="VALID"),
        "paramspace": Flag(("-opf", long("optuna_parameter_file")), metavar="PATH",
                           help="search space: JSON lines {name, dtype int|float|categorical, values, step, log}"),
        "fixed": Flag(("-fp", long("fixed_parameters")), metavar="PARAM_STRING",
                      help="fixed parameters, e.g. 'loss=cross-entropy,constrained_embedding=True,n_epochs=10'"),
        "n_trials": Flag(("-nt", "--ntrials"), metavar="NT", type=int,
                         help="trials THIS RUN adds to the study (failed and pruned ones included), not the study's "
                              "total: a rerun of the same command extends the study by NT more; default 50"),
        "total": Flag(("--total",), action="store_true",
                      help="-nt is the study's total instead: run until the study holds NT finished "
                           "(COMPLETE+PRUNED) trials, so a rerun after an interruption only runs the missing ones"),
        "measure": Flag(("-m", "--measure"), metavar="AT", type=int, help="cutoff of the objective metric (default 20)"),
        # '-fm' without a value keeps the default, as in the original.
        "final_measure": Flag(("-fm", long("final_measure")), metavar="AT", type=int, nargs="*",
                              convert=lambda cutoffs: tuple(cutoffs or (20,)),
                              help="cutoffs of the final test (--final-test); default 20"),
        "primary_metric": Flag(("-pm", long("primary_metric")), metavar="METRIC", choices=METRICS,
                               help="objective: recall or mrr (default recall)"),
        "eval_mode": Flag(("-e", long("eval_type", "eval-mode")), metavar="MODE", choices=EVAL_MODES,
                          help="tie handling: standard, conservative, median or tiebreaking (default standard)"),
        "session_key": Flag(("-sk", long("session_key")), metavar="SK", help="session id column (default SessionId)"),
        "item_key": Flag(("-ik", long("item_key")), metavar="IK", help="item id column (default ItemId)"),
        "time_key": Flag(("-tk", long("time_key")), metavar="TK", help="time column (default Time)"),
        "device": Flag(("-d", "--device"), "torch device: auto, cpu, cuda, cuda:1, ... (default auto)"),
        "precision": Flag(("--precision",), choices=("float32", "bfloat16"),
                          help="training precision of the trials (default float32; see gru4rec train --help)"),
        "threads": Flag(("--threads",), metavar="T", type=int,
                        help="torch threads per worker (default: 1 with several workers, else torch's default)"),
        "workers": Flag(("--workers",), metavar="W", type=int, help="local worker processes sharing the study (default 1)"),
        "storage": Flag(("--storage",), metavar="URL",
                        help=f"Optuna storage: SQLAlchemy URL, journal:PATH or a file path (default: ${STORAGE_ENV}, "
                             "else sqlite:///OUT/paropt.db)"),
        "study_name": Flag(("--study-name",), "study to create or resume (default: <space>.<train folder>.<train file>)"),
        "pruning": Flag(("--no-pruning",), "no pruning (and no per-epoch validation)", action="store_false"),
        "prune_startup": Flag(("--prune-startup",), metavar="N", type=int,
                              help="median pruner: completed trials before pruning starts (default 5)"),
        "prune_warmup": Flag(("--prune-warmup",), metavar="E", type=int,
                             help="median pruner: epochs exempt from pruning (default 1)"),
        "sampler_seed": Flag(("--seed",), type=int,
                             help="seed of the TPE sampler (default 42): trial n draws from (seed, n), so the same "
                                  "command on a new study proposes the same trials and no two trials draw alike"),
        "timeout": Flag(("--timeout",), metavar="S", type=float, help="start no new trial after S seconds"),
        "out": Flag(("--out",), metavar="DIR",
                    help=f"folder for the best parameters, trial exports and the default storage (default {DEFAULT_OUT})"),
        "final_test": Flag(("--final-test",), metavar="TEST",
                           help="train the best configuration on TRAIN+VALID and evaluate it on TEST at the -fm cutoffs"),
        "early_stop": Flag(("--early-stop",), metavar="PATIENCE", type=int,
                           help="stop a trial when the objective on VALID has not improved for PATIENCE epochs; the "
                                "trial keeps (and scores) its best epoch (faster trials; default: every epoch)"),
        "run_dirs": Flag(("--run-dirs",), metavar="DIR",
                         help="a run folder per trial in DIR/<study>/trial-NNNNN (config.json, epochs.jsonl, "
                              "metrics.json on VALID with breakdowns, command.txt to retrain it; no model file), "
                              "for 'gru4rec report'"),
        "enqueue": Flag(("--enqueue",), action="append", metavar="PARAMFILE",
                        help="queue the searched values of a parameter file (e.g. paramfiles/*_best.py) as one of the "
                             "first trials; repeatable; its fixed (-fp) values must agree"),
        "add_trials": Flag(("--add-trials",), action="append", metavar="TRIALS_JSON",
                           help="continue a study from its export (STUDY.trials.json, e.g. from another machine): its "
                                "finished trials are added as they were, its unfinished ones queued again; repeatable"),
        "heartbeat_interval": Flag(("--heartbeat-interval",), metavar="S", type=int,
                                   help="seconds between a running trial's heartbeats in an RDB storage "
                                        f"(default {HEARTBEAT_INTERVAL_S})"),
        "grace_period": Flag(("--grace-period",), metavar="S", type=int,
                             help="seconds without a heartbeat after which a trial (its worker killed) is marked FAIL "
                                  f"and queued again (default {HEARTBEAT_GRACE_S})"),
        "force": Flag(("-f", "--force"), action="store_true",
                      help="replace files in --out that are not this study's reports (a rerun of the same study "
                           "replaces its own reports without it)"),
        "verbose": Flag(("-v", "--verbose"), "show Optuna's own log messages", action="store_true"),
        # gru4rec train's flags (docs/attributes.md), as declared there; --item-types is parsed
        # here into the {column: kind} the search's settings hold.
        "item_features": declared_flag(ItemFeatureFlags, "item_features",
                                       help="item attribute table every trial trains with (gru4rec train --item-features); "
                                            "its content, --item-min-count and --item-types are part of the study's identity"),
        "item_min_count": declared_flag(ItemFeatureFlags, "item_min_count"),
        "item_types": declared_flag(ItemFeatureFlags, "item_types", type=item_types_argument),
    }


#: The settings of ``gru4rec paropt`` and the flags of their fields (``gru4rec`` spellings).
SETTINGS = ParoptSettings
FLAGS = flags()


def add_arguments(parser: argparse.ArgumentParser, *, original: bool = False) -> None:
    """Add paropt's options to ``parser``: a flag per field of :class:`ParoptSettings`
    (:func:`flags`; ``original``: the original ``paropt.py``'s spellings)."""
    add_flags(parser, ParoptSettings, flags(original=original))


def settings_from_args(args: argparse.Namespace) -> ParoptSettings:
    """The :class:`ParoptSettings` of parsed command-line arguments (either spelling: the
    destinations are the field names)."""
    return settings_from(ParoptSettings, args, FLAGS)


def run(args: argparse.Namespace) -> int:
    """Run paropt for parsed arguments; returns the exit code of a study that ran (see the
    module). Errors and interruptions propagate to the command line's one dispatcher
    (:func:`gru4rec.cli.dispatch`: ``gru4rec paropt`` and :func:`main` alike), which turns them
    into one line and the exit code; an interrupted run has already said how to continue."""
    return run_settings(settings_from_args(args))


def run_settings(settings: ParoptSettings) -> int:
    """Run the search of ``settings`` (see :func:`run`)."""
    report = run_study(settings)
    if not logging.getLogger(run_study.__module__).isEnabledFor(logging.INFO):
        # -q: the search's messages were not shown, its result lines still are (as
        # `gru4rec -q train` prints its metrics); without -q they were among the messages.
        for line in result_lines(report, settings):
            result(line)
    return 1 if report.problems else 0


def result_lines(report: StudyReport, settings: ParoptSettings) -> list[str]:
    """What a run found, as the search's messages say it: the best trial and its ``-ps``
    string, then the final test's lines (``-fm`` cutoffs); the rest is in ``STUDY.summary.json``."""
    if report.best_number is None or report.best_value is None:
        return ["No trial completed: no best parameters."]
    lines = [f"Best trial {report.best_number}: {metric_label(settings)}={report.best_value:.6f} ({settings.eval_mode} ties)",
             f"Best parameters: {report.best_param_string}"]
    final = report.final or {}
    for cutoff in sorted(int(c) for c in final.get("recall", {})):
        lines.append(f"Recall@{cutoff}: {final['recall'][str(cutoff)]:.6f} MRR@{cutoff}: {final['mrr'][str(cutoff)]:.6f}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``paropt.py``: the original's flags as it spelled them, plus ``-q``/``--debug``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tune GRU4Rec hyperparameters with Optuna (resumable, parallel, distributed).",
    )
    add_arguments(parser, original=True)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="only warnings, errors and the result lines (best parameters, final test)")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``paropt.py`` / ``python -m gru4rec.cli.paropt``: parse ``argv`` and :func:`run` through the
    command line's dispatcher (the exit codes and one-line errors of every ``gru4rec`` command),
    with the original's messages on standard output (``-q``: warnings, errors and the result lines).
    Without ``argv``, the process's own command line: it asks for the allocator tuning
    (:func:`gru4rec.kernels.memory.keep_freed_memory`; its spawned workers do too)."""
    from gru4rec.cli import dispatch
    from gru4rec.cli.console import command_console
    from gru4rec.kernels.memory import keep_freed_memory

    if argv is None:
        keep_freed_memory()

    def run_with_console(args: argparse.Namespace) -> int:
        with command_console(PROG, level=logging.WARNING if args.quiet else logging.INFO, messages_on_stdout=True):
            return run(args)

    return dispatch(build_parser(), list(sys.argv[1:] if argv is None else argv), run_with_console, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
