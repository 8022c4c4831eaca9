"""Baselines through the common evaluator, against closed forms and per-event brute force."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec.baselines import ItemKNN, Pop, SessionPop, item_similarities
from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.evaluation.evaluator import evaluate

torch.set_num_threads(1)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def events(sessions: list[list[str]], start_id: int = 1) -> pd.DataFrame:
    rows = [(start_id + s, it, 10 * s + p) for s, sess in enumerate(sessions) for p, it in enumerate(sess)]
    return pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])


TRAIN = [
    ["a", "b", "c"],
    ["a", "b"],
    ["b", "c", "d", "b"],
    ["c", "a"],
    ["e", "a", "b"],
    ["d"],
]
TEST = [["a", "b", "c"], ["b", "z", "a", "b"], ["c", "d"], ["e"], ["d", "b", "d", "e"]]


def test_pop_ranks_are_the_closed_form() -> None:
    pop = Pop().fit(events(TRAIN))
    counts = Counter(it for s in TRAIN for it in s)
    ids = list(pop.item_map.ids)
    np.testing.assert_array_equal(pop.item_support, [counts[i] for i in ids])
    supp = pop.item_support
    targets = [s[j] for s in TEST for j in range(1, len(s)) if s[j] != "z"]
    # "z" is unknown: session 2 becomes b, a, b (2 predictions); ["e"] has none.
    assert targets == ["b", "c", "a", "b", "d", "b", "d", "e"]
    t = supp[pop.item_map.index_of(targets)]
    ref = {
        "standard": (supp[None, :] > t[:, None]).sum(1) + 1.0,
        "conservative": (supp[None, :] >= t[:, None]).sum(1) * 1.0,
    }
    ref["median"] = (ref["standard"] + ref["conservative"]) / 2
    for mode, r in ref.items():
        res = evaluate(pop, events(TEST, 100), cutoffs=(1, 2, 5), mode=mode, batch_size=2, return_ranks=True)
        # Ranks come in session order; session order here is by start time = the list order.
        np.testing.assert_array_equal(res.ranks, r)
        assert res.n_dropped_events == 1 and res.n_predictions == 8
        assert res.recall[2] == pytest.approx(np.mean(r <= 2))
    # Everyone gets the same list: coverage@c = c/N; popularity@1 = 1 (the top item).
    res = evaluate(pop, events(TEST, 100), cutoffs=(1, 2))
    assert res.coverage[2] == pytest.approx(2 / len(ids))
    assert res.popularity[1] == 1.0


def test_sessionpop_matches_brute_force() -> None:
    sp = SessionPop().fit(events(TRAIN))
    supp = sp.item_support.astype(np.float64)
    tb = supp / (supp.max() + 1)
    N = len(supp)
    ranks = []
    for s in TEST:
        idx = [int(i) for i in sp.item_map.index_of(s) if i >= 0]
        counts = np.zeros(N)
        for j in range(len(idx) - 1):
            counts[idx[j]] += 1
            sc = (counts + tb).astype(np.float32)
            srt = np.sort(sc)[::-1]
            ranks.append(np.flatnonzero(srt == sc[idx[j + 1]])[-1] + 1.0)
    res = evaluate(sp, events(TEST, 100), cutoffs=(1, 3), mode="conservative", batch_size=2, return_ranks=True)
    np.testing.assert_array_equal(res.ranks, ranks)
    # b, a, b: after b, a the target b was seen once -> rank 1 (ties with a, but a is less popular).
    assert ranks[3] == 1.0


def test_item_similarities_brute_force() -> None:
    rng = np.random.default_rng(0)
    N = 12
    lengths = rng.integers(1, 7, size=40)
    offsets = np.r_[0, np.cumsum(lengths)]
    items = rng.integers(0, N, size=offsets[-1])
    lmbd, alpha, K = 2.0, 0.3, 4
    idx, sim = item_similarities(items, offsets, N, n_neighbors=K, lmbd=lmbd, alpha=alpha)
    sets = [set(items[offsets[s]:offsets[s + 1]].tolist()) for s in range(len(lengths))]
    n = [sum(i in st for st in sets) for i in range(N)]
    for i in range(N):
        full = {}
        for j in range(N):
            c = sum(i in st and j in st for st in sets)
            if j != i and c:
                full[j] = c / ((n[i] + lmbd) ** alpha * (n[j] + lmbd) ** (1 - alpha))
        best = sorted(full.items(), key=lambda kv: (-kv[1], kv[0]))[:K]
        got = [(int(j), float(v)) for j, v in zip(idx[i], sim[i]) if v > 0]
        assert [j for j, _ in got] == [j for j, _ in best]
        np.testing.assert_allclose([v for _, v in got], [v for _, v in best], rtol=1e-12)
        assert all(j == i for j, v in zip(idx[i], sim[i]) if v == 0)  # padding


def test_itemknn_evaluates_like_brute_force() -> None:
    knn = ItemKNN(n_neighbors=2, lmbd=1.0).fit(events(TRAIN))
    N = len(knn.item_map)
    idx, sim = knn.neighbours.numpy(), knn.similarities.numpy()
    ranks = []
    for s in TEST:
        ix = [int(i) for i in knn.item_map.index_of(s) if i >= 0]
        for j in range(len(ix) - 1):
            sc = np.zeros(N, dtype=np.float32)
            for nb, v in zip(idx[ix[j]], sim[ix[j]]):
                if v > 0:
                    sc[nb] = v
            t = sc[ix[j + 1]]
            ranks.append(float((sc > t).sum() + 1))
    res = evaluate(knn, events(TEST, 100), cutoffs=(1, 2), mode="standard", batch_size=3, return_ranks=True)
    np.testing.assert_array_equal(res.ranks, ranks)


def test_baseline_errors(tmp_path) -> None:
    with pytest.raises(Gru4RecError, match="not fitted"):
        evaluate(Pop(), events(TEST))
    with pytest.raises(DataError, match="expected a DataFrame or a path"):
        Pop().fit([["a", "b"]])
    with pytest.raises(DataError, match="not found"):
        SessionPop().fit(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match="ItemId"):
        Pop().fit(events(TRAIN).drop(columns="ItemId"))
    with pytest.raises(ConfigError, match="n_neighbors.*lmbd.*alpha"):
        ItemKNN(n_neighbors=0, lmbd=-1.0, alpha=2.0)
    with pytest.raises(Gru4RecError, match="device"):
        Pop(device="nonsense")


def test_custom_column_keys_from_a_file(tmp_path) -> None:
    path = tmp_path / "train.tsv"
    events(TRAIN).rename(columns={"SessionId": "s", "ItemId": "i", "Time": "t"}).to_csv(path, sep="\t", index=False)
    pop = Pop(session_key="s", item_key="i", time_key="t").fit(path)
    test = events(TEST, 100).rename(columns={"SessionId": "s", "ItemId": "i", "Time": "t"})
    a = evaluate(pop, test, cutoffs=(2,))
    b = evaluate(Pop().fit(events(TRAIN)), events(TEST, 100), cutoffs=(2,))
    assert a.recall == b.recall and a.mrr == b.mrr


def test_pop_on_real_data_matches_closed_form() -> None:
    d = DATA / "rsc15_100k"
    if not (d / "train_full.tsv").exists():
        pytest.skip(f"real data not found at {d}")
    pop = Pop().fit(d / "train_full.tsv")
    from gru4rec.data import read_events, sessions_from_events

    test = read_events(d / "test.tsv")
    sess, dropped = sessions_from_events(test, pop.item_map, drop_unknown=True)
    targets = np.concatenate(
        [sess.items[a + 1:b] for a, b in zip(sess.offsets[:-1], sess.offsets[1:]) if b - a >= 2]
    )
    supp = pop.item_support
    t = supp[targets]
    order = np.sort(supp)
    std = len(supp) - np.searchsorted(order, t, side="right") + 1.0
    con = len(supp) - np.searchsorted(order, t, side="left") * 1.0
    for mode, r in (("standard", std), ("conservative", con)):
        res = evaluate(pop, test, cutoffs=(1, 20), mode=mode, return_ranks=True)
        np.testing.assert_array_equal(res.ranks, r)
        assert res.n_dropped_events == dropped
        assert res.recall[20] == pytest.approx(np.mean(r <= 20))
        assert res.mrr[20] == pytest.approx(np.mean(np.where(r <= 20, 1 / r, 0)))
