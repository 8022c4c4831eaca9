"""Running a study: :func:`run_study` opens (or resumes) the study, runs its trials in one or
more worker processes, and writes what it found (:mod:`gru4rec.tune.reports`).

Each worker reads TRAIN and VALID once and reuses the frames in all of its trials. With
``--workers W`` the run starts W-1 local worker processes beside its own; processes on other
machines join by running the same command with the same storage URL and study name. Every
worker logs one line per finished trial and stops early after
:data:`MAX_CONSECUTIVE_FAILURES` failed trials in a row.
"""
from __future__ import annotations

import logging
import multiprocessing
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.errors import DataError, Gru4RecError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.final_test import final_test
from gru4rec.tune.objective import Objective, TrialFailed
from gru4rec.tune.reports import (
    StudyReport,
    best_param_dict,
    check_outputs,
    output_paths,
    write_best_files,
    write_summary,
    write_trial_exports,
)
from gru4rec.tune.settings import ParoptSettings, metric_label
from gru4rec.tune.space import join_params, trial_param_string
from gru4rec.tune.storage import open_storage, redact
from gru4rec.tune.study import (
    Prepared,
    make_sampler_pruner,
    n_finished,
    open_study,
    prepare,
    state_counts,
    study_identity,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna
    import pandas as pd

__all__ = ["MAX_CONSECUTIVE_FAILURES", "run_study"]

log = logging.getLogger(__name__)

#: A worker stops after this many failed trials in a row: a space where every trial fails would
#: otherwise burn the whole budget (or, with --total, never end).
MAX_CONSECUTIVE_FAILURES = 10


class _TrialLog:
    """Optuna callback after every trial: logs the trial's one line and stops the worker when it
    should (the study holds the ``--total`` trials, or too many trials failed in a row)."""

    def __init__(self, settings: ParoptSettings, prefix: str, stop_at_total: int | None) -> None:
        self.label = metric_label(settings)
        self.prefix = prefix
        self.stop_at_total = stop_at_total
        self.consecutive_failures = 0
        self.gave_up: str | None = None

    def __call__(self, study: "optuna.Study", trial: "optuna.trial.FrozenTrial") -> None:
        optuna = import_optuna()
        states = optuna.trial.TrialState
        params = trial.user_attrs.get("param_string", "")
        seconds = trial.user_attrs.get("seconds")
        took = f"{seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        if trial.state == states.COMPLETE:
            try:
                best = study.best_trial
                best_text = f"best {best.value:.5f} (trial {best.number})"
            except ValueError:
                best_text = ""
            line = f"Trial {trial.number} COMPLETE {self.label}={trial.value:.5f}  {best_text}  {took}  {params}"
            self.consecutive_failures = 0
        elif trial.state == states.PRUNED:
            last = trial.last_step
            value = trial.intermediate_values.get(last) if last is not None else None
            value_text = f" {self.label}={value:.5f}" if value is not None else ""
            line = f"Trial {trial.number} PRUNED after epoch {trial.user_attrs.get('epochs', '?')}{value_text}  {took}  {params}"
            self.consecutive_failures = 0
        else:
            reason = trial.user_attrs.get("fail_reason") or trial.system_attrs.get("fail_reason", "")
            line = f"Trial {trial.number} {trial.state.name} {reason}  {params}"
            if trial.state == states.FAIL:
                self.consecutive_failures += 1
                if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    self.gave_up = f"stopped after {self.consecutive_failures} failed trials in a row; the last: {reason}"
                    study.stop()
        log.info(self.prefix + line)
        if self.stop_at_total is not None and n_finished(study) >= self.stop_at_total:
            study.stop()


def _set_threads(settings: ParoptSettings) -> None:
    threads = settings.threads if settings.threads is not None else (1 if settings.workers > 1 else None)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _read_data(settings: ParoptSettings, keys: dict[str, str]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    from gru4rec.data.events import read_events

    return read_events(settings.train, **keys), read_events(settings.valid, **keys)


def _work(
    settings: ParoptSettings,
    prepared: Prepared,
    worker: int,
    n_trials: int | None,
    sampler: Any = None,
    pruner: Any = None,
    storage: Any = None,
    data: dict[str, Any] | None = None,
) -> str | None:
    """Run one worker's trials in this process; returns why it gave up early, or None.

    ``data`` (optional) receives the frames read, so that the caller can reuse them.
    """
    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING if settings.verbose else optuna.logging.ERROR)
    _set_threads(settings)
    default_sampler, default_pruner = make_sampler_pruner(settings, worker)
    if storage is None:
        storage, _ = open_storage(prepared.storage_url, settings.out)
    study, _ = open_study(
        storage,
        prepared.study_name,
        study_identity(settings, prepared),
        sampler if sampler is not None else default_sampler,
        pruner if pruner is not None else default_pruner,
    )
    stop_at = settings.n_trials if settings.total else None
    if stop_at is not None and n_finished(study) >= stop_at:
        return None
    train, valid = _read_data(settings, prepared.keys)  # once per worker, shared by its trials
    if data is not None:
        data.update(train=train, valid=valid)
    per_epoch = not isinstance(study.pruner, optuna.pruners.NopPruner)
    objective = Objective(settings, prepared.space, prepared.base, train, valid, per_epoch)
    prefix = f"[worker {worker}] " if settings.workers > 1 else ""
    trial_log = _TrialLog(settings, prefix, stop_at)
    study.optimize(
        objective,
        n_trials=n_trials,
        timeout=settings.timeout,
        catch=(TrialFailed,),
        callbacks=[trial_log],
        gc_after_trial=True,
    )
    return trial_log.gave_up


def _worker_process(settings: ParoptSettings, worker: int, n_trials: int | None, sampler: Any, pruner: Any) -> None:
    """Entry point of a spawned local worker process."""
    try:
        prepared = prepare(settings)
        gave_up = _work(settings, prepared, worker, n_trials, sampler, pruner)
    except Gru4RecError as exc:
        log.error(f"[worker {worker}] {exc}")
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        sys.exit(130)
    if gave_up:
        log.warning(f"[worker {worker}] {gave_up}")
        sys.exit(3)


def _shares(n_trials: int, workers: int) -> list[int]:
    return [n_trials // workers + (1 if i < n_trials % workers else 0) for i in range(workers)]


def _run_workers(
    settings: ParoptSettings, prepared: Prepared, storage: Any, sampler: Any, pruner: Any, frames: dict[str, Any]
) -> list[str]:
    """Run the trials: worker 0 in this process, workers 1.. in spawned processes; returns why
    workers stopped early. ``frames`` receives TRAIN and VALID as worker 0 read them."""
    problems: list[str] = []
    shares: list[int | None] = [None] * settings.workers if settings.total else list(_shares(settings.n_trials, settings.workers))
    processes = []
    if settings.workers > 1:
        context = multiprocessing.get_context("spawn")  # no fork: torch and SQLite handles do not survive it
        for worker in range(1, settings.workers):
            if shares[worker] == 0:
                continue
            process = context.Process(
                target=_worker_process, args=(settings, worker, shares[worker], sampler, pruner), name=f"paropt-worker-{worker}"
            )
            process.start()
            processes.append((worker, process))
    try:
        if shares[0] != 0:
            gave_up = _work(settings, prepared, 0, shares[0], sampler, pruner, storage, frames)
            if gave_up:
                problems.append(f"worker 0: {gave_up}")
    finally:
        for worker, process in processes:
            process.join()
            if process.exitcode != 0:
                problems.append(f"worker {worker} exited with code {process.exitcode}")
    return problems


def run_study(settings: ParoptSettings, *, sampler: Any = None, pruner: Any = None) -> StudyReport:
    """Run (or resume) a study, then export its results; see :mod:`gru4rec.tune`.

    ``sampler``/``pruner`` replace the defaults (TPE; median pruner or, with
    ``settings.pruning=False``, none) in every worker; with ``workers > 1`` they must pickle.
    Raises Gru4RecError subclasses for invalid settings, data or storage.
    """
    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING if settings.verbose else optuna.logging.ERROR)
    prepared = prepare(settings)
    paths = output_paths(settings.out, prepared.study_name)
    check_outputs(paths, settings.force)
    # Missing data fails now, before a study is created for it.
    for label, path in (("TRAIN", settings.train), ("VALID", settings.valid), ("--final-test", settings.final_test)):
        if path is not None and not Path(path).is_file():
            raise DataError(f"{label} {path}: file not found")

    # Create (or check) the study once here, so that the workers never race to create it.
    storage, url = open_storage(prepared.storage_url, settings.out)
    default_sampler, default_pruner = make_sampler_pruner(settings, 0)
    study, resumed = open_study(
        storage,
        prepared.study_name,
        study_identity(settings, prepared),
        sampler or default_sampler,
        pruner or default_pruner,
    )
    counts = state_counts(study)
    what = "Resuming" if resumed else "Starting"
    counts_text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    log.info(f"{what} study {prepared.study_name!r} in {redact(url)} ({counts_text})")
    if settings.total:
        plan = f"until the study holds {settings.n_trials} finished trials ({n_finished(study)} now)"
    else:
        plan = f"{settings.n_trials} trial(s)"
    log.info(f"Running {plan} with {settings.workers} worker(s); objective {metric_label(settings)} ({settings.eval_mode}) "
             f"on {settings.valid}; pruning {'on' if settings.pruning or pruner is not None else 'off'}")

    frames: dict[str, Any] = {}  # TRAIN and VALID as worker 0 read them, reused by the final test
    start = time.perf_counter()
    problems = _run_workers(settings, prepared, storage, sampler, pruner, frames)
    wall = time.perf_counter() - start

    study = optuna.load_study(study_name=prepared.study_name, storage=storage)
    report = StudyReport(study_name=prepared.study_name, storage=redact(url), counts=state_counts(study), problems=problems)
    counts_text = ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items()))
    log.info(f"Study {prepared.study_name!r}: {counts_text}; this run took {wall:.1f} s")

    report.files = write_trial_exports(study, prepared.space, paths)  # every trial, whatever the outcome
    try:
        best = study.best_trial
    except ValueError:
        best = None
    if best is None:
        log.info("No trial completed: no best parameters.")
        problems.append("no trial completed")
    else:
        searched = trial_param_string(prepared.space, best.params)
        best_string = join_params(settings.fixed, searched)
        report.best_number, report.best_value = best.number, best.value
        report.best_params = {s.name: s.clean(best.params[s.name]) for s in prepared.space if s.name in best.params}
        report.best_param_string = best_string
        label = metric_label(settings)
        log.info(f"Best trial {best.number}: {label}={best.value:.6f}")
        log.info(f"Best parameters: {best_string}")
        params = best_param_dict(prepared.base, settings.fixed, prepared.space, searched)
        header = (
            f"Best parameters of Optuna study {prepared.study_name!r}: trial {best.number}, "
            f"{label}={best.value:.6f} on {settings.valid} (gru4rec paropt)"
        )
        report.files.update(write_best_files(paths, params, header))
        if settings.final_test is not None:
            _set_threads(settings)
            config = prepared.base.replace_from_string(searched)
            if not frames:  # worker 0 ran no trial here (e.g. the study was already complete)
                frames["train"], frames["valid"] = _read_data(settings, prepared.keys)
            report.final = final_test(settings, config, prepared.keys, frames["train"], frames["valid"])

    report.files["summary"] = write_summary(paths, settings, report, wall)
    log.info("Wrote " + ", ".join(report.files.values()))
    for problem in problems:
        log.warning(problem)
    return report
