"""Validation during training and early stopping (``fit(valid=..., early_stop=...)``).

The data set is made so that the validation metric peaks early: training sessions mostly walk
to the next item id (i -> i+1), validation sessions jump by popularity only. The model first
learns popularity, which helps on validation, then the walk, which does not: MRR@20 on
validation rises for two epochs and falls after that.
"""
from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.fitting.validation import Validator, parse_metric

torch.set_num_threads(1)

PARAMS = "layers=16,batch_size=16,n_sample=32,n_epochs=8,sample_store_size=320,learning_rate=0.006"


def walks(n_sessions: int, p_next: float, seed: int, n_items: int = 100, length: int = 6) -> pd.DataFrame:
    """Sessions that go to item i+1 with probability ``p_next``, else to an item drawn by a
    1/rank popularity."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, n_items + 1)
    pop /= pop.sum()
    rows = []
    for s in range(n_sessions):
        cur = int(rng.choice(n_items, p=pop))
        for t in range(length):
            rows.append((s, cur, t))
            cur = (cur + 1) % n_items if rng.random() < p_next else int(rng.choice(n_items, p=pop))
    return pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])


@pytest.fixture(scope="module")
def data() -> tuple[pd.DataFrame, pd.DataFrame]:
    return walks(500, 0.8, seed=1), walks(150, 0.0, seed=2)


def same_weights(a: GRU4Rec, b: GRU4Rec) -> bool:
    sa, sb = a.net.state_dict(), b.net.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_early_stopping_keeps_the_weights_of_the_best_epoch(data: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    train, valid = data
    infos = []
    model = GRU4Rec(PARAMS, device="cpu").fit(
        train, valid=valid, early_stop=2, metric="mrr@20", valid_cutoffs=(5, 20), callback=infos.append, progress=False
    )
    mrr = [h["mrr@20"] for h in model.valid_history]
    best = int(np.argmax(mrr)) + 1
    assert 1 < best < 8, mrr  # the data set peaks early, not at the first or the last epoch
    assert model.best_epoch == best
    assert len(mrr) == best + 2  # stopped after two epochs without improvement
    assert [i.epoch for i in infos] == list(range(1, best + 3))
    assert [i.best_epoch for i in infos][-1] == best and infos[-1].valid["mrr@20"] == mrr[-1]
    assert set(infos[0].valid) == {"recall@5", "recall@20", "mrr@5", "mrr@20", "ndcg@5", "ndcg@20"}
    assert all(i.peak_host_mb > 0 and i.peak_device_mb is None for i in infos)
    # The kept weights are exactly those of a run trained for the best number of epochs.
    reference = GRU4Rec(PARAMS.replace("n_epochs=8", f"n_epochs={best}"), device="cpu").fit(train, progress=False)
    assert same_weights(model, reference)
    assert model.epochs_trained == best
    again = evaluate(model, valid, cutoffs=(20,))
    assert again.mrr[20] == pytest.approx(mrr[best - 1], abs=1e-12)
    assert not same_weights(model, GRU4Rec(PARAMS.replace("n_epochs=8", f"n_epochs={best + 2}"), device="cpu").fit(train, progress=False))


def test_validation_without_early_stopping_keeps_the_last_epoch(data: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    train, valid = data
    params = PARAMS.replace("n_epochs=8", "n_epochs=3")
    model = GRU4Rec(params, device="cpu").fit(train, valid=valid, metric="mrr@20", progress=False)
    assert len(model.valid_history) == 3 and model.epochs_trained == 3
    assert same_weights(model, GRU4Rec(params, device="cpu").fit(train, progress=False))
    # The recorded metric is that of an evaluation of the model after that epoch.
    assert model.valid_history[-1]["recall@20"] == pytest.approx(evaluate(model, valid, cutoffs=(20,)).recall[20], abs=1e-12)


def test_a_killed_run_with_early_stopping_resumes_to_the_same_model(data: tuple[pd.DataFrame, pd.DataFrame], tmp_path) -> None:
    train, valid = data
    whole = GRU4Rec(PARAMS, device="cpu").fit(train, valid=valid, early_stop=2, metric="mrr@20", progress=False)

    class Killed(Exception):
        pass

    def kill_after_three(info) -> None:
        if info.epoch == 3:
            raise Killed

    with pytest.raises(Killed):
        GRU4Rec(PARAMS, device="cpu").fit(train, valid=valid, early_stop=2, metric="mrr@20", checkpoint_dir=tmp_path,
                                          callback=kill_after_three, progress=False)
    resumed = GRU4Rec(PARAMS, device="cpu").fit(train, valid=valid, early_stop=2, metric="mrr@20", checkpoint_dir=tmp_path,
                                                resume=True, keep_checkpoint=True, progress=False)
    assert resumed.best_epoch == whole.best_epoch
    assert resumed.valid_history == whole.valid_history
    assert same_weights(resumed, whole)
    # Resuming a run that already stopped early trains no further epoch.
    seen = []
    again = GRU4Rec(PARAMS, device="cpu").fit(train, valid=valid, early_stop=2, metric="mrr@20", checkpoint_dir=tmp_path,
                                              resume=True, keep_checkpoint=True, callback=seen.append, progress=False)
    assert seen == [] and same_weights(again, whole)
    with pytest.raises(Gru4RecError, match="validating on mrr@20"):
        GRU4Rec(PARAMS, device="cpu").fit(train, valid=valid, early_stop=2, metric="recall@20", checkpoint_dir=tmp_path,
                                          resume=True, progress=False)


def fake_model() -> types.SimpleNamespace:
    """A stand-in model whose net has one weight that the test sets per epoch."""
    return types.SimpleNamespace(net=torch.nn.Linear(1, 1, bias=False), device=torch.device("cpu"))


@pytest.mark.parametrize(
    "values, patience, stops_after, best",
    [
        ([0.1, 0.3, 0.3, 0.2, 0.5], 2, 4, 2),  # a tie is no improvement
        ([0.1, 0.3, 0.3, 0.2, 0.5], 3, None, 5),
        ([0.5, float("nan"), 0.4], 2, 3, 1),  # a NaN metric never improves
        ([0.1, 0.2, 0.3], 1, None, 3),
    ],
)
def test_the_stopping_rule(monkeypatch: pytest.MonkeyPatch, values: list[float], patience: int, stops_after: int | None, best: int) -> None:
    model = fake_model()
    sessions = types.SimpleNamespace(lengths=np.array([3, 2]))
    it = iter(values)
    monkeypatch.setattr(
        "gru4rec.fitting.validation.evaluate",
        lambda *a, **k: types.SimpleNamespace(recall={20: 0.0}, mrr={20: next(it)}, ndcg={20: 0.0}, seconds=0.0),
    )
    v = Validator(model, sessions, metric="mrr@20", patience=patience)
    stopped = None
    for epoch in range(1, len(values) + 1):
        with torch.no_grad():
            model.net.weight.fill_(epoch)
        v.after_epoch(epoch)
        if v.should_stop:
            stopped = epoch
            break
    assert stopped == stops_after and v.best_epoch == best
    v.finish()
    assert float(model.net.weight.detach()) == best  # the best epoch's weight is back


def test_metric_names() -> None:
    assert parse_metric("MRR@10").key == "mrr@10" and parse_metric(" recall @ 20 ").cutoff == 20
    for bad in ("precision@20", "mrr", "mrr@0", "mrr@x", ""):
        with pytest.raises(ConfigError, match="metric"):
            parse_metric(bad)


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"early_stop": 2}, Gru4RecError, "early_stop needs valid"),
        ({"valid": "VALID", "early_stop": 0}, ConfigError, "early_stop"),
        ({"valid": "VALID", "metric": "hits@20"}, ConfigError, "metric"),
        ({"valid": "UNKNOWN"}, DataError, "no validation session"),
        ({"valid": "MISSING"}, Gru4RecError, "does-not-exist"),
    ],
)
def test_bad_validation_arguments_fail_before_training(
    data: tuple[pd.DataFrame, pd.DataFrame], kwargs: dict, error: type, fragment: str, tmp_path
) -> None:
    train, valid = data
    stand_in = {"VALID": valid, "UNKNOWN": valid.assign(ItemId=valid["ItemId"] + 10_000), "MISSING": tmp_path / "does-not-exist.tsv"}
    if "valid" in kwargs:
        kwargs = {**kwargs, "valid": stand_in[kwargs["valid"]]}
    seen = []
    with pytest.raises((error, FileNotFoundError), match=fragment):
        GRU4Rec(PARAMS, device="cpu").fit(train, callback=seen.append, progress=False, **kwargs)
    assert seen == []
