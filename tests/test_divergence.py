"""An exploding loss (gru4rec.training.loop): the untrained level it is measured against, the one
warning that names the epoch and the loss, and no warning for a run that learns.

The references are independent of the code under test: the loss of all-zero scores is log(C)
for a softmax over C columns and log 2 for bpr-max (-log of a sigmoid at 0); the epoch that must
warn is found from the epoch losses in ``history`` with the rule written out here.
"""
from __future__ import annotations

import math
import re
import warnings

import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.config import Config
from gru4rec.datasets.synthetic import generate
from gru4rec.errors import LossExplodedWarning
from gru4rec.training.loop import EXPLOSION_FACTOR, loss_bound, untrained_loss

torch.set_num_threads(1)

SMALL = "layers=16,batch_size=16,n_sample=16,n_epochs=3"


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    return generate(500, 60, seed=1, n_days=12)


def fit(events: pd.DataFrame, params: str) -> tuple[GRU4Rec, list[warnings.WarningMessage]]:
    model = GRU4Rec(f"{SMALL},{params}", device="cpu", threads=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(events, progress=False)
    return model, [w for w in caught if issubclass(w.category, LossExplodedWarning)]


def test_untrained_level_is_the_loss_of_zero_scores(events: pd.DataFrame) -> None:
    # A network initialised at a scale of 1e-6 scores every column ~0: its first step's loss is
    # the loss of a uniform guess, log(16 + 16) for cross-entropy, log 2 for bpr-max.
    for loss, expected in (("cross-entropy", math.log(32)), ("bpr-max", math.log(2))):
        model, caught = fit(events, f"loss={loss},sigma=1e-6,learning_rate=0.05")
        assert model.history[0].first_step_loss == pytest.approx(expected, abs=1e-4)
        assert caught == []
    assert untrained_loss(Config.from_string("loss=cross-entropy,batch_size=128,n_sample=2048")) == pytest.approx(math.log(2176))
    assert untrained_loss(Config.from_string("loss=bpr-max")) == 1.0
    # The bound: three times the larger of the first step's loss and the untrained level.
    bpr = Config.from_string("loss=bpr-max")
    assert EXPLOSION_FACTOR == 3.0
    assert loss_bound(bpr, 0.69) == 3.0 and loss_bound(bpr, 5.0) == 15.0 and loss_bound(bpr, math.nan) == 3.0


@pytest.mark.parametrize("params", [
    "loss=bpr-max,learning_rate=2.0,momentum=0.5,final_act=linear",  # every epoch above the bound: one warning
    "loss=cross-entropy,learning_rate=2.0,momentum=0.5",
])
def test_an_exploding_loss_warns_once_naming_the_epoch_and_the_loss(events: pd.DataFrame, params: str) -> None:
    model, caught = fit(events, params)
    losses = [s.loss for s in model.history]
    bound = 3.0 * max(model.history[0].first_step_loss, math.log(32) if "cross-entropy" in params else 1.0)
    exploded = [i + 1 for i, loss in enumerate(losses) if loss > bound]
    assert exploded and len(model.history) == 3  # training goes on after the warning
    assert len(caught) == 1
    text = str(caught[0].message)
    match = re.search(r"exploded in epoch (\d+): ([0-9.e+]+), above ([0-9.e+]+)", text)
    assert match is not None, text
    epoch = int(match.group(1))
    assert epoch == exploded[0]
    assert float(match.group(2)) == pytest.approx(losses[epoch - 1], rel=1e-5)
    assert float(match.group(3)) == pytest.approx(bound, rel=1e-5)


def test_a_learning_run_does_not_warn(events: pd.DataFrame) -> None:
    for params in ("loss=bpr-max,learning_rate=0.05", "loss=cross-entropy,learning_rate=0.1"):
        model, caught = fit(events, params)
        assert caught == []
        assert model.history[-1].loss < model.history[0].first_step_loss  # it learned
