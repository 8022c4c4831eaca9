"""The command line of the search: ``python paropt.py``, ``gru4rec paropt`` and ``python -m
gru4rec.tune`` (the original's ``paropt.py`` flags plus the storage, parallel and pruning
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

from gru4rec.cli.console import result
from gru4rec.tune.reports import StudyReport
from gru4rec.tune.runner import run_study
from gru4rec.tune.settings import DEFAULT_OUT, EVAL_MODES, METRICS, ParoptSettings, metric_label
from gru4rec.tune.storage import HEARTBEAT_GRACE_S, HEARTBEAT_INTERVAL_S, STORAGE_ENV

__all__ = ["add_arguments", "build_parser", "main", "result_lines", "run", "settings_from_args"]

log = logging.getLogger(__name__)

#: The script's name in its messages and help.
PROG = "paropt.py"


def add_arguments(parser: argparse.ArgumentParser, *, original: bool = False) -> None:
    """Add paropt's options to ``parser`` (the original's flags plus storage/parallel options).

    ``original``: spell the original ``paropt.py``'s long options as it did (``--eval_type``,
    ``--item_key``, ...); otherwise they follow the ``gru4rec`` commands' convention
    (``--eval-mode``, ``--item-key``, ...). The short flags and destinations are the same.
    """

    def long(name: str, gru4rec_name: str | None = None) -> str:
        return "--" + (name if original else (gru4rec_name or name.replace("_", "-")))

    parser.add_argument("path", metavar="TRAIN", help="training events (TSV/CSV/Parquet)")
    parser.add_argument("test", metavar="VALID", help="validation events the objective is measured on")
    parser.add_argument("-opf", long("optuna_parameter_file"), dest="optuna_parameter_file", metavar="PATH", required=True,
                        help="search space: JSON lines {name, dtype int|float|categorical, values, step, log}")
    parser.add_argument("-fp", long("fixed_parameters"), dest="fixed_parameters", metavar="PARAM_STRING", default="",
                        help="fixed parameters, e.g. 'loss=cross-entropy,constrained_embedding=True,n_epochs=10'")
    parser.add_argument("-nt", "--ntrials", metavar="NT", type=int, default=50,
                        help="trials THIS RUN adds to the study (failed and pruned ones included), not the study's "
                             "total: a rerun of the same command extends the study by NT more; default 50")
    parser.add_argument("--total", action="store_true",
                        help="-nt is the study's total instead: run until the study holds NT finished "
                             "(COMPLETE+PRUNED) trials, so a rerun after an interruption only runs the missing ones")
    parser.add_argument("-m", "--measure", metavar="AT", type=int, default=20, help="cutoff of the objective metric (default 20)")
    parser.add_argument("-fm", long("final_measure"), dest="final_measure", metavar="AT", type=int, nargs="*", default=[20],
                        help="cutoffs of the final test (--final-test); default 20")
    parser.add_argument("-pm", long("primary_metric"), dest="primary_metric", metavar="METRIC", choices=METRICS, default="recall",
                        help="objective: recall or mrr (default recall)")
    parser.add_argument("-e", long("eval_type", "eval-mode"), dest="eval_type", metavar="MODE", choices=EVAL_MODES, default="standard",
                        help="tie handling: standard, conservative, median or tiebreaking (default standard)")
    parser.add_argument("-ik", long("item_key"), dest="item_key", metavar="IK", default=None, help="item id column (default ItemId)")
    parser.add_argument(
        "-sk", long("session_key"), dest="session_key", metavar="SK", default=None, help="session id column (default SessionId)"
    )
    parser.add_argument("-tk", long("time_key"), dest="time_key", metavar="TK", default=None, help="time column (default Time)")
    parser.add_argument("-d", "--device", default="auto", help="torch device: auto, cpu, cuda, cuda:1, ... (default auto)")
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                        help="training precision of the trials (default float32; see gru4rec train --help)")
    parser.add_argument("--storage", metavar="URL", default=None,
                        help=f"Optuna storage: SQLAlchemy URL, journal:PATH or a file path (default: ${STORAGE_ENV}, "
                             "else sqlite:///OUT/paropt.db)")
    parser.add_argument("--study-name", default=None,
                        help="study to create or resume (default: <space>.<train folder>.<train file>)")
    parser.add_argument("--no-pruning", action="store_true", help="no pruning (and no per-epoch validation)")
    parser.add_argument("--prune-startup", type=int, default=5, metavar="N",
                        help="median pruner: completed trials before pruning starts (default 5)")
    parser.add_argument("--prune-warmup", type=int, default=1, metavar="E",
                        help="median pruner: epochs exempt from pruning (default 1)")
    parser.add_argument("--workers", type=int, default=1, metavar="W",
                        help="local worker processes sharing the study (default 1)")
    parser.add_argument("--threads", type=int, default=None, metavar="T",
                        help="torch threads per worker (default: 1 with several workers, else torch's default)")
    parser.add_argument("--seed", type=int, default=42, dest="sampler_seed",
                        help="seed of the TPE sampler (default 42): trial n draws from (seed, n), so the same command "
                             "on a new study proposes the same trials and no two trials draw alike")
    parser.add_argument("--enqueue", action="append", default=[], metavar="PARAMFILE",
                        help="queue the searched values of a parameter file (e.g. paramfiles/*_best.py) as one of the "
                             "first trials; repeatable; its fixed (-fp) values must agree")
    parser.add_argument("--add-trials", action="append", default=[], metavar="TRIALS_JSON",
                        help="continue a study from its export (STUDY.trials.json, e.g. from another machine): its "
                             "finished trials are added as they were, its unfinished ones queued again; repeatable")
    parser.add_argument("--heartbeat-interval", type=int, default=HEARTBEAT_INTERVAL_S, metavar="S",
                        help=f"seconds between a running trial's heartbeats in an RDB storage (default {HEARTBEAT_INTERVAL_S})")
    parser.add_argument("--grace-period", type=int, default=HEARTBEAT_GRACE_S, metavar="S",
                        help="seconds without a heartbeat after which a trial (its worker killed) is marked FAIL and "
                             f"queued again (default {HEARTBEAT_GRACE_S})")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="start no new trial after S seconds")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"folder for the best parameters, trial exports and the default storage (default {DEFAULT_OUT})")
    parser.add_argument("--final-test", default=None, metavar="TEST",
                        help="train the best configuration on TRAIN+VALID and evaluate it on TEST at the -fm cutoffs")
    parser.add_argument("--early-stop", type=int, default=None, metavar="PATIENCE",
                        help="stop a trial when the objective on VALID has not improved for PATIENCE epochs; the "
                             "trial keeps (and scores) its best epoch (faster trials; default: every epoch)")
    parser.add_argument("--run-dirs", default=None, metavar="DIR",
                        help="a run folder per trial in DIR/<study>/trial-NNNNN (config.json, epochs.jsonl, "
                             "metrics.json on VALID with breakdowns, command.txt to retrain it; no model file), "
                             "for 'gru4rec report'")
    parser.add_argument("-f", "--force", action="store_true",
                        help="replace files in --out that are not this study's reports (a rerun of the same study "
                             "replaces its own reports without it)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Optuna's own log messages")


def settings_from_args(args: argparse.Namespace) -> ParoptSettings:
    """The :class:`ParoptSettings` of parsed command-line arguments."""
    return ParoptSettings(
        train=args.path,
        valid=args.test,
        paramspace=args.optuna_parameter_file,
        fixed=args.fixed_parameters or "",
        n_trials=args.ntrials,
        total=args.total,
        measure=args.measure,
        final_measure=tuple(args.final_measure or (20,)),
        primary_metric=args.primary_metric,
        eval_mode=args.eval_type,
        session_key=args.session_key,
        item_key=args.item_key,
        time_key=args.time_key,
        device=args.device,
        precision=args.precision,
        threads=args.threads,
        workers=args.workers,
        storage=args.storage,
        study_name=args.study_name,
        pruning=not args.no_pruning,
        prune_startup=args.prune_startup,
        prune_warmup=args.prune_warmup,
        sampler_seed=args.sampler_seed,
        timeout=args.timeout,
        out=args.out,
        final_test=args.final_test,
        early_stop=args.early_stop,
        run_dirs=args.run_dirs,
        enqueue=tuple(args.enqueue or ()),
        add_trials=tuple(args.add_trials or ()),
        heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period,
        force=args.force,
        verbose=args.verbose,
    )


def run(args: argparse.Namespace) -> int:
    """Run paropt for parsed arguments; returns the exit code of a study that ran (see the
    module). Errors and interruptions propagate to the command line's one dispatcher
    (:func:`gru4rec.cli.dispatch`: ``gru4rec paropt`` and :func:`main` alike), which turns them
    into one line and the exit code; an interrupted run has already said how to continue."""
    settings = settings_from_args(args)
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
    """``paropt.py`` / ``python -m gru4rec.tune``: parse ``argv`` and :func:`run` through the
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
