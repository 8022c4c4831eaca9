"""The workers of a run: worker 0 in the run's own process, workers 1.. in spawned processes,
each reading TRAIN and VALID once and running its share of the run's trials.

A local worker process that is killed (SIGKILL, the out-of-memory killer, a preempted job) loses
nothing: its parent sees it die, marks the trial it was running FAIL (reason ``worker process
killed by SIGKILL``), queues that trial again with the same parameters (Optuna's retry callback,
:func:`gru4rec.tune.storage.retry_callback`) and starts a new worker process for the trials the
dead one had not finished, so the run still ends with the number of trials it was asked for.
The trial of a process killed elsewhere (another machine) is found by the heartbeat of RDB
storages (:mod:`gru4rec.tune.storage`) instead.

Every worker logs one line per finished trial and stops early after
:data:`MAX_CONSECUTIVE_FAILURES` failed trials in a row.
"""
from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gru4rec.errors import Gru4RecError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.objective import Objective, TrialFailed, worker_tag
from gru4rec.tune.settings import ParoptSettings, metric_label
from gru4rec.tune.storage import open_storage, retry_callback
from gru4rec.tune.study import Prepared, make_sampler_pruner, n_finished, open_study, prepare, study_identity

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna
    import pandas as pd

__all__ = ["MAX_CONSECUTIVE_FAILURES", "MAX_RESTARTS", "open_run_storage", "read_data", "run_workers", "set_threads"]

log = logging.getLogger(__name__)

#: A worker stops after this many failed trials in a row: a space where every trial fails would
#: otherwise burn the whole budget (or, with --total, never end).
MAX_CONSECUTIVE_FAILURES = 10
#: A killed local worker is replaced at most this many times per worker slot.
MAX_RESTARTS = 5


class _TrialLog:
    """Optuna callback after every trial: logs the trial's one line and stops the worker when it
    should (the study holds the ``--total`` trials, or too many trials failed in a row)."""

    def __init__(self, settings: ParoptSettings, prefix: str, stop_at_total: int | None) -> None:
        self.label = metric_label(settings)
        self.prefix = prefix
        self.stop_at_total = stop_at_total
        self.consecutive_failures = 0
        self.gave_up: str | None = None

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        optuna = import_optuna()
        states = optuna.trial.TrialState
        params = trial.user_attrs.get("param_string", "")
        seconds = trial.user_attrs.get("seconds")
        took = f"{seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        origin = ""
        if trial.system_attrs.get("failed_trial") is not None:
            origin = f"  (retry of trial {trial.system_attrs['failed_trial']})"
        elif trial.user_attrs.get("enqueued_from"):
            origin = f"  (from {trial.user_attrs['enqueued_from']})"
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
            if trial.user_attrs.get("diverged"):
                line += f"  (diverged: {trial.user_attrs['diverged']})"
            self.consecutive_failures = 0
        else:
            reason = trial.user_attrs.get("fail_reason") or trial.system_attrs.get("fail_reason", "")
            line = f"Trial {trial.number} {trial.state.name} {reason}  {params}"
            if trial.state == states.FAIL:
                self.consecutive_failures += 1
                if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    self.gave_up = f"stopped after {self.consecutive_failures} failed trials in a row; the last: {reason}"
                    study.stop()
        log.info(self.prefix + line + origin)
        if self.stop_at_total is not None and n_finished(study) >= self.stop_at_total:
            study.stop()


def set_threads(settings: ParoptSettings) -> None:
    """This process's thread count (torch and the fused CPU kernels): :meth:`ParoptSettings.trial_threads`."""
    from gru4rec.machine.threads import set_threads as set_torch_threads

    set_torch_threads(settings.trial_threads())


def read_data(settings: ParoptSettings, keys: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """TRAIN and VALID as event frames, read with the column ``keys``."""
    from gru4rec.data.events import read_events

    return read_events(settings.train, **keys), read_events(settings.valid, **keys)


def open_run_storage(settings: ParoptSettings, prepared: Prepared) -> tuple[Any, str]:
    """The run's storage with its heartbeat settings; returns ``(storage, url)``."""
    return open_storage(prepared.storage_url, settings.out, heartbeat_interval=settings.heartbeat_interval,
                        grace_period=settings.grace_period)


@dataclass
class _Worker:
    """What a worker process needs besides the settings."""

    prepared: Prepared
    run_id: str
    sampler: Any = None
    pruner: Any = None


def _work(
    settings: ParoptSettings,
    job: _Worker,
    worker: int,
    n_trials: int | None,
    storage: Any = None,
    data: dict[str, Any] | None = None,
) -> str | None:
    """Run one worker's trials in this process; returns why it gave up early, or None.

    ``data`` (optional) receives the frames read, so that the caller can reuse them.
    """
    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING if settings.verbose else optuna.logging.ERROR)
    set_threads(settings)
    default_sampler, default_pruner = make_sampler_pruner(settings)
    if storage is None:
        storage, _ = open_run_storage(settings, job.prepared)
    study, _ = open_study(
        storage,
        job.prepared.study_name,
        study_identity(settings, job.prepared),
        job.sampler if job.sampler is not None else default_sampler,
        job.pruner if job.pruner is not None else default_pruner,
    )
    stop_at = settings.n_trials if settings.total else None
    if stop_at is not None and n_finished(study) >= stop_at:
        return None
    train, valid = read_data(settings, job.prepared.keys)  # once per worker, shared by its trials
    from gru4rec.data.overlap import TrainingFingerprint, checked_once, paired_sessions, warn_overlap

    if data is not None:  # worker 0, in paropt's own process: check VALID once for the whole run
        data.update(train=train, valid=valid)
        train_sessions, valid_sessions, _ = paired_sessions(train, valid, **job.prepared.keys)
        warn_overlap(TrainingFingerprint.of(train_sessions), valid_sessions, f"VALID {settings.valid}")
    per_epoch = not isinstance(study.pruner, optuna.pruners.NopPruner)
    objective = Objective(settings, job.prepared.space, job.prepared.base, train, valid, per_epoch, job.run_id)
    prefix = f"[worker {worker}] " if settings.workers > 1 else ""
    trial_log = _TrialLog(settings, prefix, stop_at)
    with checked_once():  # VALID was checked above: not once per trial
        study.optimize(
            objective,
            n_trials=n_trials,
            timeout=settings.timeout,
            catch=(TrialFailed,),
            callbacks=[trial_log],
            gc_after_trial=True,
        )
    return trial_log.gave_up


def _worker_process(settings: ParoptSettings, job: _Worker, worker: int, n_trials: int | None) -> None:
    """Entry point of a spawned local worker process (the package's own: it asks for the
    allocator tuning, as the command lines do)."""
    from gru4rec.kernels.memory import keep_freed_memory

    keep_freed_memory()
    try:
        job.prepared = prepare(settings)
        gave_up = _work(settings, job, worker, n_trials)
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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class _Child:
    worker: int
    share: int | None
    process: Any  # multiprocessing.Process
    restarts: int = 0


class _LocalWorkers:
    """Workers 1.. of a run as spawned processes, watched from a thread of the parent: a killed
    one is recovered (its trial FAIL and queued again) and replaced for its unfinished share."""

    def __init__(self, settings: ParoptSettings, job: _Worker) -> None:
        self.settings = settings
        self.job = job
        # No fork: torch and SQLite handles do not survive it.
        self.context = multiprocessing.get_context("spawn")
        self.children: dict[int, _Child] = {}
        self.problems: list[str] = []
        self.recovered: list[str] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # children: changed by the watching thread, read by finish()
        self._thread = threading.Thread(target=self._watch, name="paropt-workers", daemon=True)

    def start(self, shares: list[int | None]) -> None:
        """Start worker i with ``shares[i]`` trials (None: until --total), for i >= 1."""
        for worker, share in enumerate(shares):
            if worker > 0 and share != 0:
                self._spawn(worker, share, restarts=0)
        self._thread.start()

    def _spawn(self, worker: int, share: int | None, restarts: int) -> None:
        process = self.context.Process(target=_worker_process, args=(self.settings, self.job, worker, share),
                                       name=f"paropt-worker-{worker}")
        process.start()
        with self._lock:
            self.children[worker] = _Child(worker, share, process, restarts)

    def _watch(self) -> None:
        while True:
            with self._lock:
                by_sentinel = {child.process.sentinel: child for child in self.children.values()}
            if not by_sentinel:
                return
            for sentinel in multiprocessing.connection.wait(list(by_sentinel), timeout=1.0):
                self._ended(by_sentinel[sentinel])

    def _ended(self, child: _Child) -> None:
        child.process.join()
        with self._lock:
            del self.children[child.worker]
        code = child.process.exitcode
        if code == 0 or code is None:
            return
        if code < 0 and not self._stopping.is_set():
            note, remaining = self._recover(child, -code)
            if child.restarts >= MAX_RESTARTS:
                note += f"; not replaced again (killed {child.restarts + 1} times)"
                self.problems.append(note)
            elif remaining is None or remaining > 0:
                self._spawn(child.worker, remaining, child.restarts + 1)
                rest = "trials" if remaining is None else f"{remaining} trial(s)"
                note += f"; a new worker process runs its remaining {rest}"
                self.recovered.append(note)
            else:
                self.recovered.append(note)
            log.warning(f"[worker {child.worker}] {note}")
        elif code < 0:
            self.problems.append(f"worker {child.worker} was stopped by {_signal_name(-code)}")
        elif code != 130:  # 130: interrupted with the run, which reports that itself
            self.problems.append(f"worker {child.worker} exited with code {code}")

    def _recover(self, child: _Child, signum: int) -> tuple[str, int | None]:
        """Mark the trials the dead ``child`` was running FAIL and queue them again; returns a
        note and how many of its share it had not finished (None with --total)."""
        optuna = import_optuna()
        killed_by = _signal_name(signum)
        storage, _ = open_run_storage(self.settings, self.job.prepared)
        study = optuna.load_study(study_name=self.job.prepared.study_name, storage=storage)
        tag = worker_tag(child.process.pid)
        mine = [t for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("worker") == tag and t.user_attrs.get("run") == self.job.run_id]
        running = [t for t in mine if t.state == optuna.trial.TrialState.RUNNING]
        retry = retry_callback()
        failed = []
        for trial in running:
            # FrozenTrial._trial_id: the storage API addresses trials by id, not by number.
            try:
                storage.set_trial_user_attr(trial._trial_id, "fail_reason", f"worker process killed by {killed_by}")
                if storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL):
                    # The queued copy takes the trial's attributes: not the reason it failed.
                    frozen = storage.get_trial(trial._trial_id)
                    frozen.user_attrs = {k: v for k, v in frozen.user_attrs.items() if k != "fail_reason"}
                    retry(study, frozen)
                    failed.append(trial.number)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker's heartbeat check got there first (and queued it again)
        share = child.share
        remaining = None if share is None else share - (len(mine) - len(running))
        trials = f"trial {', '.join(map(str, failed))} marked FAIL and queued again" if failed else "no trial was running"
        return f"worker {child.worker} (pid {child.process.pid}) was killed by {killed_by}; {trials}", remaining

    def finish(self, stop: bool) -> None:
        """Wait until every worker process has ended, replacing killed ones; with ``stop`` (the
        run was interrupted or failed) ask them to stop first, as Ctrl-C would, and replace none."""
        if stop:
            self._stopping.set()
            with self._lock:
                children = list(self.children.values())
            for child in children:
                if child.process.exitcode is None:
                    _interrupt(child.process)
        if self._thread.is_alive():
            self._thread.join()


def _interrupt(process: Any) -> None:
    """Ctrl-C for one process (its trial ends FAIL as an interrupted one would)."""
    try:
        if sys.platform == "win32":  # pragma: no cover
            process.terminate()
        else:
            os.kill(process.pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def run_workers(
    settings: ParoptSettings,
    prepared: Prepared,
    run_id: str,
    storage: Any,
    sampler: Any,
    pruner: Any,
    frames: dict[str, Any],
) -> tuple[list[str], list[str]]:
    """Run the trials: worker 0 in this process, workers 1.. in spawned processes (replaced when
    killed); returns ``(problems, recoveries)``. ``frames`` receives TRAIN and VALID as worker 0
    read them."""
    job = _Worker(prepared, run_id, sampler, pruner)
    shares: list[int | None] = [None] * settings.workers if settings.total else list(_shares(settings.n_trials, settings.workers))
    problems: list[str] = []
    local = _LocalWorkers(settings, job)
    local.start(shares)
    stop_others = True  # unless worker 0 ends normally (Ctrl-C, an error)
    try:
        if shares[0] != 0:
            gave_up = _work(settings, job, 0, shares[0], storage, frames)
            if gave_up:
                problems.append(f"worker 0: {gave_up}")
        stop_others = False
    finally:
        local.finish(stop_others)
    return problems + local.problems, local.recovered
