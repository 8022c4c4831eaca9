"""The plug-in Bayes rule of experiments/intents_limit/plugin.py: with the generator's true
tables it must give the oracle's ranks (gru4rec.datasets.intent_model, an independent
implementation with a sparse T); its posteriors against a brute-force product of likelihoods;
the replayed intents against the data set; EM's objective; and the estimates from much data
against the true tables."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.intents_limit import plugin
from gru4rec.datasets.intents import write_intents

SMALL: dict[str, Any] = {"n_sessions": 1500, "n_items": 200, "n_intents": 8, "intent_size": 30, "seed": 7}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("intents")
    write_intents(out, **SMALL)
    return out


def test_true_tables_give_the_oracles_ranks(small: Path) -> None:
    model, intent, frames, oracle = plugin.load(small)
    truth = plugin.true_tables(model)
    for split, train in (("test", "train_full"), ("train_valid", "train_tr")):
        mine = plugin.ranks(truth, plugin.split_of(frames[split], frames[train], model, intent))
        ref = model.oracle_metrics(frames[split], frames[train]["ItemId"].unique(), return_ranks=True)["ranks"]
        assert len(mine) == len(ref) == oracle[split]["n_predictions"]
        np.testing.assert_array_equal(mine, ref)
        m = plugin.metrics(mine)
        for key in ("recall@20", "mrr@20", "mrr@5"):
            assert m[key] == pytest.approx(oracle[split][key], abs=1e-12)


def test_posteriors_against_brute_force() -> None:
    rng = np.random.default_rng(3)
    N, K = 12, 3
    T = rng.dirichlet(np.ones(N), size=N)
    t = plugin.Tables(rng.dirichlet(np.ones(N)), rng.dirichlet(np.ones(N), size=K), rng.dirichlet(np.ones(K)), T, (0.3, 0.5, 0.2))
    lengths = np.array([1, 4, 2, 6])
    items = rng.integers(0, N, size=lengths.sum())
    offsets = np.r_[0, np.cumsum(lengths)]
    post = plugin.posteriors(t, items, offsets)
    a, b, c = t.mix
    for s in range(len(lengths)):
        x = items[offsets[s]:offsets[s + 1]]
        for e in range(len(x)):
            joint = t.rho * (b * t.phi[:, x[0]] + c * t.pop[x[0]]) / (b + c)
            for i in range(1, e + 1):
                joint = joint * (a * T[x[i - 1], x[i]] + b * t.phi[:, x[i]] + c * t.pop[x[i]])
            np.testing.assert_allclose(post[offsets[s] + e], joint / joint.sum(), rtol=1e-10)


def test_replayed_intents_belong_to_the_sessions(small: Path) -> None:
    model, intent, frames, _ = plugin.load(small)
    full = plugin.split_of(frames["train_full"], frames["train_full"], model, intent)
    # The oracle's posterior after a whole session of 6+ clicks names its intent far above chance (1/8).
    lengths = np.diff(full.offsets)
    post = model.prefix_posteriors(full.items, full.offsets)[full.offsets[1:] - 1]
    long = lengths >= 6
    assert np.mean(post[long].argmax(axis=1) == full.intents[long]) > 0.8


def test_a_changed_generator_is_caught(small: Path, tmp_path: Path) -> None:
    for name in ("train_full", "test", "train_tr", "train_valid"):
        (tmp_path / f"{name}.tsv").write_bytes((small / f"{name}.tsv").read_bytes())
    oracle = json.loads((small / "oracle.json").read_text())
    oracle["params"]["seed"] += 1
    (tmp_path / "oracle.json").write_text(json.dumps(oracle))
    with pytest.raises(ValueError, match="train_full.tsv"):
        plugin.load(tmp_path)


def test_em_never_lowers_its_objective(small: Path) -> None:
    model, intent, frames, _ = plugin.load(small)
    fit = plugin.split_of(frames["train_tr"], frames["train_tr"], model, intent)
    for latent in (False, True):
        _, hist = plugin.fit_tables(fit, model.n_items, model.n_intents, (1e-3, 1e-2, 0.5), latent=latent, n_iter=12)
        steps = np.diff(hist)
        assert np.all(steps >= -1e-9 * np.abs(hist[1:])), (latent, steps)
        assert hist[-1] > hist[0]


def test_much_data_recovers_the_tables(tmp_path: Path) -> None:
    write_intents(tmp_path, n_sessions=20_000, n_items=200, n_intents=3, intent_size=20, n_successors=3, seed=5)
    model, intent, frames, oracle = plugin.load(tmp_path)
    fit = plugin.split_of(frames["train_full"], frames["train_full"], model, intent)
    t, _ = plugin.fit_tables(fit, model.n_items, model.n_intents, (1e-3, 1e-3, 0.5), mix=model.mix, n_successors=3, n_iter=30)
    # Total variation from the truth (pop and the phi_k overlap, so they are told apart only roughly).
    assert 0.5 * np.abs(t.pop - model.pop).sum() < 0.1
    assert np.max(0.5 * np.abs(t.phi - model.phi).sum(axis=1)) < 0.15
    # ... and then predicts nearly as well as the oracle; tables with the wrong items do not.
    test = plugin.split_of(frames["test"], frames["train_full"], model, intent)
    assert plugin.metrics(plugin.ranks(t, test))["mrr@5"] > 0.97 * oracle["test"]["mrr@5"]
    shuffled = t.phi[:, np.random.default_rng(0).permutation(model.n_items)]
    wrong = plugin.Tables(t.pop, shuffled, t.rho, t.T, t.mix)
    assert plugin.metrics(plugin.ranks(wrong, test))["mrr@5"] < 0.9 * oracle["test"]["mrr@5"]
