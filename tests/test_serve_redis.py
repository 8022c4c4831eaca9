"""Session state in a real redis-server: a restarted server continues a session where it was,
two replicas on one Redis answer alternately for one session as a single process does, a
Redis that goes away gives 503 with the reason, not a dead server — and Redis over TLS
(``rediss://``): a password and the server's certificate checked against a CA made in the test
(with the ``openssl`` command), a wrong password, a missing client certificate and a server
certificate the CA did not sign (or for another host) refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.serve import ServeSettings, create_app  # noqa: E402
from gru4rec.serve.state import StoreUnavailable, open_store  # noqa: E402
from serve_helpers import TlsFiles, httpx, make_tls_files, recommend, redis_process, redis_server, running, tls_query, train_small  # noqa: E402


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


#: The password of the TLS servers.
PASSWORD = "tls-pw-8d1f"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A test CA, a server and a client certificate signed by it, and two bad server ones."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def test_redis_over_tls_with_a_password_and_the_certificate_checked(tmp_path: Path, model_file: tuple[GRU4Rec, Path],
                                                                    tls: TlsFiles) -> None:
    """Issue 50, item 9: ``rediss://`` as docs/serving.md tells users to write it, against a
    redis-server that speaks TLS only and wants a password and a client certificate."""
    import redis

    model, path = model_file
    ids = model.item_map.to_list()
    clicks = [ids[5], ids[50], ids[6]]
    with redis_process(tmp_path, password=PASSWORD, tls=tls) as server:
        url = f"{server.url}?{tls_query(tls, ssl_check_hostname='true')}"
        assert url.startswith(f"rediss://:{PASSWORD}@127.0.0.1:")
        with running(create_app(path, ServeSettings(device="cpu", state=url))) as base, httpx.Client(base_url=base) as client:
            assert client.get("/v1/model").json()["state"] == "redis"
            for t in range(len(clicks)):
                body = click(client, "over-tls", clicks[t])
                assert body["new_session"] == (t == 0)
                check(body, model, clicks[: t + 1])
            assert client.get("/healthz").json()["status"] == "ok"
        # The session is on that server: read over TLS by a client of its own.
        direct = redis.Redis(host="127.0.0.1", port=server.port, password=PASSWORD, ssl=True, ssl_ca_certs=str(tls.ca),
                             ssl_certfile=str(tls.client[0]), ssl_keyfile=str(tls.client[1]))
        keys = direct.keys("gru4rec:session:*")
        direct.close()
        assert [key.decode().rsplit(":", 1)[1] for key in keys] == ["over-tls"]
        # TLS only: the port refuses a plain connection.
        with pytest.raises(StoreUnavailable, match="failed on PING"):
            open_store(f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0", max_sessions=10, ttl_s=60, namespace="n")


@pytest.mark.parametrize(("password", "words"), [
    ("not-the-password", "invalid username-password pair"),
    (None, "(?i)authenticat"),  # redis-py's HELLO or PING: "must be ... authenticated" / "Authentication required"
])
def test_a_wrong_or_missing_password_is_refused_over_tls(tmp_path: Path, tls: TlsFiles, password: str | None, words: str) -> None:
    with redis_process(tmp_path, password=PASSWORD, tls=tls) as server:
        auth = f":{password}@" if password else ""
        url = f"rediss://{auth}127.0.0.1:{server.port}/0?{tls_query(tls)}"
        with pytest.raises(StoreUnavailable, match=words) as refused:
            open_store(url, max_sessions=10, ttl_s=60, namespace="n")
    message = str(refused.value)
    assert message.startswith("Redis at rediss://") and "failed on PING" in message
    assert password is None or (password not in message and ":***@127.0.0.1" in message)


@pytest.mark.parametrize(("served", "query", "words"), [
    ("rogue", {}, "certificate verify failed: unable to get local issuer certificate"),  # not signed by the CA given
    ("server", {"ca": False}, "certificate verify failed"),  # no CA given: checked against the system's, which lack it
    ("misnamed", {"ssl_check_hostname": "true"}, "certificate verify failed: IP address mismatch"),  # another host's
    ("server", {"client": False}, "failed on PING"),  # the server wants a client certificate
])
def test_a_bad_certificate_is_refused_over_tls(tmp_path: Path, tls: TlsFiles, served: str, query: dict[str, Any],
                                               words: str) -> None:
    with redis_process(tmp_path, password=PASSWORD, tls=tls, tls_as=served) as server:
        url = f"{server.url}?{tls_query(tls, **query)}"
        with pytest.raises(StoreUnavailable, match=words) as refused:
            open_store(url, max_sessions=10, ttl_s=60, namespace="n")
    assert PASSWORD not in str(refused.value)
