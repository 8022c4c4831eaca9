"""Tests of gru4rec.tune.workers and the heartbeat of gru4rec.tune.storage: a worker process
SIGKILLed in the middle of a trial loses nothing, on SQLite and on a real PostgreSQL server.

* a killed *local* worker: its parent marks the trial FAIL, queues it again and starts a new
  worker process, so the run ends with exactly the trials it was asked for;
* a killed *separate* process (another machine): the heartbeat of the RDB storage lets the next
  worker mark its trial FAIL and run it again, so a --total run ends with exactly its total.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.tune import run_study  # noqa: E402
from tune_helpers import (  # noqa: E402,F401 - the fixtures data, postgres and storage_url
    ROOT,
    TrialState,
    cli_args,
    data_fixture,
    postgres_fixture,
    running_trial,
    settings,
    stop,
    storage_url_fixture,
    subprocess_env,
    trials_of,
    wait_for,
)

# Longer trials than elsewhere, so that a kill lands in the middle of one: at 4 epochs (~1 s) all
# three trials of a run once ended between two polls of a loaded host, and at 50 epochs on a fresh
# clone's CI run (2026-12-06) they took 0.5-1.4 s and all three ended before a poll saw one running.
SLOW_FIXED = "loss=cross-entropy,n_sample=16,n_epochs=150,logq=1.0"  # trials of 1.5-4 s
HEARTBEAT = ["--heartbeat-interval", "1", "--grace-period", "2"]


def _paropt(data: dict[str, Path], storage: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = cli_args(data, storage=storage, study_name="killed", out=str(out))
    args[args.index("-fp") + 1] = SLOW_FIXED
    return subprocess.Popen([sys.executable, str(ROOT / "paropt.py"), *args, "--no-pruning", *extra],
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _kill_mid_trial(storage: str, process: subprocess.Popen[bytes], **which: int) -> optuna.trial.FrozenTrial:
    """SIGKILL the worker process of a trial that has run for a moment; returns that trial.

    The worker is stopped (SIGSTOP) before its trial's state is read again: a stopped worker can
    no longer end its trial, so a trial still running then is killed mid-trial for certain (trials
    of a second or less used to end between the read and the kill). One that ended before the stop
    lets its worker go on (SIGCONT), and the next running trial is taken."""
    for _ in range(5):
        trial = wait_for(lambda: running_trial(storage, "killed", **which), "a running trial", process=process)
        time.sleep(0.1)
        pid = int(trial.user_attrs["worker"].rsplit(":", 1)[1])
        os.kill(pid, signal.SIGSTOP)
        (now,) = [t for t in trials_of(storage, "killed") if t.number == trial.number]  # type: ignore[attr-defined]
        if now.state == TrialState.RUNNING:
            os.kill(pid, signal.SIGKILL)
            return now
        os.kill(pid, signal.SIGCONT)
    raise AssertionError("every trial ended before its worker was stopped; make trials longer")


def test_a_killed_local_worker_is_replaced_and_its_trial_run_again(data: dict[str, Path], tmp_path: Path,
                                                                    storage_url: str) -> None:
    process = _paropt(data, storage_url, tmp_path / "out", "-nt", "3", "--workers", "2")  # 2 + 1 trials
    try:
        killed = _kill_mid_trial(storage_url, process, not_pid=process.pid)  # a spawned worker, not the parent
        output = process.communicate(timeout=300)[0].decode()
    finally:
        stop(process)
    assert process.returncode == 0, output
    trials = trials_of(storage_url, "killed")
    states = [t.state for t in trials]
    print(f"final trial counts: {len(trials)} trials, {states.count(TrialState.COMPLETE)} COMPLETE, "
          f"{states.count(TrialState.FAIL)} FAIL")
    # Exactly the 3 trials asked for completed, plus the killed one, each number once.
    assert [t.number for t in trials] == list(range(4))
    assert states.count(TrialState.COMPLETE) == 3 and states.count(TrialState.FAIL) == 1
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    assert failed.number == killed.number and failed.user_attrs["fail_reason"] == "worker process killed by SIGKILL"
    # Its parameters were run again, to completion, in a trial that names it.
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params and "fail_reason" not in retry.user_attrs
    assert f"was killed by SIGKILL; trial {killed.number} marked FAIL and queued again" in output
    # The run's reports hold every trial as the storage has it.
    out = tmp_path / "out"
    exported = json.loads((out / "killed.trials.json").read_text())
    assert [(r["number"], r["state"], r["value"]) for r in exported] == [(t.number, t.state.name, t.value) for t in trials]
    assert exported[retry.number]["retry_of"] == killed.number
    summary = json.loads((out / "killed.summary.json").read_text())
    assert summary["counts"] == {"COMPLETE": 3, "FAIL": 1} and summary["this_run"]["counts"] == {"COMPLETE": 3, "FAIL": 1}
    assert len(summary["recovered_workers"]) == 1 and summary["problems"] == []


def test_the_heartbeat_recovers_the_trial_of_a_process_killed_elsewhere(data: dict[str, Path], tmp_path: Path,
                                                                        storage_url: str) -> None:
    # One machine's paropt dies in the middle of a trial ...
    process = _paropt(data, storage_url, tmp_path / "a", "-nt", "50", *HEARTBEAT)
    try:
        killed = _kill_mid_trial(storage_url, process)
        process.wait(timeout=60)
    finally:
        stop(process)
    before = trials_of(storage_url, "killed")
    assert before[killed.number].state == TrialState.RUNNING  # nothing else can tell it died
    # Its last heartbeat must now be older than the grace period (2 s) as the storage counts it:
    # SQLite's clock has whole seconds and Optuna asks for strictly more than the grace period, so
    # 2.5 s of real silence can read as 2 s (a heartbeat at :05.1 and a check at :07.6 are stored
    # as :05 and :07) and the new worker starts a fresh trial first. Grace + 1 s + a margin is stale
    # on every clock.
    time.sleep(3.5)
    # ... and a worker elsewhere, running until the study holds 2 more finished trials, finds it.
    n_done = sum(t.state == TrialState.COMPLETE for t in before)
    report = run_study(settings(data, tmp_path, storage=storage_url, study_name="killed", fixed=SLOW_FIXED,
                                pruning=False, n_trials=n_done + 2, total=True, heartbeat_interval=1, grace_period=2,
                                out=str(tmp_path / "b")))
    trials = trials_of(storage_url, "killed")
    states = [t.state for t in trials]
    print(f"final trial counts: {len(trials)} trials, {states.count(TrialState.COMPLETE)} COMPLETE, "
          f"{states.count(TrialState.FAIL)} FAIL")
    assert [t.number for t in trials] == list(range(len(before) + 2))
    assert trials[killed.number].state == TrialState.FAIL
    assert states.count(TrialState.COMPLETE) == n_done + 2 and states.count(TrialState.FAIL) == 1
    # The first trial of the new worker is the killed one's parameters, run again.
    retry = trials[len(before)]
    assert retry.system_attrs.get("failed_trial") == killed.number and retry.params == killed.params
    assert retry.state == TrialState.COMPLETE
    assert report.counts == {"COMPLETE": n_done + 2, "FAIL": 1}
