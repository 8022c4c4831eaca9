"""The serving APIs — score_sessions, recommend_batch, predict_next_batch — against a plain
loop of GRU4RecNet.step from a zero state (the definition of a session's hidden state)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.datasets.synthetic import generate

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model() -> GRU4Rec:
    events = generate(n_sessions=300, n_items=40, seed=2)
    return GRU4Rec("layers=12/8,batch_size=8,n_sample=16,n_epochs=1,sample_store_size=160", device="cpu").fit(
        events, progress=False
    )


def plain_scores(model: GRU4Rec, item_ids: list) -> np.ndarray:
    net = model.net
    hidden = net.init_hidden(1)
    with torch.no_grad():
        for item in item_ids:
            out = net.step(torch.tensor(model.item_map.index_of([item])), hidden)
        return net.score_all(out)[0].numpy()


def test_score_sessions_of_different_lengths(model: GRU4Rec) -> None:
    ids = model.item_map.ids
    sessions = [[ids[3], ids[7], ids[1]], [ids[5]], [ids[2], ids[2], ids[9], ids[0], ids[4]]]
    got = model.score_sessions(sessions)
    for row, s in enumerate(sessions):
        np.testing.assert_allclose(got[row], plain_scores(model, s), rtol=1e-5, atol=1e-6)


def test_recommend_batch_is_the_top_of_the_scores(model: GRU4Rec) -> None:
    ids = model.item_map.ids
    sessions = [[ids[3], ids[7]], [ids[5], ids[6], ids[8]]]
    recs = model.recommend_batch(sessions, k=5, exclude_seen=True)
    for s, r in zip(sessions, recs):
        scores = plain_scores(model, s)
        scores[model.item_map.index_of(s)] = -np.inf
        top = np.argsort(-scores, kind="stable")[:5]
        np.testing.assert_array_equal(r.item_ids, ids[top])
        np.testing.assert_allclose(r.scores, scores[top], rtol=1e-5, atol=1e-6)


def test_predict_next_batch_streams_sessions_with_resets_and_unknown_items(model: GRU4Rec) -> None:
    """Two positions: position 0 runs session A then switches to session C (its state must
    reset); position 1 runs session B and meets an unknown item, which leaves its state as is."""
    ids = model.item_map.ids
    a, b, c = [ids[1], ids[4], ids[6]], [ids[2], ids[3]], [ids[8], ids[9]]
    unknown = "no such item"
    model.engine().reset_stream()
    feed = [
        (["A", "B"], [a[0], b[0]]),
        (["A", "B"], [a[1], b[1]]),
        (["A", "B"], [a[2], unknown]),
        (["C", "B"], [c[0], unknown]),
        (["C", "B"], [c[1], unknown]),
    ]
    for t, (sids, items) in enumerate(feed):
        if unknown in items:
            with pytest.warns(UserWarning, match="unknown input item"):
                df = model.predict_next_batch(sids, items)
        else:
            df = model.predict_next_batch(sids, items)
        assert list(df.index) == list(ids)
        if t == 2:
            np.testing.assert_allclose(df[0].to_numpy(), plain_scores(model, a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(df[0].to_numpy(), plain_scores(model, c), rtol=1e-5, atol=1e-6)
    # Position 1 met only unknown items after B's two: its kept state is still B's.
    df = model.predict_next_batch(["C", "B"], [c[1], ids[5]])
    np.testing.assert_allclose(df[1].to_numpy(), plain_scores(model, b + [ids[5]]), rtol=1e-5, atol=1e-6)


def plain_state(model: GRU4Rec, item_ids: list) -> np.ndarray:
    """The last layer's hidden state after the session (a plain loop from a zero state)."""
    net = model.net
    hidden = net.init_hidden(1)
    with torch.no_grad():
        for item in item_ids:
            net.step(torch.tensor(model.item_map.index_of([item])), hidden)
    return hidden[-1][0].numpy().astype(np.float64)


def test_an_unknown_input_is_scored_from_the_kept_state(model: GRU4Rec) -> None:
    """docs/behaviour.md §9: the column of an unknown input holds h·Wyᵀ + By of the state that
    position kept (not a step with item 0); for a new session that state is zero: By."""
    ids = model.item_map.ids
    wy, by = model.net.Wy.detach().numpy().astype(np.float64), model.net.By.detach().numpy().astype(np.float64)
    model.engine().reset_stream()
    first = model.predict_next_batch(["A", "B"], [ids[3], ids[5]])
    with pytest.warns(UserWarning, match="2 unknown input item"):
        df = model.predict_next_batch(["A", "N"], ["no such item", "nor this"])
    want_a = wy @ plain_state(model, [ids[3]]) + by
    np.testing.assert_allclose(df[0].to_numpy(), want_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(df[0].to_numpy(), first[0].to_numpy(), rtol=1e-6, atol=1e-7)  # what A got last time
    np.testing.assert_array_equal(df[1].to_numpy(), model.net.By.detach().numpy())  # new session N: zero state
    # Item index 0 would have given other scores: the defect this guards against.
    assert not np.allclose(df[0].to_numpy(), plain_scores(model, [ids[3], ids[0]]), atol=1e-4)


def test_score_sessions_warns_about_unknown_items_like_recommend(model: GRU4Rec) -> None:
    ids = model.item_map.ids
    with pytest.warns(UserWarning, match=r"3 unknown item id\(s\) skipped in 2 session\(s\)"):
        got = model.score_sessions([[ids[1], "x", ids[2]], [ids[4]], ["y", "z", ids[6]]])
    np.testing.assert_allclose(got[0], plain_scores(model, [ids[1], ids[2]]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], plain_scores(model, [ids[6]]), rtol=1e-5, atol=1e-6)
    with pytest.warns(UserWarning, match=r"3 unknown item id\(s\) skipped in 2 session\(s\)"):
        recs = model.recommend_batch([[ids[1], "x", ids[2]], [ids[4]], ["y", "z", ids[6]]], k=3)
    assert [r.n_unknown for r in recs] == [1, 0, 2]
    with pytest.raises(Exception, match="at least one known item.*position 1"), pytest.warns(UserWarning):
        model.score_sessions([[ids[1]], ["only unknown"]])


def test_fallback_recommendations_have_no_scores(model: GRU4Rec) -> None:
    with pytest.warns(UserWarning, match="2 unknown item"):
        rec = model.recommend(["x", "y"], k=4)
    popular = np.argsort(-model.item_support, kind="stable")[:4]
    assert rec.fallback and rec.n_unknown == 2
    np.testing.assert_array_equal(rec.item_ids, model.item_map.ids[popular])
    assert np.isnan(rec.scores).all() and len(rec.scores) == 4
