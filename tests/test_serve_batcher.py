"""The engine and the micro-batcher without HTTP: batched answers equal ``GRU4Rec.recommend`` on
the same clicks, a session's clicks are applied in arrival order inside one batch window, and a
failing batch, a full queue and a shutdown fail only the requests they concern."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.inference import Engine, Work  # noqa: E402
from gru4rec.serve.batcher import Job, MicroBatcher, Overloaded, ShuttingDown  # noqa: E402
from gru4rec.serve.state import MemoryStore, StoreUnavailable  # noqa: E402
from serve_helpers import recommend, train_small  # noqa: E402 - skips without the serve extra


@pytest.fixture(scope="module")
def model() -> GRU4Rec:
    return train_small()


def ids_of(model: GRU4Rec, engine: Engine, answer: Any) -> tuple[list[Any], list[float] | None]:
    return [engine.item_ids[i] for i in answer.items], None if answer.scores is None else answer.scores.tolist()


def assert_same(got: tuple[list[Any], list[float] | None], want: tuple[list[Any], list[float] | None]) -> None:
    assert got[0] == want[0]
    if want[1] is None:
        assert got[1] is None
    else:
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


CUDA = pytest.param("cuda", "float32", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])


@pytest.mark.parametrize("device,scoring", [("cpu", "float32"), ("cpu", "int8"), CUDA])
def test_one_batch_of_ragged_sessions_equals_recommend(model: GRU4Rec, device: str, scoring: str, tmp_path: Path) -> None:
    """On a GPU the same batch (one GRU step per position on the device, one product) gives the
    CPU model's recommend()."""
    served = model
    if device != "cpu":
        model.save(tmp_path / "model.safetensors")
        served = GRU4Rec.load(tmp_path / "model.safetensors", device=device)
    engine = Engine(served, scoring=scoring, candidates=16)
    assert engine.topk.name == scoring
    ids = model.item_map.to_list()
    sessions = [[ids[4], ids[9], ids[4], ids[120]], [ids[7]], [], ["unknown", -5], [ids[33], "unknown", ids[2], ids[2], ids[8], ids[1]]]
    ks = [5, 1, 4, 6, 12]
    works = []
    for s, k in zip(sessions, ks):
        known, unknown = engine.index_of(s)
        works.append(Work(None, known, k, exclude_seen=k == 12))
    answers = engine.run(works)
    for s, k, a in zip(sessions, ks, answers):
        assert a.fallback == (not engine.index_of(s)[0].size)
        assert_same(ids_of(model, engine, a), recommend(model, s, k, exclude_seen=k == 12))


def test_the_state_after_a_batch_continues_a_session(model: GRU4Rec) -> None:
    """Clicks fed one by one through the saved state give the answers of the whole prefix."""
    engine = Engine(model, scoring="float32")
    ids = model.item_map.to_list()
    clicks = [ids[10], "nope", ids[11], ids[10], ids[200]]
    state = None
    for t in range(len(clicks)):
        known, _ = engine.index_of([clicks[t]])
        (answer,) = engine.run([Work(state, known, 7, exclude_seen=True)])
        state = answer.state
        assert_same(ids_of(model, engine, answer), recommend(model, clicks[: t + 1], 7, exclude_seen=True))
    assert state is not None and state.hidden is not None and state.hidden.shape == (24 + 16,)
    np.testing.assert_array_equal(state.seen, model.item_map.index_of([ids[10], ids[11], ids[10], ids[200]]))


def test_clicks_of_one_session_in_one_window_are_applied_in_order(model: GRU4Rec) -> None:
    """Everything is queued before the worker starts, so it all lands in the first windows:
    three sessions' clicks interleaved, plus stateless requests and a DELETE between clicks."""
    engine = Engine(model, scoring="float32")
    store = MemoryStore(100, 60)
    sizes: list[int] = []
    batcher = MicroBatcher(engine, store, max_batch=8, on_batch=sizes.append)
    ids = model.item_map.to_list()
    rng = np.random.default_rng(0)
    plan: list[tuple[str, Any]] = []
    for t in range(8):
        for s in ("a", "b", "c"):
            plan.append((s, ids[int(rng.integers(0, len(ids)))]))
        plan.append(("stateless", t))
    plan.insert(14, ("delete-b", None))
    jobs, expected = [], []
    history: dict[str, list[Any]] = {"a": [], "b": [], "c": []}
    for session, item in plan:
        if session == "stateless":
            items = [ids[item], ids[item + 1]]
            jobs.append(Job("recommend", None, engine.index_of(items)[0], 5))
            expected.append(recommend(model, items, 5))
        elif session == "delete-b":
            jobs.append(Job("delete", "b"))
            history["b"] = []
            expected.append(None)
        else:
            history[session].append(item)
            jobs.append(Job("event", session, engine.index_of([item])[0], 5, exclude_seen=True))
            expected.append(recommend(model, history[session], 5, exclude_seen=True))
    futures = [batcher.submit(job) for job in jobs]  # queued before the worker runs
    batcher.start()
    try:
        results = [f.result(timeout=60) for f in futures]
    finally:
        batcher.stop()
    for job, result, want in zip(jobs, results, expected):
        if job.kind == "delete":
            assert result.existed
        else:
            assert_same(ids_of(model, engine, result.answer), want)
    assert max(sizes) > 1 and sum(sizes) == len(jobs)  # batched, and every job ran once
    assert max(sizes) <= 8
    first_clicks = [r.new_session for j, r in zip(jobs, results) if j.kind == "event"]
    assert sum(first_clicks) == 4  # a, b, c, and b again after its DELETE


class FlakyStore(MemoryStore):
    """Fails the first read, and blocks reads while ``gate`` is clear."""

    def __init__(self) -> None:
        super().__init__(100, 60)
        self.failed = False
        self.gate = threading.Event()
        self.gate.set()

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        self.gate.wait(30)
        if not self.failed:
            self.failed = True
            raise StoreUnavailable("Redis at redis://test failed on MGET: connection lost")
        return super().get_many(keys)


def test_a_failing_batch_fails_its_requests_and_the_worker_lives_on(model: GRU4Rec) -> None:
    engine = Engine(model, scoring="float32")
    store = FlakyStore()
    batcher = MicroBatcher(engine, store, max_batch=4, max_queue=2)
    batcher.start()
    try:
        ids = model.item_map.to_list()
        first = batcher.submit(Job("event", "s", engine.index_of([ids[1]])[0], 3))
        with pytest.raises(StoreUnavailable, match="connection lost"):
            first.result(timeout=30)
        store.gate.clear()  # the next batch blocks in the store
        busy = batcher.submit(Job("event", "s", engine.index_of([ids[1]])[0], 3))
        while batcher.waiting:  # until the worker has taken it
            time.sleep(0.001)
        queued = [batcher.submit(Job("recommend", None, engine.index_of([ids[2]])[0], 3)) for _ in range(2)]
        with pytest.raises(Overloaded, match="2 requests are already waiting"):
            batcher.submit(Job("recommend", None, engine.index_of([ids[2]])[0], 3))
        store.gate.set()
        assert busy.result(timeout=30).new_session  # the failed click left no state behind
        for f in queued:
            assert [engine.item_ids[i] for i in f.result(timeout=30).answer.items] == recommend(model, [ids[2]], 3)[0]
    finally:
        store.gate.set()
        batcher.stop()
    with pytest.raises(ShuttingDown):
        batcher.submit(Job("recommend", None, engine.index_of([ids[2]])[0], 3))


def test_a_request_that_went_away_fails_nothing_else_in_its_batch(model: GRU4Rec) -> None:
    """A future cancelled before its batch runs (its request gone: asyncio.wrap_future cancels
    it) used to make the batch's answer raise InvalidStateError — a delete's, a replay's or a
    seq mismatch's — and the batch failed every other request in it."""
    engine = Engine(model, scoring="float32")
    store = MemoryStore(100, 60.0)
    ids = model.item_map.to_list()
    first = MicroBatcher(engine, store)
    first.start()
    try:  # session "r" holds one click, seq 1: the same click again is a replay
        first.submit(Job("event", "r", engine.index_of([ids[1]])[0], 3, seq=1)).result(timeout=30)
    finally:
        first.stop()
    batcher = MicroBatcher(engine, store, max_batch=16)  # not started: everything below is one batch
    gone = [
        Job("delete", "d"),
        Job("event", "r", engine.index_of([ids[1]])[0], 3, seq=1),  # a replay
        Job("event", "m", engine.index_of([ids[1]])[0], 3, seq=5),  # a seq mismatch
        Job("event", "e", engine.index_of([ids[4]])[0], 3),  # a plain click
    ]
    kept = Job("recommend", None, engine.index_of([ids[2]])[0], 3)
    for job in [*gone, kept]:
        batcher.submit(job)
    for job in gone:
        assert job.future.cancel()
    batcher.start()
    try:
        result = kept.future.result(timeout=30)
        assert result.answer is not None
        assert [engine.item_ids[i] for i in result.answer.items] == recommend(model, [ids[2]], 3)[0]
        assert batcher.counts["replayed"] == 1
        # The plain click was applied (its answer had nobody to go to): the session holds it.
        later = batcher.submit(Job("event", "e", engine.index_of([ids[5]])[0], 3)).result(timeout=30)
        assert later.new_session is False
    finally:
        batcher.stop()
