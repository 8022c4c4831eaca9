"""experiments/intents_limit/study_analysis.py: the best-so-far curve against a running maximum
by hand, pruned trials adding nothing, and the early-epoch importances using pruned trials too."""
from __future__ import annotations

import numpy as np
import optuna
import pytest
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.trial import TrialState

from experiments.intents_limit import study_analysis as sa


def make_study(values: list[float | None], curves: list[list[float]]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    dist: dict[str, BaseDistribution] = {"x": FloatDistribution(0.0, 1.0)}
    rng = np.random.default_rng(0)
    for value, curve in zip(values, curves):
        state = TrialState.PRUNED if value is None else TrialState.COMPLETE
        study.add_trial(optuna.trial.create_trial(params={"x": float(rng.random())}, distributions=dist, value=value, state=state,
                                                  intermediate_values=dict(enumerate(curve))))
    return study


def test_best_so_far_is_the_running_maximum_of_finished_trials() -> None:
    values = [None, 0.2, None, 0.1, 0.5, None, 0.4]
    study = make_study(values, [[0.9, 0.9]] * len(values))  # a pruned trial's high early values do not count
    assert sa.best_so_far(study.get_trials()) == [None, 0.2, 0.2, 0.2, 0.5, 0.5, 0.5]


def test_importances_of_an_early_epoch_use_pruned_trials() -> None:
    rng = np.random.default_rng(1)
    values: list[float | None] = [None] * 8 + [0.1]
    study = make_study(values, [list(rng.random(3)) for _ in values])
    assert sa.importances(study, None) == {}  # one finished trial: nothing to say
    imp = sa.importances(study, 2)
    assert set(imp) == {"x"} and imp["x"] == pytest.approx(1.0)
