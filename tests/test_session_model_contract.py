"""The SessionModel contract, run over every session model and device (implicit's style: one
suite, every backend): GRU4Rec on the CPU (one and two layers, with dropout configured), on
CUDA where present, and the baselines Pop, SessionPop and ItemKNN.

Every number is checked against an independent reference: a NumPy forward pass of the GRU
(tests/numpy_reference.py) from the model's weights, or the baseline's definition in NumPy; the
top-k lists against a sort of those reference scores; the evaluator's ranks against counts on
them. The engine's work (ragged batches, row-prefix steps, chunks, exclusions, the served
states) must give exactly what one session at a time gives.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.baselines import ItemKNN, Pop, SessionPop
from gru4rec.datasets.synthetic import generate
from gru4rec.errors import NotFittedError
from gru4rec.inference import Engine, SessionModel, SessionState, Work, require_fitted
from numpy_reference import RefConfig, gru_forward

CUDA = torch.cuda.is_available()
N_ITEMS = 120


@pytest.fixture(scope="module")
def events():
    return generate(n_sessions=250, n_items=N_ITEMS, seed=7)


def _gru(params: str, device: str = "cpu") -> Callable[[Any], GRU4Rec]:
    def build(events):
        return GRU4Rec(params + ",n_epochs=1,batch_size=16,n_sample=16,sample_store_size=500", device=device).fit(events, progress=False)
    return build


KINDS: dict[str, Callable[[Any], Any]] = {
    "gru4rec": _gru("layers=12"),
    "gru4rec-2-layers-dropout": _gru("layers=10/8,dropout_p_hidden=0.5,dropout_p_embed=0.3"),
    "pop": lambda ev: Pop().fit(ev),
    "sessionpop": lambda ev: SessionPop().fit(ev),
    "itemknn": lambda ev: ItemKNN(n_neighbors=10).fit(ev),
}
UNFITTED: dict[str, Callable[[], Any]] = {
    "gru4rec": lambda: GRU4Rec("layers=12", device="cpu"), "gru4rec-2-layers-dropout": lambda: GRU4Rec("layers=10/8", device="cpu"),
    "pop": Pop, "sessionpop": SessionPop, "itemknn": ItemKNN,
}
PARAMS = [pytest.param(k, id=k) for k in KINDS]
if CUDA:
    KINDS["gru4rec-cuda"] = _gru("layers=12", device="cuda")
    UNFITTED["gru4rec-cuda"] = lambda: GRU4Rec("layers=12", device="cuda")
PARAMS.append(pytest.param("gru4rec-cuda", id="gru4rec-cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device")))


@pytest.fixture(scope="module")
def models(events) -> dict[str, Any]:
    return {}


@pytest.fixture
def model(request, events, models):
    kind = request.param
    if kind not in models:
        torch.manual_seed(0)
        models[kind] = KINDS[kind](events)
    return models[kind]


def reference_scores(model: Any, session: np.ndarray) -> np.ndarray:
    """The model's scores of every item after ``session`` (item indices, ≥ 1), in NumPy from its
    definition: float64."""
    if isinstance(model, GRU4Rec):
        net = model.net
        p = {k: v.detach().double().cpu().numpy() for k, v in net.state_dict().items()}
        params = {"Wy": p["Wy"], "By": p["By"]}
        for i in range(len(net.sizes)):
            for name in ("Wx", "Wh", "Wrz", "Bh"):
                params[f"{name}_{i}"] = p[f"layers.{i}.{name}"]
        cfg = RefConfig(layers=tuple(net.sizes), mode=net.mode, hidden_act=model.config.hidden_act)
        hidden = [np.zeros((1, n)) for n in net.sizes]
        for item in session:
            out, hidden = gru_forward(params, hidden, np.array([item]), cfg)
        return (out @ params["Wy"].T + params["By"])[0]
    support = model.item_support.astype(np.float64)
    if isinstance(model, Pop):
        return support
    if isinstance(model, SessionPop):
        return np.bincount(session, minlength=len(support)) + support / (support.max() + 1.0)
    scores = np.zeros(len(support))
    last = session[-1]
    nb, sim = model.neighbours.cpu().numpy()[last], model.similarities.cpu().numpy()[last]
    scores[nb] = sim
    return scores


def sessions_of(model: Any, n: int = 23, seed: int = 3) -> list[np.ndarray]:
    """Random sessions of item indices (lengths 0..9, one of each length at least)."""
    rng = np.random.default_rng(seed)
    N = len(model.item_map)
    lengths = np.r_[np.arange(10), rng.integers(0, 10, n - 10)]
    return [rng.integers(0, N, size=L) for L in lengths]


def flat(sessions: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.r_[0, np.cumsum([len(s) for s in sessions])].astype(np.int64)
    items = np.concatenate(sessions).astype(np.int64) if offsets[-1] else np.zeros(0, np.int64)
    return items, offsets


# ---------------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("kind", PARAMS)
def test_unfitted_models_say_so_everywhere(kind: str, events) -> None:
    if kind == "gru4rec-cuda" and not CUDA:
        pytest.skip("no CUDA device")
    model = UNFITTED[kind]()
    assert isinstance(model, SessionModel) and not model.fitted
    with pytest.raises(NotFittedError, match="not fitted"):
        require_fitted(model)
    with pytest.raises(NotFittedError):
        Engine(model)
    with pytest.raises(NotFittedError):
        evaluate(model, events)


@pytest.mark.parametrize("model", PARAMS, indirect=True)
def test_step_is_in_place_on_row_ranges_and_returns_the_last_state(model) -> None:
    assert isinstance(model, SessionModel) and model.fitted
    B = 5
    state = model.init_state(B)
    assert all(s.shape[0] == B and s.device.type == model.device.type for s in state)
    items = torch.tensor([3, 1, 4, 1, 5], device=model.device)
    out = model.step(items, state)
    assert torch.equal(out, state[-1])
    before = [s.clone() for s in state]
    prefix = [s[:3] for s in state]
    out = model.step(items[:3], prefix)
    for s, b in zip(state, before):
        assert torch.equal(s[3:], b[3:])  # rows past the prefix untouched
    assert torch.equal(out, state[-1][:3])
    # Row-independent and deterministic (no dropout, whatever the config says): the same rows
    # stepped alone give the same states.
    for row in range(3):
        alone = [b[row : row + 1].clone() for b in before]
        model.step(items[row : row + 1], alone)
        for s, a in zip(state, alone):
            torch.testing.assert_close(s[row : row + 1], a, rtol=1e-6, atol=1e-6)
    # a range in the middle (the evaluator steps row ranges side by side): in place, the rows
    # outside untouched, its output the range of state[-1]
    before = [s.clone() for s in state]
    middle = [s[1:4] for s in state]
    out = model.step(items[1:4], middle)
    assert torch.equal(out, state[-1][1:4])
    for s, b in zip(state, before):
        assert torch.equal(s[:1], b[:1]) and torch.equal(s[4:], b[4:])
    rowwise = [b.clone() for b in before]
    for row in range(1, 4):
        model.step(items[row : row + 1], [r[row : row + 1] for r in rowwise])
    for s, r in zip(state, rowwise):
        torch.testing.assert_close(s, r, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model", PARAMS, indirect=True)
def test_scores_match_the_reference_and_fill_the_buffer(model) -> None:
    sessions = [s for s in sessions_of(model) if len(s)][:6]
    items, offsets = flat(sessions)
    outs = torch.cat([out for _, out in Engine(model).outputs(items, offsets)])
    got = model.scores(outs).double().cpu().numpy()
    want = np.stack([reference_scores(model, s) for s in sessions])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    buffer = torch.empty(len(sessions), len(model.item_map), device=model.device, dtype=outs.dtype)
    filled = model.scores(outs, buffer=buffer)
    assert torch.equal(filled, buffer) and torch.equal(buffer, model.scores(outs))
    # row-wise: a range of the outputs scores into its range of the buffer
    ranged = torch.full_like(buffer, -7.0)
    model.scores(outs[2:5], buffer=ranged[2:5])
    torch.testing.assert_close(ranged[2:5], buffer[2:5], rtol=1e-6, atol=1e-6)
    assert bool((ranged[:2] == -7.0).all()) and bool((ranged[5:] == -7.0).all())
    layer = model.output_layer()
    if layer is not None:
        wy, by = layer
        torch.testing.assert_close(model.scores(outs), outs @ wy.t() + by)


# ---------------------------------------------------------------------------------- the engine


def _reference_topk(model: Any, session: np.ndarray, k: int, exclude_seen: bool) -> tuple[np.ndarray, np.ndarray]:
    scores = reference_scores(model, session)
    if exclude_seen:
        scores[np.unique(session)] = -np.inf
    order = np.argsort(-scores, kind="stable")[:k]
    order = order[np.isfinite(scores[order])]
    return order, scores[order]


@pytest.mark.parametrize("model", PARAMS, indirect=True)
@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
@pytest.mark.parametrize("exclude_seen", [False, True])
def test_recommend_in_chunks_equals_one_session_at_a_time(model, chunk_rows: int, exclude_seen: bool) -> None:
    sessions = sessions_of(model)
    k = 7
    engine = Engine(model, chunk_bytes=chunk_rows * 4 * len(model.item_map))
    assert engine.chunk == min(chunk_rows, 1024)
    items, offsets = flat(sessions)
    chunks = list(engine.recommend(items, offsets, k, exclude_seen=exclude_seen))
    assert [c.start for c in chunks] == list(range(0, len(sessions), engine.chunk))
    indices = np.concatenate([c.indices for c in chunks])
    scores = np.concatenate([c.scores for c in chunks])
    fallback = np.concatenate([c.fallback for c in chunks])
    popular = np.argsort(-model.item_support, kind="stable")[:k]
    for row, session in enumerate(sessions):
        if len(session) == 0:
            assert fallback[row] and list(indices[row]) == list(popular) and np.isnan(scores[row]).all()
            continue
        want_idx, want_scores = _reference_topk(model, session, k, exclude_seen)
        got = indices[row][indices[row] >= 0]
        assert not fallback[row]
        np.testing.assert_allclose(scores[row][: len(got)], want_scores, rtol=1e-4, atol=1e-4)
        # The same items, up to the order of (near-)ties in the reference's float64 scores.
        ref = reference_scores(model, session)
        np.testing.assert_allclose(np.sort(ref[got])[::-1], np.sort(ref[want_idx])[::-1], rtol=1e-4, atol=1e-4)
        if exclude_seen:
            assert not set(got.tolist()) & set(session.tolist())


@pytest.mark.parametrize("model", PARAMS, indirect=True)
def test_served_sessions_continue_where_they_were(model) -> None:
    # Two requests per session (its first clicks, then the rest) through Engine.run, which keeps
    # the state in between, end where one request with all the clicks ends.
    sessions = [s for s in sessions_of(model, seed=5) if len(s) >= 2][:8]
    engine = Engine(model)
    first = engine.run([Work(None, s[: len(s) // 2], 5) for s in sessions])
    second = engine.run([Work(a.state, s[len(s) // 2 :], 5, exclude_seen=True) for a, s in zip(first, sessions)])
    whole = engine.run([Work(SessionState(), s, 5, exclude_seen=True) for s in sessions])
    for a, b, s in zip(second, whole, sessions):
        np.testing.assert_array_equal(a.state.seen, s)
        np.testing.assert_allclose(a.state.hidden, b.state.hidden, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
        want, _ = _reference_topk(model, s, 5, True)
        ref = reference_scores(model, s)
        np.testing.assert_allclose(np.sort(ref[a.items])[::-1], np.sort(ref[want])[::-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", PARAMS, indirect=True)
def test_evaluate_ranks_are_counts_on_the_reference_scores(model, events) -> None:
    c = model.config
    test = events[events[c.session_key].isin(events[c.session_key].unique()[-40:])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = evaluate(model, test, cutoffs=(5,), mode="conservative", return_ranks=True, batch_size=4)
    test = test.sort_values([c.session_key, c.time_key], kind="stable")
    index = model.item_map.index_of(test[c.item_key])
    known = test[index >= 0].assign(idx=index[index >= 0])
    low, high = [], []  # the conservative rank #{s >= t}, within float32's error of the scores
    for _, group in known.groupby(c.session_key, sort=True):
        s = group["idx"].to_numpy()
        for j in range(1, len(s)):
            scores = reference_scores(model, s[:j])
            t, eps = scores[s[j]], 1e-4 * max(1.0, abs(scores[s[j]]))
            low.append((scores >= t + eps).sum() + 1)
            high.append((scores >= t - eps).sum())
    assert result.ranks is not None and len(result.ranks) == len(low) > 20
    assert np.all((np.asarray(low) <= result.ranks) & (result.ranks <= np.asarray(high)))


# ---------------------------------------------------------------------------------- one engine

PACKAGE = __import__("pathlib").Path(__file__).resolve().parents[1] / "gru4rec"
#: Calls that are the engine's work: a GRU step, a state, scores, a top-k.
ENGINE_WORK = {"step", "init_hidden", "init_state", "score_all", "scores", "topk", "addmm", "index_select"}


def _engine_work_calls(path) -> list[tuple[str, str]]:
    """(called name, enclosing function) of every call of ENGINE_WORK in a module."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, str]] = []

    def visit(node, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                f = child.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in ENGINE_WORK:
                    found.append((called, function))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_serve_and_the_recommender_take_the_engine_from_gru4rec_inference() -> None:
    serve = sorted((PACKAGE / "serve").glob("*.py"))
    for path in [*serve, PACKAGE / "recommender.py"]:
        calls = _engine_work_calls(path)
        if path.name == "recommender.py":
            # The SessionModel methods delegate to the network, one call each; nothing else steps or scores.
            assert sorted(calls) == sorted([("init_hidden", "init_state"), ("step", "step"), ("score_all", "scores")]), calls
        else:
            assert calls == [], f"{path.name} does the engine's work itself: {calls}"
    for name in ("serve/app.py", "serve/batcher.py", "serve/reload.py", "recommender.py"):
        assert "from gru4rec.inference import" in (PACKAGE / name).read_text(encoding="utf-8"), name
