"""Tests of gru4rec.tune.study: resuming a study (numbering, --total, a killed run on the same
SQLite file) and refusing one that optimises something else."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import run_study  # noqa: E402
from tune_helpers import (  # noqa: E402,F401 - data is a fixture
    FIXED,
    ROOT,
    TrialState,
    cli_args,
    data,
    settings,
    subprocess_env,
    trials_of,
)


def test_resume_continues_numbering_and_total_counts_the_study(data: dict[str, Path], tmp_path: Path) -> None:
    first = run_study(settings(data, tmp_path, n_trials=2, study_name="resume"))
    assert first.counts == {"COMPLETE": 2}
    # Same study, same storage: -nt runs that many more; numbering continues.
    second = run_study(settings(data, tmp_path, n_trials=1, study_name="resume", force=True))
    assert second.counts == {"COMPLETE": 3}
    # --total: only the trials missing to reach 4 finished ones; a second call runs none.
    run_study(settings(data, tmp_path, n_trials=4, total=True, study_name="resume", force=True))
    report = run_study(settings(data, tmp_path, n_trials=4, total=True, study_name="resume", force=True))
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "resume")
    assert [t.number for t in trials] == [0, 1, 2, 3] and report.counts == {"COMPLETE": 4}
    # A study that optimises something else is not silently mixed in.
    with pytest.raises(ConfigError, match="optimises something else") as info:
        run_study(settings(data, tmp_path, fixed=FIXED.replace("n_epochs=2", "n_epochs=3"), study_name="resume", force=True))
    assert "n_epochs" in str(info.value)
    with pytest.raises(ConfigError, match="metric"):
        run_study(settings(data, tmp_path, primary_metric="recall", study_name="resume", force=True))
    # ... but the order of the fixed parameters does not matter.
    reordered = ",".join(reversed(FIXED.split(",")))
    run_study(settings(data, tmp_path, fixed=reordered, n_trials=4, total=True, study_name="resume", force=True))


def test_killed_run_resumes_on_the_same_sqlite_file(data: dict[str, Path], tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [sys.executable, str(ROOT / "paropt.py"), *cli_args(data, storage=storage, study_name="killed", out=str(tmp_path / "a"))]
    command += ["-nt", "1000", "--no-pruning"]
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        completed = 0
        while completed < 2:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the worker did not finish 2 trials"
            time.sleep(0.2)
            try:
                completed = sum(t.state == TrialState.COMPLETE for t in trials_of(storage, "killed"))
            except KeyError:  # the study does not exist yet
                continue
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        if process.stderr:
            process.stderr.close()
    before = trials_of(storage, "killed")
    n_before = sum(t.state == TrialState.COMPLETE for t in before)
    assert n_before >= 2
    # The trial the kill interrupted (if any) stays RUNNING until its heartbeat expires.
    assert {t.state for t in before} <= {TrialState.COMPLETE, TrialState.RUNNING}

    target = n_before + 2
    report = run_study(settings(data, tmp_path, storage=storage, study_name="killed", n_trials=target, total=True,
                                pruning=False, out=str(tmp_path / "b")))
    after = trials_of(storage, "killed")
    numbers = [t.number for t in after]
    assert numbers == list(range(len(before) + 2))  # new trials continue the numbering, none lost
    assert [t.state for t in after[: len(before)]] == [t.state for t in before]
    assert all(t.state == TrialState.COMPLETE for t in after[len(before):])
    assert report.counts["COMPLETE"] == target
