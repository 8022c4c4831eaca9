"""Tests of gru4rec.tune.settings: every invalid setting is a ConfigError naming its option."""
from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import run_study  # noqa: E402
from tune_helpers import data_fixture, settings  # noqa: E402,F401 - data is a fixture


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_trials": 0}, "-nt must be >= 1"),
        ({"measure": 0}, "-m must be >= 1"),
        ({"final_measure": (20, 0)}, "-fm needs cutoffs >= 1"),
        ({"primary_metric": "ndcg"}, "-pm must be one of"),
        ({"eval_mode": "pessimistic"}, "-e must be one of"),
        ({"workers": 0}, "--workers must be >= 1"),
        ({"threads": 0}, "--threads must be >= 1"),
        ({"fixed": "n_epochs=zero"}, "fixed parameters (-fp)"),
        ({"heartbeat_interval": 0}, "--heartbeat-interval must be >= 1"),
        ({"heartbeat_interval": 10, "grace_period": 10}, "--grace-period longer than it, got 10 and 10"),
        ({"enqueue": ("nothere.py",)}, "--enqueue 'nothere.py': param file 'nothere.py' does not exist"),
    ],
)
def test_invalid_settings(data: dict[str, Path], tmp_path: Path, change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        run_study(settings(data, tmp_path, **change))
    assert message in str(info.value)
