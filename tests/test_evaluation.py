"""Full-catalogue evaluation (docs/behaviour.md §8) against an independent brute-force evaluator.

The brute force below recomputes every hidden state in plain NumPy from the fake nets'
parameters, one session and one event at a time, takes the full score vector and ranks the
target by sorting it, with explicit tie handling. The fake nets are float64 so that the batched
matrix products and NumPy's per-row products agree to the last bit on distinct scores, and
hand-made ties (integer scores, duplicated item rows) are exact in both.
"""
from __future__ import annotations

import io
import math
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import log
from gru4rec.data import ItemMap, Sessions
from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.evaluation import TIE_MODES, EvalResult, evaluate, evaluate_sessions
from gru4rec.evaluation import evaluator as evaluation

torch.set_num_threads(1)


@pytest.fixture(autouse=True, params=["cpu-path", "generic-path"])
def ranking_path(request, monkeypatch):
    """Run every test with the CPU ranking path (blocked sign sums, two-stage top-k) and with
    the generic one (comparisons, torch.topk) that other devices use."""
    monkeypatch.setattr(evaluation, "_CPU_FAST", request.param == "cpu-path")
    return request.param

# --------------------------------------------------------------------------------------------
# Fake nets with NumPy twins, run as session models (make_model: the SessionModel protocol)
# --------------------------------------------------------------------------------------------


class TinyGRUNet:
    """A small random recurrence h' = tanh(E[x]·W + h·U), scores h'·Wyᵀ + By (float64)."""

    def __init__(self, n_items: int, dim: int = 6, seed: int = 0, dup: dict[int, int] | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.E = rng.normal(size=(n_items, dim))
        self.W = rng.normal(size=(dim, dim)) / math.sqrt(dim)
        self.U = rng.normal(size=(dim, dim)) / math.sqrt(dim)
        self.Wy = rng.normal(size=(n_items, dim))
        self.By = rng.normal(size=n_items) * 0.1
        for dst, src in (dup or {}).items():  # duplicated items: exactly tied scores
            self.Wy[dst] = self.Wy[src]
            self.By[dst] = self.By[src]
        self.t = {k: torch.from_numpy(v) for k, v in vars(self).items() if isinstance(v, np.ndarray)}

    def init_hidden(self, batch_size: int) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, self.E.shape[1], dtype=torch.float64)]

    def step(self, items: torch.Tensor, hidden: list[torch.Tensor]) -> torch.Tensor:
        assert not torch.is_grad_enabled()
        h = torch.tanh(self.t["E"][items] @ self.t["W"] + hidden[0] @ self.t["U"])
        hidden[0].copy_(h)
        return h

    def score_all(self, out: torch.Tensor) -> torch.Tensor:
        return out @ self.t["Wy"].T + self.t["By"]

    def np_scores(self, session: np.ndarray) -> list[np.ndarray]:
        """Score vectors after each event but the last, from a zero state (NumPy)."""
        h = np.zeros(self.E.shape[1])
        res = []
        for x in session[:-1]:
            h = np.tanh(self.E[x] @ self.W + h @ self.U)
            res.append(np.array([self.Wy[j] @ h for j in range(len(self.Wy))]) + self.By)
        return res


class IntNet(TinyGRUNet):
    """Integer everything: h' = h + E[x], scores h'·Wyᵀ + By with small integer weights, so
    scores are exact integers and ties are frequent."""

    def __init__(self, n_items: int, dim: int = 3, seed: int = 0, span: int = 2) -> None:
        rng = np.random.default_rng(seed)
        self.E = rng.integers(-span, span + 1, size=(n_items, dim)).astype(np.float64)
        self.Wy = rng.integers(-span, span + 1, size=(n_items, dim)).astype(np.float64)
        self.By = rng.integers(-span, span + 1, size=n_items).astype(np.float64)
        self.t = {k: torch.from_numpy(v) for k, v in vars(self).items() if isinstance(v, np.ndarray)}

    def step(self, items: torch.Tensor, hidden: list[torch.Tensor]) -> torch.Tensor:
        hidden[0].add_(self.t["E"][items])
        return hidden[0].clone()

    def np_scores(self, session: np.ndarray) -> list[np.ndarray]:
        h = np.zeros(self.E.shape[1])
        res = []
        for x in session[:-1]:
            h = h + self.E[x]
            res.append(self.Wy @ h + self.By)
        return res


class TableNet(TinyGRUNet):
    """Scores depend only on the last item: row ``table[last]`` (hand-computed cases)."""

    def __init__(self, table: list[list[float]]) -> None:
        self.table = np.asarray(table, dtype=np.float64)
        self.t = {"table": torch.from_numpy(self.table)}

    def init_hidden(self, batch_size: int) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, len(self.table), dtype=torch.float64)]

    def step(self, items: torch.Tensor, hidden: list[torch.Tensor]) -> torch.Tensor:
        hidden[0].copy_(torch.nn.functional.one_hot(items, len(self.table)).double())
        return hidden[0]

    def score_all(self, out: torch.Tensor) -> torch.Tensor:
        return self.t["table"][out.argmax(1)]  # a row lookup (a product would spread NaNs)

    def np_scores(self, session: np.ndarray) -> list[np.ndarray]:
        return [self.table[x].copy() for x in session[:-1]]


class FakeModel:
    """A fake net as a :class:`gru4rec.inference.SessionModel`; records the score buffers."""

    def __init__(self, net, item_map: ItemMap, support: np.ndarray, config) -> None:
        self.net, self.item_map, self.item_support, self.config = net, item_map, support, config
        self.device = torch.device("cpu")
        self.buffers_seen: list[torch.Tensor | None] = []

    @property
    def fitted(self) -> bool:
        return self.net is not None

    def init_state(self, batch_size: int) -> list[torch.Tensor]:
        return self.net.init_hidden(batch_size)

    def step(self, items: torch.Tensor, state: list[torch.Tensor]) -> torch.Tensor:
        return self.net.step(items, state)

    def scores(self, out: torch.Tensor, buffer: torch.Tensor | None = None) -> torch.Tensor:
        self.buffers_seen.append(buffer)
        scores = self.net.score_all(out)
        return scores if buffer is None or buffer.dtype != scores.dtype else buffer.copy_(scores)

    def output_layer(self) -> None:
        return None


def make_model(net: TinyGRUNet, n_items: int, support: np.ndarray | None = None, ids=None, **keys: str) -> FakeModel:
    cfg = SimpleNamespace(session_key="SessionId", item_key="ItemId", time_key="Time")
    for k, v in keys.items():
        setattr(cfg, k, v)
    ids = list(range(100, 100 + n_items)) if ids is None else ids
    support = np.arange(1, n_items + 1)[::-1].copy() if support is None else support
    return FakeModel(net, ItemMap.from_ids(ids), support, cfg)


# --------------------------------------------------------------------------------------------
# Brute force
# --------------------------------------------------------------------------------------------


def brute_ranks(net: TinyGRUNet, items: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """Ranks of every prediction (sessions in order) for the three deterministic tie modes, by
    sorting each full score vector; also the sorted orders for top-c lists (when no ties)."""
    out: dict[str, list] = {"standard": [], "conservative": [], "median": [], "order": []}
    for s in range(len(offsets) - 1):
        sess = items[offsets[s]:offsets[s + 1]]
        if len(sess) < 2:
            continue
        for j, scores in enumerate(net.np_scores(sess)):
            t = scores[sess[j + 1]]
            order = np.argsort(-scores, kind="stable")
            srt = scores[order]
            tied = np.flatnonzero(srt == t)  # positions (0-based) of the target's tie group
            first, last = tied[0], tied[-1]
            assert np.all(srt[:first] > t) and np.all(srt[last + 1:] < t)
            out["standard"].append(first + 1.0)
            out["conservative"].append(last + 1.0)
            out["median"].append((first + last) / 2.0 + 1.0)
            out["order"].append(order)
    return {k: (np.array(v) if k != "order" else v) for k, v in out.items()}


def brute_metrics(ranks: np.ndarray, cutoffs) -> dict[str, dict[int, float]]:
    res: dict[str, dict[int, float]] = {"recall": {}, "mrr": {}, "ndcg": {}}
    for c in cutoffs:
        hit = ranks <= c
        res["recall"][c] = hit.mean()
        res["mrr"][c] = np.where(hit, 1.0 / ranks, 0.0).mean()
        res["ndcg"][c] = np.where(hit, 1.0 / np.log2(ranks + 1.0), 0.0).mean()
    return res


def random_sessions(rng: np.random.Generator, n_sessions: int, n_items: int, max_len: int = 9):
    lengths = rng.integers(1, max_len + 1, size=n_sessions)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    items = rng.integers(0, n_items, size=offsets[-1]).astype(np.int64)
    return items, offsets


def run(net, items, offsets, n_items, support=None, **kw) -> EvalResult:
    if support is None:
        support = np.arange(1, n_items + 1)[::-1].copy()
    return evaluate_sessions(make_model(net, n_items, support), items, offsets, return_ranks=True, **kw)


# --------------------------------------------------------------------------------------------
# Agreement with the brute force
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["standard", "conservative", "median"])
@pytest.mark.parametrize("batch_size", [1, 4, 1000])
def test_random_gru_matches_brute_force(mode: str, batch_size: int) -> None:
    rng = np.random.default_rng(7)
    N = 40
    net = TinyGRUNet(N, seed=3)
    items, offsets = random_sessions(rng, 23, N)
    cutoffs = (1, 3, 10, 50)  # 50 > N: every prediction is a hit
    res = run(net, items, offsets, N, cutoffs=cutoffs, mode=mode, batch_size=batch_size)
    ref = brute_ranks(net, items, offsets)
    np.testing.assert_array_equal(res.ranks, ref[mode])
    exp = brute_metrics(ref[mode], cutoffs)
    for name in ("recall", "mrr", "ndcg"):
        for c in cutoffs:
            assert getattr(res, name)[c] == pytest.approx(exp[name][c], rel=1e-12, abs=1e-15)
    assert res.recall[50] == 1.0
    assert res.recall[1] == res.mrr[1]
    lengths = np.diff(offsets)
    assert res.n_predictions == int((lengths - 1).clip(0).sum()) == len(ref[mode])
    assert res.n_sessions == int((lengths >= 2).sum())


@pytest.mark.parametrize("mode", ["standard", "conservative", "median"])
@pytest.mark.parametrize("batch_size", [2, 7, 500])
def test_integer_scores_with_many_ties_match_brute_force(mode: str, batch_size: int) -> None:
    rng = np.random.default_rng(11)
    N = 30
    net = IntNet(N, seed=5)
    items, offsets = random_sessions(rng, 40, N, max_len=7)
    cutoffs = (1, 2, 5, 10, 20)
    res = run(net, items, offsets, N, cutoffs=cutoffs, mode=mode, batch_size=batch_size)
    ref = brute_ranks(net, items, offsets)
    # The data really has ties, and the modes differ on them.
    assert np.mean(ref["conservative"] > ref["standard"]) > 0.3
    np.testing.assert_array_equal(res.ranks, ref[mode])
    exp = brute_metrics(ref[mode], cutoffs)
    for name in ("recall", "mrr", "ndcg"):
        for c in cutoffs:
            assert getattr(res, name)[c] == pytest.approx(exp[name][c], rel=1e-12, abs=1e-15)
    assert res.recall[1] == res.mrr[1]


def test_duplicated_item_rows_tie_exactly() -> None:
    N = 25
    dup = {1: 0, 2: 0, 5: 4, 9: 8, 13: 12}
    net = TinyGRUNet(N, dim=5, seed=2, dup=dup)
    rng = np.random.default_rng(3)
    items, offsets = random_sessions(rng, 30, N)
    items[offsets[:-1]] = 3  # fixed first item, then targets hit the duplicated items often
    nxt = offsets[:-1] + 1
    ok = nxt < offsets[1:]
    items[nxt[ok]] = rng.choice([0, 1, 2, 4, 5], size=int(ok.sum()))
    ref = brute_ranks(net, items, offsets)
    assert np.any(ref["conservative"] - ref["standard"] == 2)  # a 3-way tie (items 0, 1, 2)
    for mode in ("standard", "conservative", "median"):
        res = run(net, items, offsets, N, cutoffs=(1, 3), mode=mode, batch_size=6)
        np.testing.assert_array_equal(res.ranks, ref[mode])


def test_tiebreaking_is_a_seeded_uniform_position_among_ties() -> None:
    rng = np.random.default_rng(1)
    N = 30
    net = IntNet(N, seed=9, span=1)
    items, offsets = random_sessions(rng, 150, N, max_len=6)
    ref = brute_ranks(net, items, offsets)
    lo, hi = ref["standard"], ref["conservative"]
    a = run(net, items, offsets, N, cutoffs=(1, 5), mode="tiebreaking", batch_size=16, seed=5)
    b = run(net, items, offsets, N, cutoffs=(1, 5), mode="tiebreaking", batch_size=16, seed=5)
    c = run(net, items, offsets, N, cutoffs=(1, 5), mode="tiebreaking", batch_size=16, seed=6)
    np.testing.assert_array_equal(a.ranks, b.ranks)  # seeded
    assert not np.array_equal(a.ranks, c.ranks)
    for r in (a.ranks, c.ranks):
        assert np.all(r == np.floor(r)) and np.all(r >= lo) and np.all(r <= hi)
    np.testing.assert_array_equal(a.ranks[lo == hi], lo[lo == hi])  # no tie: standard rank
    tied = hi > lo
    assert tied.sum() > 200
    # Uniform over lo..hi: the normalised position averages 1/2 (sd of the mean ≈ 0.02 here).
    pos = np.concatenate([(r[tied] - lo[tied]) / (hi[tied] - lo[tied]) for r in (a.ranks, c.ranks)])
    assert abs(pos.mean() - 0.5) < 0.08
    # Metrics follow the ranks.
    exp = brute_metrics(a.ranks, (1, 5))
    assert a.recall[5] == pytest.approx(exp["recall"][5]) and a.mrr[5] == pytest.approx(exp["mrr"][5])
    assert a.recall[1] == a.mrr[1]


def test_tiebreaking_without_ties_equals_standard() -> None:
    rng = np.random.default_rng(4)
    N = 40
    net = TinyGRUNet(N, seed=8)
    items, offsets = random_sessions(rng, 20, N)
    std = run(net, items, offsets, N, cutoffs=(1, 5, 20), mode="standard", batch_size=8)
    tb = run(net, items, offsets, N, cutoffs=(1, 5, 20), mode="tiebreaking", batch_size=8)
    np.testing.assert_array_equal(std.ranks, tb.ranks)


def test_hand_computed_three_items() -> None:
    # Scores after each last item (rows) for items 0, 1, 2 (columns).
    net = TableNet([[0, 2, 1], [1, 1, 1], [3, 0, 3]])
    items = np.array([0, 1, 2, 2, 0, 1, 0, 1])  # sessions [0,1,2], [2,0], [1,0], [1]
    offsets = np.array([0, 3, 5, 7, 8])
    # Predictions: 0→1 (t=2, no tie), 1→2 (3-way tie), 2→0 (2-way tie), 1→0 (3-way tie).
    support = np.array([4, 2, 1])
    cut = (1, 2, 3)
    std = run(net, items, offsets, 3, support=support, cutoffs=cut, mode="standard")
    np.testing.assert_array_equal(std.ranks, [1, 1, 1, 1])
    assert std.recall == {1: 1.0, 2: 1.0, 3: 1.0} and std.mrr[3] == 1.0
    con = run(net, items, offsets, 3, support=support, cutoffs=cut, mode="conservative", batch_size=2)
    np.testing.assert_array_equal(con.ranks, [1, 3, 2, 3])
    assert con.recall == pytest.approx({1: 0.25, 2: 0.5, 3: 1.0})
    assert con.mrr == pytest.approx({1: 0.25, 2: 0.375, 3: (1 + 1 / 3 + 1 / 2 + 1 / 3) / 4})
    assert con.ndcg[3] == pytest.approx((1 + 0.5 + 1 / math.log2(3) + 0.5) / 4)
    med = run(net, items, offsets, 3, support=support, cutoffs=cut, mode="median", batch_size=3)
    np.testing.assert_array_equal(med.ranks, [1, 2, 1.5, 2])
    assert med.recall == pytest.approx({1: 0.25, 2: 1.0, 3: 1.0})
    assert med.mrr[2] == pytest.approx((1 + 0.5 + 1 / 1.5 + 0.5) / 4)
    # Lists of 3 = the whole catalogue: coverage 1, popularity = mean of support / max.
    assert con.coverage[3] == 1.0
    assert con.popularity[3] == pytest.approx((1 + 0.5 + 0.25) / 3)
    # Top-1 lists: item 1 after 0 (0.5), and ties elsewhere: whatever is chosen is within range.
    assert con.n_predictions == 4 and con.n_sessions == 3


@pytest.mark.parametrize("batch_size", [3, 64])
def test_coverage_and_popularity_match_brute_force(batch_size: int) -> None:
    rng = np.random.default_rng(12)
    N = 60
    net = TinyGRUNet(N, dim=4, seed=13)
    support = rng.integers(0, 50, size=N)
    items, offsets = random_sessions(rng, 25, N)
    cutoffs = (1, 5, 20, 100)
    res = run(net, items, offsets, N, support=support, cutoffs=cutoffs, batch_size=batch_size)
    ref = brute_ranks(net, items, offsets)
    norm = support / support.max()
    for c in cutoffs:
        lists = [o[:c] for o in ref["order"]]
        assert res.coverage[c] == pytest.approx(len(set(np.concatenate(lists).tolist())) / N)
        assert res.popularity[c] == pytest.approx(np.mean([norm[top].mean() for top in lists]), rel=1e-12)
    assert res.coverage[100] == 1.0


def test_beyond_accuracy_off_leaves_accuracy_unchanged() -> None:
    rng = np.random.default_rng(2)
    N = 30
    net = TinyGRUNet(N, seed=1)
    items, offsets = random_sessions(rng, 15, N)
    on = run(net, items, offsets, N, cutoffs=(5, 10), mode="conservative")
    off = evaluate_sessions(make_model(net, N), items, offsets, cutoffs=(5, 10), mode="conservative", beyond_accuracy=False)
    assert off.coverage == {} and off.popularity == {} and off.ranks is None
    assert off.recall == on.recall and off.mrr == on.mrr and off.ndcg == on.ndcg


def test_nan_target_scores_are_misses_with_a_warning() -> None:
    net = TableNet([[np.nan, 1, 0], [0, 2, 1], [1, 0, 2]])
    items = np.array([0, 1, 1, 2, 0])  # 0→1 (row 0 has NaNs: target score 1 is fine), 1→2, 2→0
    offsets = np.array([0, 2, 5])
    net2 = TableNet([[0, np.nan, 0], [0, 2, 1], [1, 0, 2]])  # 0→1: NaN target
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = run(net, items, offsets, 3, cutoffs=(3,), mode="standard")
    # A NaN competitor never ranks above the target.
    np.testing.assert_array_equal(ok.ranks, [1, 2, 2])
    with pytest.warns(RuntimeWarning, match="1 of 3 predictions had a NaN target score"):
        bad = run(net2, items, offsets, 3, cutoffs=(3,), mode="conservative")
    assert bad.ranks[0] == math.inf
    assert bad.recall[3] == pytest.approx(2 / 3)


# --------------------------------------------------------------------------------------------
# evaluate(): data frames, files, unknown items, result formatting
# --------------------------------------------------------------------------------------------


def test_unknown_items_are_dropped_before_sessions_are_formed(tmp_path) -> None:
    # Item ids A, B, C -> indices 0, 1, 2. Scores after A favour B, after B favour C.
    net = TableNet([[0, 5, 1], [1, 0, 5], [5, 1, 0]])
    model = make_model(net, 3, ids=["A", "B", "C"], support=np.array([3, 2, 1]))
    df = pd.DataFrame(
        {
            "SessionId": [1, 1, 1, 2, 2, 3, 3, 3],
            "ItemId": ["A", "X", "B", "X", "C", "B", "Y", "Z"],
            "Time": [1, 2, 3, 1, 2, 1, 2, 3],
        }
    )
    res = evaluate(model, df, cutoffs=(1, 2), mode="conservative", return_ranks=True)
    # Session 1 is A, B: one prediction (B from A, rank 1); sessions 2 and 3 keep one event.
    assert res.n_dropped_events == 4
    assert res.n_predictions == 1 and res.n_sessions == 1
    np.testing.assert_array_equal(res.ranks, [1.0])
    assert res.recall[1] == 1.0 and res.mrr[1] == 1.0
    # The same from a file, with the model's own column names.
    model2 = make_model(net, 3, ids=["A", "B", "C"], support=np.array([3, 2, 1]),
                        session_key="sid", item_key="iid", time_key="ts")
    path = tmp_path / "test.tsv"
    df.rename(columns={"SessionId": "sid", "ItemId": "iid", "Time": "ts"}).to_csv(path, sep="\t", index=False)
    res2 = evaluate(model2, path, cutoffs=(1, 2), mode="conservative")
    assert res2.to_dict() | {"seconds": 0} == res.to_dict() | {"seconds": 0}
    res3 = evaluate(model2, str(path), cutoffs=2)
    assert res3.cutoffs == (2,) and res3.recall[2] == 1.0


def test_evaluate_on_frame_matches_brute_force_in_time_order() -> None:
    rng = np.random.default_rng(21)
    N = 35
    net = TinyGRUNet(N, seed=21)
    ids = [f"i{k}" for k in range(N)]
    model = make_model(net, N, ids=ids)
    items, offsets = random_sessions(rng, 18, N)
    rows = []
    for s in range(len(offsets) - 1):
        for pos, it in enumerate(items[offsets[s]:offsets[s + 1]]):
            rows.append((1000 - s, ids[it], 10.0 * s + pos))
    df = pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"]).sample(frac=1.0, random_state=0)
    res = evaluate(model, df, cutoffs=(1, 5, 10), mode="median", batch_size=5)
    ref = brute_metrics(brute_ranks(net, items, offsets)["median"], (1, 5, 10))
    for c in (1, 5, 10):
        assert res.recall[c] == pytest.approx(ref["recall"][c]) and res.mrr[c] == pytest.approx(ref["mrr"][c])
    assert res.n_dropped_events == 0


def test_sessions_input_and_result_formatting() -> None:
    net = TableNet([[0, 2, 1], [1, 1, 1], [3, 0, 3]])
    model = make_model(net, 3, support=np.array([4, 2, 1]))
    sess = Sessions(items=np.array([0, 1, 2, 2, 0]), offsets=np.array([0, 3, 5]), session_ids=np.array([7, 8]))
    res = evaluate(model, sess, cutoffs=[20, 1], mode="conservative")
    assert res.cutoffs == (1, 20)
    assert str(res) == "Recall@1: 0.333333 MRR@1: 0.333333\nRecall@20: 1.000000 MRR@20: 0.611111"
    d = res.to_dict()
    assert d["recall@1"] == pytest.approx(1 / 3) and d["mrr@20"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    assert d["n_predictions"] == 3 and d["mode"] == "conservative" and d["cutoffs"] == [1, 20]
    assert "coverage@20" in d and "ranks" not in d
    text = res.summary()
    assert "NDCG@20:" in text and "Coverage@1:" in text and "3 predictions in 2 sessions" in text


def test_real_network_matches_brute_force() -> None:
    model_mod = pytest.importorskip("gru4rec.network.gru")
    config_mod = pytest.importorskip("gru4rec.config")
    N = 50
    net = model_mod.GRU4RecNet(N, config_mod.Config(layers=(8, 6)), generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        net.By.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    net.eval()
    rng = np.random.default_rng(5)
    items, offsets = random_sessions(rng, 20, N)
    res = run(net, items, offsets, N, cutoffs=(1, 5, 20), mode="conservative", batch_size=6)
    ranks = []
    with torch.no_grad():
        for s in range(len(offsets) - 1):
            sess = items[offsets[s]:offsets[s + 1]]
            h = net.init_hidden(1)
            for j in range(len(sess) - 1):
                sc = net.score_all(net.step(torch.tensor([sess[j]]), h))[0].numpy()
                srt = np.sort(sc)[::-1]
                ranks.append(np.flatnonzero(srt == sc[sess[j + 1]])[-1] + 1.0)
    np.testing.assert_array_equal(res.ranks, ranks)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _small():
    net = TableNet([[0, 2, 1], [1, 1, 1], [3, 0, 3]])
    model = make_model(net, 3, support=np.array([4, 2, 1]))
    df = pd.DataFrame({"SessionId": [1, 1], "ItemId": [100, 101], "Time": [1, 2]})
    return net, model, df


@pytest.mark.parametrize("cutoffs", [0, -1, [], [5, 0], ["a"], [True], 2.5, None])
def test_bad_cutoffs(cutoffs) -> None:
    _, model, df = _small()
    with pytest.raises(ConfigError, match="cutoffs"):
        evaluate(model, df, cutoffs=cutoffs)


@pytest.mark.parametrize("mode", ["optimistic", "", None])
def test_bad_mode(mode) -> None:
    _, model, df = _small()
    with pytest.raises(ConfigError, match="mode: expected one of standard, conservative, median, tiebreaking"):
        evaluate(model, df, mode=mode)


@pytest.mark.parametrize("bs", [0, -3, 2.0, True])
def test_bad_batch_size(bs) -> None:
    _, model, df = _small()
    with pytest.raises(ConfigError, match="batch_size"):
        evaluate(model, df, batch_size=bs)


def test_bad_test_inputs(tmp_path) -> None:
    _, model, df = _small()
    with pytest.raises(DataError, match="expected a DataFrame, a path"):
        evaluate(model, [1, 2, 3])
    with pytest.raises(DataError, match="not found"):
        evaluate(model, tmp_path / "missing.tsv")
    with pytest.raises(DataError, match="ItemId"):
        evaluate(model, df.drop(columns="ItemId"))
    only_unknown = pd.DataFrame({"SessionId": [1, 1, 2], "ItemId": [5, 6, 100], "Time": [1, 2, 3]})
    with pytest.raises(DataError, match=r"no session has two or more events.*3 event\(s\) dropped|nothing to evaluate"):
        evaluate(model, only_unknown)


def test_not_a_model_or_not_fitted() -> None:
    _, model, df = _small()
    with pytest.raises(Gru4RecError, match="lacks"):
        evaluate(object(), df)
    model.net = None
    with pytest.raises(Gru4RecError, match="not fitted"):
        evaluate(model, df)


def test_bad_sessions_arrays() -> None:
    net, model, _ = _small()
    with pytest.raises(DataError, match=r"item indices must lie in \[0, 3\)"):
        evaluate_sessions(model, np.array([0, 3]), np.array([0, 2]), beyond_accuracy=False)
    with pytest.raises(DataError, match="offsets"):
        evaluate_sessions(model, np.array([0, 1]), np.array([0, 3]), beyond_accuracy=False)
    with pytest.raises(DataError, match="non-decreasing"):
        evaluate_sessions(model, np.array([0, 1]), np.array([0, 2, 1, 2]), beyond_accuracy=False)
    with pytest.raises(Gru4RecError, match="item_support has shape"):
        evaluate_sessions(make_model(net, 3, support=np.ones(4)), np.array([0, 1]), np.array([0, 2]))


def test_tie_modes_constant() -> None:
    assert TIE_MODES == ("standard", "conservative", "median", "tiebreaking")


class _Terminal(io.StringIO):
    """A captured standard error that says it is a terminal, so that tqdm draws its bar."""

    def isatty(self) -> bool:
        return True


def _spy_on_bars(monkeypatch) -> list:
    """The evaluator's bars, each with whether it was drawn (closing a tqdm bar disables it)."""
    bars: list = []

    def spy(*args, **kwargs):
        bar = log.progress_bar(*args, **kwargs)
        bars.append((bar, not bar.disable))
        return bar

    monkeypatch.setattr(evaluation, "progress_bar", spy)
    return bars


def test_progress_goes_to_stderr(monkeypatch, capsys) -> None:
    # progress=True draws a tqdm bar of predictions done / total on standard error (through
    # gru4rec.log.progress_bar), and nothing on standard output.
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bars = _spy_on_bars(monkeypatch)
    rng = np.random.default_rng(0)
    net = TinyGRUNet(20, seed=0)
    items, offsets = random_sessions(rng, 30, 20)
    res = evaluate_sessions(make_model(net, 20), items, offsets, beyond_accuracy=False, batch_size=4, progress=True)
    assert res.n_predictions > 0
    [(bar, drawn_bar)] = bars
    assert drawn_bar and bar.total == res.n_predictions and bar.n == res.n_predictions
    drawn = terminal.getvalue()
    assert "evaluation" in drawn and f"0/{res.n_predictions}" in drawn
    assert capsys.readouterr().out == ""


def test_no_progress_bar_unless_asked(monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bars = _spy_on_bars(monkeypatch)
    rng = np.random.default_rng(0)
    items, offsets = random_sessions(rng, 30, 20)
    evaluate_sessions(make_model(TinyGRUNet(20, seed=0), 20), items, offsets, beyond_accuracy=False, batch_size=4)
    [(bar, drawn_bar)] = bars
    assert not drawn_bar and terminal.getvalue() == ""


def test_scores_go_into_one_reused_buffer() -> None:
    rng = np.random.default_rng(3)
    N = 30
    items, offsets = random_sessions(rng, 25, N)
    model = make_model(TinyGRUNet(N, seed=4), N)
    res = evaluate_sessions(model, items, offsets, cutoffs=(1, 10), mode="median", batch_size=6, return_ranks=True)
    np.testing.assert_array_equal(res.ranks, brute_ranks(model.net, items, offsets)["median"])
    assert len(model.buffers_seen) > 1 and all(b is not None for b in model.buffers_seen)
    assert len({b.data_ptr() for b in model.buffers_seen}) == 1  # one buffer, reused


@pytest.mark.parametrize("mode", ["standard", "median"])
def test_many_items_two_stage_topk(mode: str) -> None:
    # Enough items for the CPU path's grouped top-k (N >= 8 * 64 * k), with ties from
    # duplicated rows that straddle groups.
    N = 3100
    dup = {j: j - 1 for j in range(1, N, 97)}
    net = TinyGRUNet(N, dim=3, seed=31, dup=dup)
    support = np.random.default_rng(0).integers(1, 1000, size=N)
    rng = np.random.default_rng(32)
    items, offsets = random_sessions(rng, 12, N, max_len=5)
    cutoffs = (1, 5)
    res = run(net, items, offsets, N, support=support, cutoffs=cutoffs, mode=mode, batch_size=7)
    ref = brute_ranks(net, items, offsets)
    np.testing.assert_array_equal(res.ranks, ref[mode])
    norm = support / support.max()
    all_scores = [sc for a, b in zip(offsets[:-1], offsets[1:]) if b - a >= 2 for sc in net.np_scores(items[a:b])]
    for c in cutoffs:
        lists = [o[:c] for o in ref["order"]]
        # A tie across the list boundary would make the top-c set ambiguous: the data has none.
        assert all(sc[o[c - 1]] != sc[o[c]] for sc, o in zip(all_scores, ref["order"]))
        assert res.coverage[c] == pytest.approx(len(set(np.concatenate(lists).tolist())) / N)
        assert res.popularity[c] == pytest.approx(np.mean([norm[top].mean() for top in lists]), rel=1e-12)
