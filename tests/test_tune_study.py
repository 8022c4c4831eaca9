"""Tests of gru4rec.tune.study: extending a study (numbering, --total) by rerunning it, and
refusing one that optimises something else. (A killed run's study: test_tune_workers.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import run_study  # noqa: E402
from tune_helpers import FIXED, data_fixture, settings, trials_of  # noqa: E402,F401 - data is a fixture


def test_resume_continues_numbering_and_total_counts_the_study(data: dict[str, Path], tmp_path: Path) -> None:
    first = run_study(settings(data, tmp_path, n_trials=2, study_name="resume"))
    assert first.counts == {"COMPLETE": 2}
    # Same study, same storage: -nt runs that many more; numbering continues.
    second = run_study(settings(data, tmp_path, n_trials=1, study_name="resume"))
    assert second.counts == {"COMPLETE": 3}
    # --total: only the trials missing to reach 4 finished ones; a second call runs none.
    run_study(settings(data, tmp_path, n_trials=4, total=True, study_name="resume"))
    report = run_study(settings(data, tmp_path, n_trials=4, total=True, study_name="resume"))
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "resume")
    assert [t.number for t in trials] == [0, 1, 2, 3] and report.counts == {"COMPLETE": 4}
    # A study that optimises something else is not silently mixed in.
    with pytest.raises(ConfigError, match="optimises something else") as info:
        run_study(settings(data, tmp_path, fixed=FIXED.replace("n_epochs=2", "n_epochs=3"), study_name="resume"))
    assert "n_epochs" in str(info.value)
    with pytest.raises(ConfigError, match="metric"):
        run_study(settings(data, tmp_path, primary_metric="recall", study_name="resume"))
    # ... but the order of the fixed parameters does not matter.
    reordered = ",".join(reversed(FIXED.split(",")))
    run_study(settings(data, tmp_path, fixed=reordered, n_trials=4, total=True, study_name="resume"))
