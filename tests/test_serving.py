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
    model._live = None
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
