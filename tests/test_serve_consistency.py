"""Every click applied exactly once (issue 36): two replicas racing on the same sessions through
one store, the ``seq`` contract of a retried click (answered again, never stepped twice; a gap or
an old position is a 409 naming the position expected), a Redis killed with ``-9`` and
restarted from its append-only file between a click and its retry, and a click in flight during
a model swap. Answers are checked against ``GRU4Rec.recommend`` of the session's clicks in the
order they were applied."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.datasets.synthetic import generate  # noqa: E402
from gru4rec.inference import Engine  # noqa: E402
from gru4rec.serve import ServeSettings, create_app  # noqa: E402
from gru4rec.serve.batcher import Job, MicroBatcher  # noqa: E402
from gru4rec.serve.state import MemoryStore, RedisStore, decode_session  # noqa: E402
from serve_helpers import SMALL, httpx, recommend, redis_process, redis_server, running, train_small  # noqa: E402

K = 6


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRU4Rec, Path]:
    model = train_small(seed=5)
    path = tmp_path_factory.mktemp("serve_consistency") / "model.safetensors"
    model.save(path)
    return model, path


# ------------------------------------------------------------------------- racing replicas


class Racing:
    """Mixed into a store: its next ``waits`` reads wait at ``barrier`` after reading, so that
    two replicas' batches both read the sessions before either writes — the race of issue 36,
    every time."""

    barrier: threading.Barrier
    waits = 0
    _lock = threading.Lock()

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        got = super().get_many(keys)  # type: ignore[misc]
        with self._lock:
            wait, self.waits = self.waits > 0, max(0, self.waits - 1)
        if wait:
            self.barrier.wait(30)
        return got


class RacingRedis(Racing, RedisStore):
    pass


class RacingMemory(Racing, MemoryStore):
    pass


def run_jobs(batchers: list[MicroBatcher], jobs: list[list[Job]]) -> None:
    """Queue each batcher's jobs before it starts (so its first batch holds them all), start
    them together, wait for every answer, stop them."""
    for batcher, queued in zip(batchers, jobs):
        for job in queued:
            batcher.submit(job)
    for batcher in batchers:
        batcher.start()
    try:
        for queued in jobs:
            for job in queued:
                job.future.result(timeout=60)
    finally:
        for batcher in batchers:
            batcher.stop()


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_two_replicas_racing_on_the_same_sessions_apply_every_click_once(
    kind: str, model_file: tuple[GRU4Rec, Path], tmp_path: Path
) -> None:
    """Issue 36's experiment: click 1, then clicks 2 and 3 at the same moment on two replicas,
    then click 4, which must be answered as recommend([c1, c2, c3, c4]) or [c1, c3, c2, c4]."""
    model, _ = model_file
    ids = model.item_map.to_list()
    rng = np.random.default_rng(3)
    n = 20
    clicks = [[ids[int(i)] for i in rng.choice(len(ids), 4, replace=False)] for _ in range(n)]
    barrier = threading.Barrier(2)
    with redis_server(tmp_path) as url:
        shared = RacingMemory(1000, 60.0)  # one process' store, shared by both batchers here

        def store() -> RacingRedis | RacingMemory:
            racing = RacingRedis(url, 60.0, "race") if kind == "redis" else shared
            racing.barrier = barrier
            return racing

        engines = [Engine(model, scoring="float32"), Engine(model, scoring="float32")]

        def jobs(t: int, engine: Engine) -> list[Job]:
            return [Job("event", f"s{s}", engine.index_of([clicks[s][t]])[0], K, engine=engine) for s in range(n)]

        run_jobs([MicroBatcher(engines[0], store())], [jobs(0, engines[0])])
        a, b = MicroBatcher(engines[0], store()), MicroBatcher(engines[1], store())
        for racing in {id(a.store): a.store, id(b.store): b.store}.values():
            racing.waits = 2 if kind == "memory" else 1  # type: ignore[attr-defined]
        run_jobs([a, b], [jobs(1, engines[0]), jobs(2, engines[1])])
        last = MicroBatcher(engines[0], a.store)
        fourth = jobs(3, engines[0])
        run_jobs([last], [fourth])
        stored = a.store.get_many([f"s{s}" for s in range(n)])
    orders = {"2 then 3": 0, "3 then 2": 0}
    for s, job in enumerate(fourth):
        c1, c2, c3, c4 = clicks[s]
        got = [engines[0].item_ids[i] for i in job.future.result().answer.items.tolist()]
        first, second = recommend(model, [c1, c2, c3, c4], K)[0], recommend(model, [c1, c3, c2, c4], K)[0]
        assert got in (first, second), f"session {s}: a click was lost or doubled"
        if first != second:  # (the two orders can give the same list)
            orders["2 then 3" if got == first else "3 then 2"] += 1
        session = decode_session(stored[s], engines[0].hidden_size)  # type: ignore[arg-type]
        assert session is not None and session.position == 4 and sorted(session.state.seen.tolist()) == sorted(
            engines[0].index_of(clicks[s])[0].tolist())
    assert sum(orders.values()) >= n // 2 and min(orders.values()) == 0  # the loser's clicks all came after the winner's
    # One replica's writes landed; the other's were refused and run again on the fresh states.
    assert a.counts["retried"] + b.counts["retried"] == n and a.counts["gave_up"] + b.counts["gave_up"] == 0


# ------------------------------------------------------------------------- the seq contract


def post(client: httpx.Client, session: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    """One click; a 503 (Redis away for a moment) is retried as the documented client does."""
    for _ in range(50):
        r = client.post(f"/v1/sessions/{session}/events", json={"k": K, **body})
        if r.status_code != 503:
            break
        time.sleep(0.1)
    assert r.status_code == status, r.text
    return r.json()


def replayed(client: httpx.Client) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "gru4rec_serve_clicks_total" and sample.labels["outcome"] == "replayed":
                return sample.value
    return 0.0


def check(body: dict[str, Any], model: GRU4Rec, clicks: list[Any]) -> None:
    items, scores = recommend(model, clicks, K)
    assert body["items"] == items
    np.testing.assert_allclose(body["scores"], scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("state", ["memory", "redis"])
def test_a_click_sent_again_with_its_seq_is_answered_again_without_a_step(
    state: str, model_file: tuple[GRU4Rec, Path], tmp_path: Path
) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    c = [ids[3], ids[40], ids[7], ids[90]]
    with redis_server(tmp_path) as url:
        settings = ServeSettings(device="cpu", scoring="float32", state=url if state == "redis" else "memory")
        with running(create_app(path, settings)) as base, httpx.Client(base_url=base, timeout=30) as client:
            first = post(client, "v", {"item": c[0], "seq": 1})
            assert first["new_session"] is True and first["seq"] == 1
            check(first, model, c[:1])
            assert post(client, "v", {"item": c[0], "seq": 1}) == first  # the same answer, new_session included
            assert replayed(client) == 1
            gap = post(client, "v", {"item": c[2], "seq": 3}, 409)
            assert gap["expected_seq"] == 2 and "the next is seq 2, got seq 3 (a click is missing)" in gap["error"]
            check(post(client, "v", {"item": c[1], "seq": 2}), model, c[:2])  # one step: click 1 was not doubled
            other = post(client, "v", {"item": c[3], "seq": 2}, 409)
            assert other["expected_seq"] == 3 and "applied with another item" in other["error"]
            old = post(client, "v", {"item": c[0], "seq": 1}, 409)
            assert old["expected_seq"] == 3 and "older than its last click" in old["error"]
            check(post(client, "v", {"item": c[2]}), model, c[:3])  # without seq: applied as it comes, counted
            check(post(client, "v", {"item": c[3], "seq": 4}), model, c)
            fresh = post(client, "w", {"item": c[0], "seq": 2}, 409)
            assert fresh["expected_seq"] == 1 and "is not held" in fresh["error"]
            assert client.delete("/v1/sessions/v").json()["deleted"] is True
            assert post(client, "v", {"item": c[0], "seq": 5}, 409)["expected_seq"] == 1
            for bad, message in ((0, "between 1 and"), ("2", "must be an integer"), (True, "must be an integer")):
                r = client.post("/v1/sessions/v/events", json={"item": c[0], "seq": bad})
                assert r.status_code == 422 and message in r.json()["error"]
            assert replayed(client) == 1


def test_a_redis_restart_from_its_append_only_file_between_a_click_and_its_retry(
    model_file: tuple[GRU4Rec, Path], tmp_path: Path
) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    c = [ids[11], ids[5], ids[60]]
    with redis_process(tmp_path, aof=True) as redis:
        settings = ServeSettings(device="cpu", scoring="float32", state=redis.url)
        with running(create_app(path, settings)) as base, httpx.Client(base_url=base, timeout=30) as client:
            post(client, "r", {"item": c[0], "seq": 1})
            second = post(client, "r", {"item": c[1], "seq": 2})
            redis.kill()  # kill -9 right after the write was acknowledged
            r = client.post("/v1/sessions/r/events", json={"item": c[2], "k": K, "seq": 3})
            assert r.status_code == 503 and "Redis at" in r.json()["error"]
            redis.start()  # same port and folder: it reads its append-only file back
            assert post(client, "r", {"item": c[1], "seq": 2}) == second  # the retry: kept through the restart
            check(post(client, "r", {"item": c[2], "seq": 3}), model, c)


# ------------------------------------------------------------------------- a model swap


def test_a_click_in_flight_during_a_model_swap_is_applied_once(model_file: tuple[GRU4Rec, Path]) -> None:
    from test_serve_reload import K as RELOAD_K
    from test_serve_reload import continued

    old = model_file[0]
    events = generate(n_sessions=150, n_items=300, seed=5)
    warm = GRU4Rec(SMALL, device="cpu", threads=1).fit(events, progress=False, init_from=old)
    e_old, e_warm = Engine(old, scoring="float32"), Engine(warm, scoring="float32")
    assert e_warm.keeps_states_of(e_old)
    ids = old.item_map.to_list()
    c = [ids[2], ids[30], ids[9], ids[14]]
    store = MemoryStore(100, 60.0)
    batcher = MicroBatcher(e_old, store)
    batcher.start()
    try:
        def click(t: int, engine: Engine) -> Any:
            return batcher.submit(Job("event", "m", engine.index_of([c[t - 1]])[0], RELOAD_K, engine=engine, seq=t))

        for t in (1, 2):
            click(t, e_old).result(timeout=30)
        third = click(3, e_old)  # in flight: indexed by the old model
        swapped = batcher.swap(e_warm, keep_sessions=True, namespace="warm")
        again = click(3, e_old)  # its retry, sent before the answer came
        fourth = click(4, e_warm)
        swapped.result(timeout=30)
        first_answer, retry = third.result(timeout=30), again.result(timeout=30)
        assert retry.replayed and not first_answer.replayed
        assert retry.answer.items.tolist() == first_answer.answer.items.tolist()
        np.testing.assert_array_equal(retry.answer.scores, first_answer.answer.scores)
        last = fourth.result(timeout=30)
    finally:
        batcher.stop()
    want_ids, want_scores = continued(old, warm, c[:3], c[3])  # three old steps, one new one: click 3 once
    assert [e_warm.item_ids[i] for i in last.answer.items.tolist()] == want_ids
    np.testing.assert_allclose(last.answer.scores, want_scores, rtol=1e-5, atol=1e-5)
    session = decode_session(store.get_many(["m"])[0], e_warm.hidden_size)  # type: ignore[arg-type]
    assert session is not None and session.position == 4 and len(session.state.seen) == 4


class Contended(MemoryStore):
    """Refuses the writes of session ``busy`` ``times`` times (another replica writing it)."""

    def __init__(self, busy: str, times: int) -> None:
        super().__init__(100, 60.0)
        self.busy, self.left = busy, times

    def compare_and_set(self, writes: list[tuple[str, bytes | None, bytes]]) -> list[int]:
        refused = [i for i, (key, _, _) in enumerate(writes) if key == self.busy and self.left > 0]
        if refused:
            self.left -= 1
        kept = [w for i, w in enumerate(writes) if i not in refused]
        assert super().compare_and_set(kept) == []
        return refused


def test_a_conflicted_click_runs_again_without_holding_up_the_others_and_gives_up_after_a_bound(
    model_file: tuple[GRU4Rec, Path]
) -> None:
    from gru4rec.serve.batcher import MAX_ATTEMPTS, StateConflict

    model, path = model_file
    engine = Engine(model, scoring="float32")
    ids = model.item_map.to_list()
    store = Contended("busy", MAX_ATTEMPTS - 1)
    batcher = MicroBatcher(engine, store)
    busy = Job("event", "busy", engine.index_of([ids[1]])[0], K)
    calm = Job("event", "calm", engine.index_of([ids[2]])[0], K)
    batcher._run([busy, calm])  # the first batch, run here: calm is answered, busy goes back to the queue
    assert calm.future.done() and not busy.future.done() and list(batcher._deferred) == [busy]
    batcher.start()
    try:
        result = busy.future.result(timeout=30)  # the last refusal before the bound: applied
        assert [engine.item_ids[i] for i in result.answer.items.tolist()] == recommend(model, [ids[1]], K)[0]
        assert batcher.counts == {"replayed": 0, "retried": MAX_ATTEMPTS - 1, "gave_up": 0}
        store.left = MAX_ATTEMPTS
        again = batcher.submit(Job("event", "busy", engine.index_of([ids[3]])[0], K))
        with pytest.raises(StateConflict, match=f"changed under this click {MAX_ATTEMPTS} times in a row"):
            again.result(timeout=30)
        assert batcher.counts["gave_up"] == 1
    finally:
        batcher.stop()
    session = decode_session(store.get_many(["busy"])[0], engine.hidden_size)  # type: ignore[arg-type]
    assert session is not None and session.position == 1  # the refused click left no trace
    app = create_app(path, ServeSettings(device="cpu", scoring="float32"))
    app.state.batcher.store = Contended("s", MAX_ATTEMPTS)
    with running(app) as base, httpx.Client(base_url=base) as client:
        r = client.post("/v1/sessions/s/events", json={"item": ids[1], "k": K})
        assert r.status_code == 503 and "send it again" in r.json()["error"]
