"""Evaluation breakdowns by session length and by target-popularity decile, checked against a
brute-force count: every prediction ranked one at a time with its own forward pass, its groups
found with plain Python loops, the counts and metrics summed by hand."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.datasets.synthetic import generate
from gru4rec.evaluation.breakdown import (
    LENGTH_EDGES,
    compute_breakdown,
    popularity_deciles,
)

torch.set_num_threads(1)

CUTOFFS = (1, 5, 10)


@pytest.fixture(scope="module")
def model_and_test() -> tuple[GRU4Rec, pd.DataFrame]:
    events = generate(n_sessions=500, n_items=80, seed=5, mean_length=6.0)
    ids = events["SessionId"].unique()
    train = events[events["SessionId"].isin(ids[:400])]
    test = events[events["SessionId"].isin(ids[400:])].copy()
    # Items the model never saw: dropped before the sessions are formed (a session A, X, B
    # predicts B from A), which changes the session lengths the breakdown uses.
    extra = test.iloc[::7].copy()
    extra["ItemId"] = -1 - np.arange(len(extra))
    extra["Time"] = extra["Time"] + 1
    test = pd.concat([test, extra], ignore_index=True)
    model = GRU4Rec("layers=12,batch_size=16,n_sample=32,n_epochs=2,sample_store_size=320", device="cpu").fit(train, progress=False)
    return model, test


def brute_force(model: GRU4Rec, test: pd.DataFrame, mode: str) -> dict[str, dict[str, list]]:
    """Counts, hits and reciprocal ranks per group, one prediction at a time."""
    index = {item: i for i, item in enumerate(model.item_map.to_list())}
    support = [int(s) for s in model.item_support]
    n = len(support)

    def decile(item: int) -> int:
        larger = sum(1 for s in support if s > support[item])
        return 1 + (10 * larger) // n

    def length_group(length: int) -> int:
        group = 0
        for g, lo in enumerate(LENGTH_EDGES):
            if length >= lo:
                group = g
        return group

    out = {
        "session_length": {
            "n": [0] * len(LENGTH_EDGES),
            "hits": [[0] * len(LENGTH_EDGES) for _ in CUTOFFS],
            "rr": [[0.0] * len(LENGTH_EDGES) for _ in CUTOFFS],
        },
        "popularity": {"n": [0] * 10, "hits": [[0] * 10 for _ in CUTOFFS], "rr": [[0.0] * 10 for _ in CUTOFFS]},
    }
    net = model.net
    test = test.sort_values(["SessionId", "Time"], kind="stable")
    with torch.no_grad():
        for _, items in test.groupby("SessionId", sort=False)["ItemId"]:
            known = [index[i] for i in items if i in index]
            hidden = net.init_hidden(1)
            for prev, target in zip(known[:-1], known[1:]):
                scores = net.score_all(net.step(torch.tensor([prev]), hidden))[0].double().numpy()
                t = scores[target]
                higher, equal = int((scores > t).sum()), int((scores == t).sum())
                rank = higher + 1 if mode == "standard" else higher + equal
                for kind, g in (("session_length", length_group(len(known))), ("popularity", decile(target) - 1)):
                    out[kind]["n"][g] += 1
                    for k, c in enumerate(CUTOFFS):
                        if rank <= c:
                            out[kind]["hits"][k][g] += 1
                            out[kind]["rr"][k][g] += 1.0 / rank
    return out


def test_deciles_of_a_hand_made_catalogue() -> None:
    # 10 items: two with support 10 (positions 1-2), three with 5 (3-5), five with 1 (6-10).
    support = np.array([5, 10, 1, 5, 1, 10, 1, 1, 5, 1])
    assert popularity_deciles(support).tolist() == [3, 1, 6, 3, 6, 1, 6, 6, 3, 6]
    # 20 distinct supports: two items per decile, the most popular in decile 1.
    assert popularity_deciles(np.arange(20, 0, -1)).tolist() == [d for d in range(1, 11) for _ in range(2)]


def test_groups_of_a_hand_made_evaluation() -> None:
    # Sessions of lengths 2, 3 and 12 (ranks given): 1 + 2 + 11 = 14 predictions.
    items = np.array([0, 1, 2, 3, 0] + [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3])
    offsets = np.array([0, 2, 5, 17])
    ranks = np.array([1.0, 2.0, 30.0] + [1.0] * 5 + [4.0] * 6)
    support = np.array([40, 30, 20, 10])  # each item its own popularity; 4 items: deciles 1, 3, 6, 8
    b = compute_breakdown(ranks, items, offsets, support, (1, 5))
    by_label = {g.label: g for g in b.session_length}
    assert [g.label for g in b.session_length] == ["2", "3", "4", "5", "6-10", "11-20", "21+"]
    assert by_label["2"].n_predictions == 1 and by_label["2"].recall[1] == 1.0
    assert by_label["3"].n_predictions == 2 and by_label["3"].recall[5] == 0.5 and by_label["3"].mrr[5] == 0.25
    assert by_label["11-20"].n_predictions == 11
    assert by_label["11-20"].recall[1] == pytest.approx(5 / 11) and by_label["11-20"].mrr[5] == pytest.approx((5 + 6 / 4) / 11)
    assert by_label["4"].n_predictions == 0 and by_label["4"].recall[1] is None
    pops = {g.label: g for g in b.popularity}
    assert [pops[d].info.get("n_items") for d in map(str, range(1, 11))] == [1, 0, 1, 0, 0, 1, 0, 1, 0, 0]
    # Targets: 1 | 3, 0 | 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3 -> item 0 (decile 1) 3 times, item 1 (decile 3) 4 times.
    assert [pops[d].n_predictions for d in ("1", "3", "6", "8")] == [3, 4, 3, 4]
    assert pops["1"].recall[1] == pytest.approx(1 / 3)  # ranks 30 (2nd session), 1, 4
    assert sum(g.n_predictions for g in b.popularity) == 14 == sum(g.n_predictions for g in b.session_length)


@pytest.mark.parametrize("mode", ["standard", "conservative"])
def test_breakdown_equals_a_brute_force_count(model_and_test: tuple[GRU4Rec, pd.DataFrame], mode: str) -> None:
    model, test = model_and_test
    result = evaluate(model, test, cutoffs=CUTOFFS, mode=mode, breakdown=True)
    assert result.ranks is None  # breakdown alone does not hand out the ranks
    assert result.n_dropped_events > 0
    want = brute_force(model, test, mode)
    got = {"session_length": result.breakdown.session_length, "popularity": result.breakdown.popularity}
    for kind, groups in got.items():
        assert [g.n_predictions for g in groups] == want[kind]["n"], kind
        assert sum(want[kind]["n"]) == result.n_predictions
        for g, group in enumerate(groups):
            n = want[kind]["n"][g]
            for k, c in enumerate(CUTOFFS):
                if n == 0:
                    assert group.recall[c] is None and group.mrr[c] is None
                else:
                    assert group.recall[c] == pytest.approx(want[kind]["hits"][k][g] / n, abs=1e-12), (kind, g, c)
                    assert group.mrr[c] == pytest.approx(want[kind]["rr"][k][g] / n, abs=1e-12), (kind, g, c)
    # The whole evaluation is the prediction-weighted mean of its groups.
    for groups in got.values():
        for c in CUTOFFS:
            total = sum(g.n_predictions * g.recall[c] for g in groups if g.n_predictions)
            assert total / result.n_predictions == pytest.approx(result.recall[c], abs=1e-12)


def test_breakdown_in_the_json_dict(model_and_test: tuple[GRU4Rec, pd.DataFrame]) -> None:
    model, test = model_and_test
    d = json.loads(json.dumps(evaluate(model, test, cutoffs=(5,), breakdown=True).to_dict()))
    assert [g["label"] for g in d["breakdown"]["popularity"]] == [str(i) for i in range(1, 11)]
    assert set(d["breakdown"]["session_length"][0]) >= {"label", "n_predictions", "recall", "mrr", "ndcg"}
    assert "breakdown" not in evaluate(model, test, cutoffs=(5,)).to_dict()
