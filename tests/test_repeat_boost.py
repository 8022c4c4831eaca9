"""Repeat-aware scoring (gru4rec.inference.repeat): the boost's formula against NumPy, and the
same boosted scores in every place that ranks items — the evaluator's device-side histories,
the engine's recommendations and its served sessions — against brute force on the model's
scores; the one-pass grid against separate evaluations; a boosted model shares its weights."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.config import Config
from gru4rec.datasets.synthetic import generate
from gru4rec.errors import ConfigError
from gru4rec.evaluation import evaluate_boosts
from gru4rec.fitting.repeat_fit import fit_repeat_boost
from gru4rec.inference import Clicks, Engine, Work
from gru4rec.inference.repeat import RepeatBoost, SlotHistory


def numpy_boost(scores: np.ndarray, history: np.ndarray, weight: float, decay: float) -> np.ndarray:
    """The definition: + weight · std(scores) · Σ_{j: x_j = i} decay^(n − j), clicks x_1..x_n."""
    out = scores.astype(np.float64).copy()
    sigma = scores.astype(np.float64).std(ddof=1)
    n = len(history)
    for j, item in enumerate(history, start=1):
        out[item] += weight * sigma * decay ** (n - j)
    return out


def test_boost_formula() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(3, 40)).astype(np.float32)
    histories = [np.array([5, 7, 5, 9]), np.zeros(0, np.int64), np.array([39])]
    got = RepeatBoost(0.7, 0.5).apply(torch.from_numpy(scores.copy()), Clicks.of_rows(histories)).numpy()
    for row, h in enumerate(histories):
        np.testing.assert_allclose(got[row], numpy_boost(scores[row], h, 0.7, 0.5), rtol=1e-5, atol=1e-5)
    untouched = torch.from_numpy(scores.copy())
    assert torch.equal(RepeatBoost().apply(untouched, Clicks.of_rows(histories)), torch.from_numpy(scores))
    with pytest.raises(ValueError, match="repeat_decay"):
        RepeatBoost(1.0, 1.5)
    with pytest.raises(ConfigError, match="repeat_weight.*\n.*repeat_decay"):
        Config(repeat_weight=-0.1, repeat_decay=1.01)


@pytest.fixture(scope="module")
def trained():
    events = generate(n_sessions=300, n_items=80, seed=5)
    model = GRU4Rec("layers=16,n_epochs=2,batch_size=16,n_sample=16,sample_store_size=500", device="cpu").fit(events, progress=False)
    return model, events


def _sessions(model, events, n=30):
    c = model.config
    ev = events.sort_values([c.session_key, c.time_key], kind="stable")
    groups = [g for _, g in ev.groupby(c.session_key, sort=True)][-n:]
    return [model.item_map.index_of(g[c.item_key]) for g in groups], ev[ev[c.session_key].isin([g[c.session_key].iloc[0] for g in groups])]


def test_evaluator_ranks_boosted_scores(trained) -> None:
    model, events = trained
    sessions, test = _sessions(model, events)
    result = evaluate(model.with_repeat_boost(1.5, 0.6), test, cutoffs=(5,), mode="conservative", return_ranks=True, batch_size=4)
    plain = evaluate(model, test, cutoffs=(5,), mode="conservative", return_ranks=True, batch_size=4)
    low, high = [], []
    ids = model.item_map.ids
    for s in sessions:
        for j in range(1, len(s)):
            raw = model.score_sessions([ids[s[:j]].tolist()])[0]
            scores = numpy_boost(raw, s[:j], 1.5, 0.6)
            t, eps = scores[s[j]], 1e-4 * max(1.0, abs(scores[s[j]]))
            low.append((scores >= t + eps).sum() + 1)
            high.append((scores >= t - eps).sum())
    assert len(result.ranks) == len(low)
    assert np.all((np.asarray(low) <= result.ranks) & (result.ranks <= np.asarray(high)))
    assert not np.array_equal(result.ranks, plain.ranks)  # the boost changed something


def test_recommendations_and_served_sessions_rank_boosted_scores(trained) -> None:
    model, events = trained
    sessions, _ = _sessions(model, events, 12)
    ids = model.item_map.ids
    boosted = model.with_repeat_boost(2.0, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recs = boosted.recommend_batch([ids[s].tolist() for s in sessions], k=6)
    engine = Engine(boosted, scoring="float32")
    served = engine.run([Work(None, s[:-1], 6) for s in sessions])
    served = engine.run([Work(a.state, s[-1:], 6) for a, s in zip(served, sessions)])
    for s, rec, answer in zip(sessions, recs, served):
        raw = model.score_sessions([ids[s].tolist()])[0]
        scores = numpy_boost(raw, s, 2.0, 0.5)
        want = np.sort(scores)[::-1][:6]
        np.testing.assert_allclose(np.sort(scores[model.item_map.index_of(rec.item_ids)])[::-1], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(rec.scores, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(answer.scores, want, rtol=1e-4, atol=1e-4)


def test_fit_picks_the_best_grid_point(trained) -> None:
    model, events = trained
    _, valid = _sessions(model, events, 60)
    before = model.config
    best, table = fit_repeat_boost(model, valid, weights=(0.5, 3.0), decays=(0.5, 1.0), metric="mrr@10")
    assert model.config == before  # restored
    assert [(row["weight"], row["decay"]) for row in table] == [(0.0, 1.0), (0.5, 0.5), (0.5, 1.0), (3.0, 0.5), (3.0, 1.0)]
    for row in table[1:2]:
        boosted = model.with_repeat_boost(row["weight"], row["decay"])
        assert evaluate(boosted, valid, cutoffs=(10,), mode="conservative").mrr[10] == pytest.approx(row["mrr@10"], abs=1e-12)
    top = max(table, key=lambda row: row["mrr@10"])
    assert (best.weight, best.decay) == (top["weight"], top["decay"])


def test_evaluate_command_sets_fits_and_saves_the_boost(trained, tmp_path, capsys) -> None:
    from gru4rec.cli import main

    model, events = trained
    _, test = _sessions(model, events, 40)
    _, valid = _sessions(model, events, 80)
    # Every validation session ends by going back to its first item: the boost must pay there.
    c = model.config
    first = valid.groupby(c.session_key).head(1).copy()
    first[c.time_key] = valid.groupby(c.session_key)[c.time_key].max().loc[first[c.session_key]].to_numpy() + 1
    valid = pd.concat([valid, first], ignore_index=True)
    paths = {name: tmp_path / f"{name}.tsv" for name in ("test", "valid")}
    test.to_csv(paths["test"], sep="\t", index=False)
    valid.to_csv(paths["valid"], sep="\t", index=False)
    model.save(tmp_path / "m.safetensors")

    def recall_mrr(argv):
        assert main(argv) == 0
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Recall@10")][0].split()
        return float(line[1]), float(line[3])

    base = ["evaluate", str(tmp_path / "m.safetensors"), "-t", str(paths["test"]), "-m", "10", "-e", "conservative", "-d", "cpu"]
    got = recall_mrr(base + ["--repeat-weight", "2", "--repeat-decay", "0.5"])
    want = evaluate(model.with_repeat_boost(2.0, 0.5), paths["test"], cutoffs=(10,), mode="conservative")
    assert got == (round(want.recall[10], 6), round(want.mrr[10], 6))

    recall_mrr(base + ["--fit-repeat", str(paths["valid"]), "--save", str(tmp_path / "boosted.safetensors")])
    best, _ = fit_repeat_boost(model, paths["valid"], metric="mrr@10", mode="conservative")
    saved = GRU4Rec.load(tmp_path / "boosted.safetensors", device="cpu").config
    assert (saved.repeat_weight, saved.repeat_decay) == (best.weight, best.decay) and best.weight > 0


@pytest.mark.parametrize("mode", ["standard", "conservative"])
def test_one_pass_over_a_grid_equals_separate_evaluations(trained, mode) -> None:
    """evaluate_boosts (the network run once, every boost ranked from the same scores and taken
    off again) gives exactly the evaluation of each boosted model: every metric, every cutoff,
    coverage and popularity too; small batches so that slots restart sessions."""
    model, events = trained
    _, valid = _sessions(model, events, 50)
    boosts = [RepeatBoost(), RepeatBoost(0.5, 0.3), RepeatBoost(3.0, 1.0), RepeatBoost(), RepeatBoost(8.0, 0.0)]
    together = evaluate_boosts(model, valid, boosts, cutoffs=(1, 5, 10), mode=mode, batch_size=3, beyond_accuracy=True)
    assert len(together) == len(boosts)
    for boost, got in zip(boosts, together):
        alone = evaluate(model.with_repeat_boost(boost.weight, boost.decay), valid, cutoffs=(1, 5, 10), mode=mode, batch_size=3)
        for table in ("recall", "mrr", "ndcg", "coverage", "popularity"):
            assert getattr(got, table) == getattr(alone, table), (boost, table)
        assert got.n_predictions == alone.n_predictions
    assert together[1].mrr != together[0].mrr and together[0].mrr == together[3].mrr


def test_slot_history_boost_equals_the_definition() -> None:
    """The evaluator's fixed-shape history (slots restarting sessions, a tail where only the
    first slots step) boosts exactly as the definition over each slot's clicks of its session."""
    rng = np.random.default_rng(1)
    B, N, W = 3, 30, 6
    history = SlotHistory(B, W, torch.device("cpu"))
    clicks: list[list[int]] = [[] for _ in range(B)]
    boost = RepeatBoost(1.3, 0.4)
    for step in range(12):
        A = B if step < 9 else 2
        items = rng.integers(0, N, A)
        reset = rng.random(A) < 0.4 if step else None
        for b in range(A):
            if reset is not None and reset[b] or len(clicks[b]) == W:
                clicks[b] = []
                if reset is not None:
                    reset[b] = True  # a session never outgrows the history
            clicks[b].append(int(items[b]))
        history.add(torch.from_numpy(items), None if reset is None else torch.from_numpy(reset))
        scores = rng.normal(size=(A, N)).astype(np.float32)
        got = boost.add(torch.from_numpy(scores.copy()), *history.clicks(A)).numpy()
        for b in range(A):
            np.testing.assert_allclose(got[b], numpy_boost(scores[b], np.array(clicks[b], dtype=np.int64), 1.3, 0.4),
                                       rtol=1e-5, atol=1e-5)


def test_a_boosted_model_shares_the_weights_and_leaves_the_model_as_it_was(trained, tmp_path) -> None:
    model, _ = trained
    before = model.config
    boosted = model.with_repeat_boost(2.5, 0.7)
    assert model.config == before and model.repeat_boost == RepeatBoost()
    assert boosted.repeat_boost == RepeatBoost(2.5, 0.7)
    assert boosted.config == before.replace(repeat_weight=2.5, repeat_decay=0.7)
    assert boosted.net is model.net and boosted.item_map is model.item_map and boosted.item_support is model.item_support
    assert boosted.engine() is not model.engine()
    boosted.save(tmp_path / "b.safetensors")
    assert GRU4Rec.load(tmp_path / "b.safetensors", device="cpu").repeat_boost == RepeatBoost(2.5, 0.7)
    with pytest.raises(ConfigError, match="repeat_decay"):
        model.with_repeat_boost(1.0, 1.5)


def test_fit_repeat_that_chooses_no_boost_says_so(trained, tmp_path, capsys) -> None:
    from gru4rec.cli import main

    model, events = trained
    c = model.config
    # Validation sessions without a repeated item: a boost can only lower the targets' ranks.
    valid = _sessions(model, events, 60)[1].drop_duplicates([c.session_key, c.item_key])
    valid[c.session_key] += 10**6  # other sessions than the training ones
    paths = {"valid": tmp_path / "valid.tsv", "test": tmp_path / "test.tsv", "model": tmp_path / "m.safetensors"}
    valid.to_csv(paths["valid"], sep="\t", index=False)
    _sessions(model, events, 20)[1].to_csv(paths["test"], sep="\t", index=False)
    model.save(paths["model"])
    out = tmp_path / "boosted.safetensors"
    base = ["evaluate", str(paths["model"]), "-t", str(paths["test"]), "-m", "10", "-e", "conservative", "-d", "cpu",
            "--fit-repeat", str(paths["valid"])]
    assert main(base + ["--save", str(out)]) == 0
    err = capsys.readouterr().err
    plain = evaluate(model, paths["valid"], cutoffs=(10,), mode="conservative").mrr[10]
    assert "the grid point with the best MRR@10 (conservative ties) (--fit-metric)" in err
    assert f"No boost helps on {paths['valid']}: every repeat_weight > 0 gives a lower MRR@10 (conservative ties) than {plain:.6f}" in err
    assert f"No boost helps on {paths['valid']}: the model is saved unchanged to {out}" in err
    assert "with its repeat boost" not in err
    assert GRU4Rec.load(out, device="cpu").config.repeat_weight == 0.0
    # Another metric and cutoff on request.
    assert main(base + ["--fit-metric", "recall@5"]) == 0
    err = capsys.readouterr().err
    assert "the grid point with the best Recall@5 (conservative ties)" in err and "Recall@5 " in err
    assert main(base[:-2] + ["--fit-metric", "recall@5"]) == 2
    assert "--fit-metric needs --fit-repeat VALID" in capsys.readouterr().err
    assert main(base + ["--fit-metric", "hits@5"]) == 2
    assert "--fit-metric: metric: expected recall@K, mrr@K or ndcg@K" in capsys.readouterr().err
