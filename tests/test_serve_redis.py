"""Session state in a real redis-server: a restarted server continues a session where it was,
two replicas on one Redis answer alternately for one session as a single process does, and a
Redis that goes away gives 503 with the reason, not a dead server."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.serve import ServeSettings, create_app  # noqa: E402
from serve_helpers import httpx, recommend, redis_server, running, train_small  # noqa: E402


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRU4Rec, Path]:
    model = train_small(seed=7)
    path = tmp_path_factory.mktemp("serve_redis") / "model.pt"
    model.save(path)
    return model, path


def click(client: httpx.Client, session: str, item: Any, k: int = 6) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session}/events", json={"item": item, "k": k, "exclude_seen": True})
    assert r.status_code == 200, r.text
    return r.json()


def check(body: dict[str, Any], model: GRU4Rec, clicks: list[Any], k: int = 6) -> None:
    items, scores = recommend(model, clicks, k, exclude_seen=True)
    assert body["items"] == items
    np.testing.assert_allclose(body["scores"], scores, rtol=1e-5, atol=1e-5)


def test_a_restarted_server_continues_the_session(tmp_path: Path, model_file: tuple[GRU4Rec, Path]) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    clicks = [ids[5], ids[50], ids[6], ids[7]]
    with redis_server(tmp_path) as url:
        settings = ServeSettings(device="cpu", state=url)
        with running(create_app(path, settings)) as base, httpx.Client(base_url=base) as client:
            assert click(client, "visitor", clicks[0])["new_session"] is True
            assert client.get("/v1/model").json()["state"] == "redis"
            click(client, "visitor", clicks[1])
        with running(create_app(path, settings)) as base, httpx.Client(base_url=base) as client:  # a new process' app
            body = click(client, "visitor", clicks[2])
            assert body["new_session"] is False
            check(body, model, clicks[:3])
            check(click(client, "visitor", clicks[3]), model, clicks)


def test_two_replicas_on_one_redis_answer_alternately_like_one_process(tmp_path: Path, model_file: tuple[GRU4Rec, Path]) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    rng = np.random.default_rng(11)
    clicks = [ids[int(i)] for i in rng.integers(0, len(ids), 8)]
    with redis_server(tmp_path) as url:
        settings = ServeSettings(device="cpu", state=url, scoring="int8", candidates=16)
        with running(create_app(path, settings)) as a, running(create_app(path, settings)) as b, \
                httpx.Client(base_url=a) as replica_a, httpx.Client(base_url=b) as replica_b:
            for t, item in enumerate(clicks):
                replica = (replica_a, replica_b)[t % 2]
                body = click(replica, "shared", item)
                assert body["new_session"] == (t == 0)
                check(body, model, clicks[: t + 1])
            # DELETE on one replica ends the session for the other.
            assert replica_b.delete("/v1/sessions/shared").json()["deleted"] is True
            assert click(replica_a, "shared", clicks[0])["new_session"] is True
            # Another model file never reads these states: its keys carry its own checksum.
            other = tmp_path / "other.pt"
            train_small(seed=8).save(other)
            with running(create_app(other, settings)) as c, httpx.Client(base_url=c) as replica_c:
                assert replica_c.post("/v1/sessions/shared/events", json={"item": clicks[0]}).json()["new_session"] is True


def test_redis_going_away_gives_503_and_the_server_lives_on(tmp_path: Path, model_file: tuple[GRU4Rec, Path]) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    with redis_server(tmp_path) as url:
        app = create_app(path, ServeSettings(device="cpu", state=url))
        with running(app) as base, httpx.Client(base_url=base) as client:
            click(client, "s", ids[1])
            app.state.store._client.shutdown(nosave=True)  # the Redis server stops
            r = client.post("/v1/sessions/s/events", json={"item": ids[2]})
            assert r.status_code == 503
            assert r.json()["error"].startswith(f"Redis at {url} failed on MGET")
            assert client.get("/healthz").status_code == 503
            # Stateless requests need no store: they still work.
            body = client.post("/v1/recommend", json={"items": [ids[1], ids[2]], "k": 3}).json()
            assert body["items"] == recommend(model, [ids[1], ids[2]], 3)[0]


def test_a_redis_that_is_not_there_fails_at_start_up(model_file: tuple[GRU4Rec, Path]) -> None:
    from gru4rec.serve.state import StoreUnavailable
    from serve_helpers import free_port

    with pytest.raises(StoreUnavailable, match="failed on PING"):
        create_app(model_file[1], ServeSettings(device="cpu", state=f"redis://127.0.0.1:{free_port()}/0"))


def test_another_namespace_holds_none_of_the_previous_models_sessions(tmp_path: Path) -> None:
    """What a reload to another architecture does (gru4rec.serve.reload): the store moves to the
    new model's namespace; the old keys stay for other replicas until their TTL."""
    from gru4rec.serve.state import RedisStore

    with redis_server(tmp_path) as url:
        store = RedisStore(url, 60.0, "old")
        other = RedisStore(url, 60.0, "old")
        assert store.compare_and_set([("s1", None, b"state-1")]) == []
        store.use_namespace("new")
        assert store.get_many(["s1"]) == [None]
        assert store.compare_and_set([("s1", None, b"state-2")]) == []
        assert store.get_many(["s1"]) == [b"state-2"] and other.get_many(["s1"]) == [b"state-1"]
        store.close()
        other.close()
