"""The HTTP service against a real uvicorn server on a loopback port and a real httpx client:
both routes equal ``GRU4Rec.recommend``, every bad input gets a 4xx with one line, eviction and
TTL, the metrics, and concurrent requests in shared micro-batches."""
from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.serve import ServeSettings, create_app  # noqa: E402
from serve_helpers import httpx, recommend, running, train_small  # noqa: E402 - skips without the serve extra

prometheus_parser = pytest.importorskip("prometheus_client.parser")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRU4Rec, Path]:
    model = train_small()
    path = tmp_path_factory.mktemp("serve") / "model.pt"
    model.save(path)
    return GRU4Rec.load(path, device="cpu"), path


@pytest.fixture(scope="module")
def server(model_file: tuple[GRU4Rec, Path]) -> Iterator[httpx.Client]:
    """One server for the request tests: int8 scoring (certified, with a small candidate list
    so that both its paths run on this small catalogue), small limits."""
    _, path = model_file
    settings = ServeSettings(device="cpu", scoring="int8", candidates=16, max_body_bytes=4096, max_items=40)
    with running(create_app(path, settings)) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def check_answer(body: dict[str, Any], want: tuple[list[Any], list[float] | None]) -> None:
    assert body["items"] == want[0]
    if want[1] is None:
        assert body["scores"] is None and body["fallback"] is True
    else:
        assert body["fallback"] is False
        np.testing.assert_allclose(body["scores"], want[1], rtol=1e-5, atol=1e-5)


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """One sample of /metrics (0 when absent)."""
    for family in prometheus_parser.text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_stateless_answers_equal_recommend(server: httpx.Client, model_file: tuple[GRU4Rec, Path]) -> None:
    model, _ = model_file
    ids = model.item_map.to_list()
    cases = [
        ([ids[3], ids[17], ids[3]], 20, False),
        ([ids[3], ids[17], ids[3]], 20, True),
        ([ids[250], "no-such-item", ids[8], 123456789012], 7, False),
        ([ids[i] for i in range(40)], 1, True),
        ([ids[5]], len(ids), False),  # the whole catalogue
        ([ids[5], ids[6]], len(ids), True),  # fewer than k left: the session's own items are not answers
    ]
    for items, k, exclude in cases:
        r = server.post("/v1/recommend", json={"items": items, "k": k, "exclude_seen": exclude})
        assert r.status_code == 200, r.text
        body = r.json()
        check_answer(body, recommend(model, items, k, exclude))
        assert body["unknown"] == [i for i in items if i not in set(ids)]
    everything = server.post("/v1/recommend", json={"items": [ids[5], ids[6]], "k": len(ids), "exclude_seen": True}).json()
    assert len(everything["items"]) == len(ids) - 2
    assert server.post("/v1/recommend", json={"items": [ids[1]]}).json()["items"] == recommend(model, [ids[1]], 20)[0]  # k=20 by default


def test_sessions_without_known_items_get_the_popular_items(server: httpx.Client, model_file: tuple[GRU4Rec, Path]) -> None:
    model, _ = model_file
    popular = model.item_map.ids[np.argsort(-model.item_support, kind="stable")[:6]].tolist()
    for items in ([], ["x", "y"]):
        body = server.post("/v1/recommend", json={"items": items, "k": 6}).json()
        assert body == {"items": popular, "scores": None, "unknown": items, "fallback": True}
    first = server.post("/v1/sessions/only-unknown/events", json={"item": "x", "k": 6}).json()
    assert first["fallback"] and first["items"] == popular and first["new_session"] and first["unknown"] == ["x"]


def test_a_stateful_session_equals_recommend_on_its_clicks(server: httpx.Client, model_file: tuple[GRU4Rec, Path]) -> None:
    model, _ = model_file
    ids = model.item_map.to_list()
    clicks = [ids[10], "unknown-item", ids[11], ids[10], ids[-1], ids[42]]
    for t, item in enumerate(clicks):
        exclude = t % 2 == 1
        r = server.post("/v1/sessions/user-17/events", json={"item": item, "k": 9, "exclude_seen": exclude})
        assert r.status_code == 200, r.text
        body = r.json()
        check_answer(body, recommend(model, clicks[: t + 1], 9, exclude))
        assert body["session_id"] == "user-17" and body["new_session"] == (t == 0)
        assert body["unknown"] == (["unknown-item"] if t == 1 else [])
    assert server.delete("/v1/sessions/user-17").json() == {"session_id": "user-17", "deleted": True}
    assert server.delete("/v1/sessions/user-17").json() == {"session_id": "user-17", "deleted": False}
    again = server.post("/v1/sessions/user-17/events", json={"item": ids[42], "k": 9}).json()
    assert again["new_session"] is True
    check_answer(again, recommend(model, [ids[42]], 9))


def test_concurrent_requests_share_batches_and_keep_their_answers(model_file: tuple[GRU4Rec, Path]) -> None:
    """32 clients at once; a batch waits up to 100 ms for company, so they share batches."""
    model, path = model_file
    ids = model.item_map.to_list()
    rng = np.random.default_rng(3)
    sessions = {f"s{i}": [ids[int(j)] for j in rng.integers(0, len(ids), 3)] for i in range(16)}
    stateless = [[ids[int(j)] for j in rng.integers(0, len(ids), 1 + i % 5)] for i in range(16)]
    settings = ServeSettings(device="cpu", scoring="float32", batch_window_ms=100, max_batch=64)
    with running(create_app(path, settings)) as url:

        async def drive() -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                async def one_session(name: str, clicks: list[Any]) -> list[dict[str, Any]]:
                    out = []
                    for item in clicks:  # a session's clicks one after the other, as a user makes them
                        out.append((await client.post(f"/v1/sessions/{name}/events", json={"item": item, "k": 5})).json())
                    return out

                flat = asyncio.gather(*(client.post("/v1/recommend", json={"items": s, "k": 5}) for s in stateless))
                per_session = asyncio.gather(*(one_session(n, c) for n, c in sessions.items()))
                responses, answers = await asyncio.gather(flat, per_session)
                return [r.json() for r in responses], answers

        flat, per_session = asyncio.run(drive())
        with httpx.Client(base_url=url) as client:
            batches = metric(client, "gru4rec_serve_batch_size_count")
            runs = metric(client, "gru4rec_serve_batch_size_sum")
    for items, body in zip(stateless, flat):
        check_answer(body, recommend(model, items, 5))
    for clicks, answers in zip(sessions.values(), per_session):
        for t, body in enumerate(answers):
            check_answer(body, recommend(model, clicks[: t + 1], 5))
    assert runs == 16 + 48 and batches < runs  # every request ran once, several per batch


def test_the_start_up_objects_are_out_of_the_collectors_reach(model_file: tuple[GRU4Rec, Path]) -> None:
    """A full garbage collection would scan the model and the libraries at every run (~100 ms
    at the DIGINETICA size, a stall for every request in flight): the server freezes them when
    it starts. Frozen objects are those gc.get_objects() no longer lists."""
    gc.unfreeze()
    app = create_app(model_file[1], ServeSettings(device="cpu"))
    engine = app.state.batcher.engine

    def tracked() -> bool:
        return any(o is engine for o in gc.get_objects())

    assert tracked()
    with running(app):
        assert not tracked() and gc.get_freeze_count() > 10_000


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_server_on_cuda_answers_as_recommend_on_the_cpu(model_file: tuple[GRU4Rec, Path]) -> None:
    """The model on the GPU (float32 scoring there), a session's clicks and stateless requests of
    several lengths: the answers of the CPU model's recommend()."""
    model, path = model_file
    ids = model.item_map.to_list()
    with running(create_app(path, ServeSettings(device="cuda", max_batch=64))) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        info = client.get("/v1/model").json()
        assert info["device"].startswith("cuda") and info["scoring"] == "float32"
        clicks = [ids[10], ids[11], "unknown-item", ids[10], ids[42]]
        for t, item in enumerate(clicks):
            body = client.post("/v1/sessions/gpu/events", json={"item": item, "k": 9, "exclude_seen": t == 3}).json()
            check_answer(body, recommend(model, clicks[: t + 1], 9, t == 3))
        for items in ([ids[5]], [ids[7], ids[9], ids[7]], [ids[i] for i in range(0, 60, 3)]):
            check_answer(client.post("/v1/recommend", json={"items": items, "k": 12}).json(), recommend(model, items, 12))


BAD_REQUESTS = [
    ("POST", "/v1/recommend", b"{", 400, r"^malformed JSON: Expecting property name"),
    ("POST", "/v1/recommend", b"", 400, r"^the request body is empty"),
    ("POST", "/v1/recommend", b'{"items": ["\xff"]}', 400, r"^the request body is not UTF-8 text \(byte 12\)$"),
    ("POST", "/v1/recommend", b'{"items": [NaN]}', 400, r"^malformed JSON: NaN is not valid JSON"),
    ("POST", "/v1/recommend", b"[" * 2000 + b"]" * 2000, 400, r"^malformed JSON: nested more than 32 levels deep$"),
    ("POST", "/v1/recommend", b'{"items": ' + b"[" * 33 + b"]" * 33 + b"}", 400, r"^malformed JSON: nested more than 32 levels deep$"),
    (
        "POST",
        "/v1/recommend",
        b'{"items": ' + b"[" * 31 + b"]" * 31 + b"}",
        422,
        r"^items\[0\] must be an item id .*got an array$",
    ),  # 32 levels: read
    # 40 brackets inside a string id are no nesting: the body is read, and the id is unknown
    ("POST", "/v1/recommend", b'{"items": [1, 2], "k": 0, "x": "' + b"[" * 40 + b'"}', 422, r"^unknown field 'x'"),
    ("POST", "/v1/recommend", b"[1, 2]", 422, r"^the body must be a JSON object, got an array$"),
    ("POST", "/v1/recommend", b'{"k": 3}', 422, r"^missing field 'items'$"),
    ("POST", "/v1/recommend", b'{"items": [], "kk": 3}', 422, r"^unknown field 'kk' \(fields: items, k, exclude_seen, times\)$"),
    ("POST", "/v1/recommend", b'{"items": "abc"}', 422, r"^'items' must be an array of item ids, got a string$"),
    ("POST", "/v1/recommend", b'{"items": [1, 2.5]}', 422, r"^items\[1\] must be an item id \(an integer or a string\), got a number$"),
    ("POST", "/v1/recommend", b'{"items": [true]}', 422, r"^items\[0\] must be an item id .*got a boolean$"),
    ("POST", "/v1/recommend", b'{"items": [null]}', 422, r"^items\[0\] must be an item id .*got null$"),
    ("POST", "/v1/recommend", b'{"items": [[1]]}', 422, r"^items\[0\] must be an item id .*got an array$"),
    ("POST", "/v1/recommend", b'{"items": [], "k": 0}', 422, r"^'k' must be between 1 and {N} \(the number of items\), got 0$"),
    ("POST", "/v1/recommend", b'{"items": [], "k": -3}', 422, r"^'k' must be between 1 and {N} "),
    ("POST", "/v1/recommend", b'{"items": [], "k": {N+1}}', 422, r"^'k' must be between 1 and {N} \(the number of items\), got {N+1}$"),
    ("POST", "/v1/recommend", b'{"items": [], "k": "5"}', 422, r"^'k' must be an integer, got a string$"),
    ("POST", "/v1/recommend", b'{"items": [], "k": true}', 422, r"^'k' must be an integer, got a boolean$"),
    ("POST", "/v1/recommend", b'{"items": [], "k": 2.0}', 422, r"^'k' must be an integer, got a number$"),
    ("POST", "/v1/recommend", b'{"items": [], "exclude_seen": 1}', 422, r"^'exclude_seen' must be true or false, got an integer$"),
    ("POST", "/v1/recommend", b'{"items": [' + b",".join([b"1"] * 41) + b"]}", 422, r"^'items' has 41 entries, more than the limit of 40$"),
    ("POST", "/v1/sessions/s/events", b'{"items": [1]}', 422, r"^unknown field 'items' \(fields: item, k, exclude_seen, seq, time\)$"),
    ("POST", "/v1/sessions/s/events", b"{}", 422, r"^missing field 'item'$"),
    (
        "POST",
        "/v1/sessions/s/events",
        b'{"item": {"id": 1}}',
        422,
        r"^'item' must be an item id \(an integer or a string\), got an object$",
    ),
    ("POST", "/v1/sessions/s/events", b'{"item": 1, "k": 0}', 422, r"^'k' must be between 1 and {N} "),
    ("POST", "/v1/sessions/" + "x" * 201 + "/events", b'{"item": 1}', 422, r"^the session id must have 1 to 200 characters, got 201$"),
    ("POST", "/v1/recommend", b'{"items": ["' + b"a" * 5000 + b'"]}', 413, r"^the request body is larger than the limit of 4096 bytes$"),
    ("GET", "/v1/recommend", None, 405, r"^method GET is not allowed on /v1/recommend \(allowed: POST\)$"),
    ("PUT", "/v1/sessions/s", b"{}", 405, r"^method PUT is not allowed on /v1/sessions/s \(allowed: DELETE\)$"),
    ("POST", "/v2/recommend", b"{}", 404, r"^no such route: POST /v2/recommend$"),
    ("GET", "/", None, 404, r"^no such route: GET /$"),
]


@pytest.mark.parametrize("method,path,body,status,message", BAD_REQUESTS,
                         ids=[f"{m} {p[:30]} {s} {i}" for i, (m, p, _, s, _) in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_a_4xx_and_one_line(server: httpx.Client, model_file: tuple[GRU4Rec, Path], method: str, path: str,
                                             body: bytes | None, status: int, message: str) -> None:
    n = len(model_file[0].item_map)  # {N}: the catalogue's size in the messages
    message = message.replace("{N+1}", str(n + 1)).replace("{N}", str(n))
    body = body.replace(b"{N+1}", str(n + 1).encode()) if body is not None else None
    r = server.request(method, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert "\n" not in error
    assert re.search(message, error), error


def test_an_oversized_chunked_body_is_refused_while_it_is_read(server: httpx.Client) -> None:
    """No Content-Length (chunked transfer): the limit is checked on the bytes as they arrive."""

    def chunks() -> Iterator[bytes]:
        yield b'{"items": ["'
        for _ in range(64):
            yield b"a" * 1024

    r = server.post("/v1/recommend", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"].startswith("the request body is larger than the limit")


def test_the_server_survives_bad_requests(server: httpx.Client, model_file: tuple[GRU4Rec, Path]) -> None:
    model, _ = model_file
    for _, path, body, _, _ in BAD_REQUESTS[:20]:
        server.post(path, content=body)
    assert metric(server, "gru4rec_serve_requests_total", status="500") == 0
    ids = model.item_map.to_list()
    check_answer(server.post("/v1/recommend", json={"items": [ids[2]], "k": 3}).json(), recommend(model, [ids[2]], 3))
    assert server.get("/healthz").json()["status"] == "ok"


def test_model_health_and_metrics_routes(model_file: tuple[GRU4Rec, Path]) -> None:
    model, path = model_file
    with running(create_app(path, ServeSettings(device="cpu"))) as url, httpx.Client(base_url=url) as client:
        info = client.get("/v1/model").json()
        assert info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert info["n_items"] == len(model.item_map) and info["layers"] == [24, 16] and info["file"] == str(path)
        assert info["config"] == model.config.to_dict() and info["scoring"] == "float32" and info["state"] == "memory"
        ids = model.item_map.to_list()
        for i in range(3):
            client.post("/v1/recommend", json={"items": [ids[i]]})
        client.post("/v1/recommend", json={"items": []})
        client.post("/v1/sessions/a/events", json={"item": ids[0]})
        client.post("/v1/sessions/b/events", json={"item": ids[1]})
        client.post("/v1/recommend", json={"k": 0})
        text = client.get("/metrics")
        assert text.headers["content-type"].startswith("text/plain")
        assert metric(client, "gru4rec_serve_requests_total", route="/v1/recommend", method="POST", status="200") == 4
        assert metric(client, "gru4rec_serve_requests_total", route="/v1/recommend", status="422") == 1
        assert metric(client, "gru4rec_serve_requests_total", route="/v1/sessions/{session_id}/events", status="200") == 2
        assert metric(client, "gru4rec_serve_request_seconds_count", route="/v1/recommend") == 5
        assert metric(client, "gru4rec_serve_sessions") == 2
        assert metric(client, "gru4rec_serve_popularity_fallbacks_total") == 1
        assert metric(client, "gru4rec_serve_scored_rows_total", path="float32") == 5
        assert metric(client, "gru4rec_serve_batch_size_sum") == 6
        assert client.get("/healthz").json() == {"status": "ok", "waiting": 0, "stale": False}


def test_eviction_and_ttl_start_sessions_afresh(model_file: tuple[GRU4Rec, Path]) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    settings = ServeSettings(device="cpu", max_sessions=2, session_ttl_s=1.0)
    with running(create_app(path, settings)) as url, httpx.Client(base_url=url) as client:
        def click(session: str, item: Any) -> dict[str, Any]:
            return client.post(f"/v1/sessions/{session}/events", json={"item": item, "k": 4}).json()

        click("s1", ids[1])
        click("s2", ids[2])
        click("s1", ids[3])  # s1 is now the most recent
        click("s3", ids[4])  # over the cap: s2 goes
        assert metric(client, "gru4rec_serve_session_evictions_total", reason="capacity") == 1
        body = click("s2", ids[5])
        assert body["new_session"] is True
        check_answer(body, recommend(model, [ids[5]], 4))  # from a fresh state, not after ids[2]
        body = click("s3", ids[6])  # s1 went when s2 came back; s3 is still held
        assert body["new_session"] is False
        check_answer(body, recommend(model, [ids[4], ids[6]], 4))
        time.sleep(1.3)  # past the TTL
        body = click("s3", ids[7])
        assert body["new_session"] is True
        check_answer(body, recommend(model, [ids[7]], 4))
        assert metric(client, "gru4rec_serve_session_evictions_total", reason="ttl") >= 1


def test_string_item_ids(tmp_path: Path) -> None:
    model = train_small(n_items=80, seed=4, string_ids=True)
    ids = model.item_map.to_list()
    assert isinstance(ids[0], str)
    with running(create_app(model, ServeSettings(device="cpu"))) as url, httpx.Client(base_url=url) as client:
        body = client.post("/v1/recommend", json={"items": [ids[3], 12, ids[9]], "k": 5}).json()
        check_answer(body, recommend(model, [ids[3], ids[9]], 5))
        assert body["unknown"] == [12]  # an int is not a string id
        assert client.get("/v1/model").json()["file"] is None


def test_ids_sent_as_strings_of_a_numeric_catalogue_are_its_items(server: httpx.Client, model_file: tuple[GRU4Rec, Path]) -> None:
    """Issue 50, item 2: ``{"items": ["360077951"]}`` was the popularity fallback for a model
    of integer ids (a client that ignores "unknown" served popularity to everyone)."""
    model, _ = model_file
    ids = model.item_map.to_list()
    assert all(isinstance(i, int) for i in ids)
    clicks = [ids[3], ids[17], ids[250]]
    sent = [str(ids[3]), f"00{ids[17]}", ids[250]]  # as text, with the leading zeros a CSV reader drops, as a number
    for exclude in (False, True):
        body = server.post("/v1/recommend", json={"items": sent, "k": 7, "exclude_seen": exclude}).json()
        check_answer(body, recommend(model, clicks, 7, exclude))
        assert body["unknown"] == []
    # Not integers: unknown, and named as sent.
    odd = ["12abc", f" {ids[3]}", f"{ids[3]}.0", "1e3", "9" * 40]
    body = server.post("/v1/recommend", json={"items": [*odd, str(ids[8])], "k": 5}).json()
    check_answer(body, recommend(model, [ids[8]], 5))
    assert body["unknown"] == odd
    for t, item in enumerate(clicks):
        body = server.post("/v1/sessions/as-text/events", json={"item": str(item), "k": 6, "seq": t + 1}).json()
        check_answer(body, recommend(model, clicks[: t + 1], 6))
        assert body["unknown"] == [] and body["new_session"] == (t == 0)
    # The retry of the last click, sent as a number this time, is the same click.
    again = server.post("/v1/sessions/as-text/events", json={"item": clicks[-1], "k": 6, "seq": 3}).json()
    check_answer(again, recommend(model, clicks, 6))


def test_integer_ids_of_a_catalogue_of_digit_strings_are_its_items() -> None:
    model = train_small(n_items=80, seed=5, string_ids=True, id_prefix="")
    ids = model.item_map.to_list()
    assert all(isinstance(i, str) and i.isdigit() for i in ids)
    with running(create_app(model, ServeSettings(device="cpu"))) as url, httpx.Client(base_url=url) as client:
        body = client.post("/v1/recommend", json={"items": [int(ids[3]), ids[9], "x"], "k": 5}).json()
        check_answer(body, recommend(model, [ids[3], ids[9]], 5))
        assert body["unknown"] == ["x"]


def test_sessions_of_only_unknown_ids_are_counted_and_logged_once_per_interval(
    model_file: tuple[GRU4Rec, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 50, item 2: a client sending ids the model does not know gets popularity for every
    session; the server counts those answers and says so at WARNING, one line per log interval."""
    model, path = model_file
    ids = model.item_map.to_list()
    settings = ServeSettings(device="cpu", log_interval_s=0.2)
    with caplog.at_level(logging.INFO, logger="gru4rec.serve.app"), running(create_app(path, settings)) as url, \
            httpx.Client(base_url=url) as client:
        def post(route: str, body: dict[str, Any]) -> dict[str, Any]:
            r = client.post(route, json=body)
            assert r.status_code == 200, r.text
            return dict(r.json())

        counted = [
            post("/v1/recommend", {"items": ["sku-1", "sku-2"]}),
            post("/v1/recommend", {"items": [-5]}),
            post("/v1/sessions/lost/events", {"item": "sku-3"}),
            post("/v1/sessions/lost/events", {"item": "sku-4"}),  # still none known
        ]
        not_counted = [
            post("/v1/recommend", {"items": []}),  # no clicks: popularity, but nothing unknown
            post("/v1/recommend", {"items": ["sku-1", ids[4]]}),  # one known id
            post("/v1/sessions/found/events", {"item": ids[4]}),
            post("/v1/sessions/found/events", {"item": "sku-5"}),  # the session has a known click
        ]
        assert [b["fallback"] for b in counted] == [True] * 4
        assert [b["fallback"] for b in not_counted] == [True, False, False, False]
        assert metric(client, "gru4rec_serve_unknown_sessions_total", route="recommend") == 2
        assert metric(client, "gru4rec_serve_unknown_sessions_total", route="event") == 2
        assert metric(client, "gru4rec_serve_popularity_fallbacks_total") == 5

        def warned() -> list[int]:
            return [int(r.getMessage().split()[0]) for r in caplog.records
                    if r.levelno == logging.WARNING and "every item id is unknown" in r.getMessage()]

        deadline = time.monotonic() + 30
        while sum(warned()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(warned()) == 4  # every such answer is in a warning, none twice
        lines = [r.getMessage() for r in caplog.records if r.name == "gru4rec.serve.app"]
        last = next(m for m in reversed(lines) if "every item id is unknown" in m)
        assert "'sku-4'" in last and f"integers such as {ids[0]!r}" in last
        # At most one warning per interval: an activity line (one per interval) before each.
        kinds = ["W" if "every item id is unknown" in m else "A" for m in lines if "every item id" in m or "requests in the last" in m]
        assert "WW" not in "".join(kinds) and kinds[0] == "A"


def test_the_unknown_sessions_warning_is_one_line_per_period() -> None:
    from gru4rec.serve.metrics import ServeMetrics

    metrics = ServeMetrics(lambda: None, dict, dict, dict)
    assert metrics.unknown_line(60, "integers") is None
    for example in (["a"], [], ["b", "c"]):
        metrics.unknown_session("recommend", example)
    line = metrics.unknown_line(60, "integers such as 5")
    assert line is not None and line.startswith("3 answer(s) in the last 60 s") and "e.g. 'c'" in line
    assert metrics.unknown_line(60, "integers") is None  # a new period: nothing yet


def test_the_model_s_repeat_boost_is_shown_at_start_up_and_in_v1_model(
    model_file: tuple[GRU4Rec, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, item 5: a model with repeat-aware scoring says so; its answers carry the boost."""
    model, _ = model_file
    boosted = GRU4Rec.load(model_file[1], device="cpu")
    boosted.config = boosted.config.replace(repeat_weight=5.0, repeat_decay=0.8)
    path = tmp_path / "boosted.safetensors"
    boosted.save(path)
    with caplog.at_level("INFO", logger="gru4rec.serve.app"):
        app = create_app(path, ServeSettings(device="cpu", scoring="float32"))
    assert any("scoring float32, repeat boost weight 5 decay 0.8, sessions in memory" in r.getMessage() for r in caplog.records)
    ids = model.item_map.to_list()
    clicks = [ids[4], ids[9], ids[4]]
    with running(app) as url, httpx.Client(base_url=url) as client:
        assert client.get("/v1/model").json()["repeat_boost"] == {"weight": 5.0, "decay": 0.8}
        body = client.post("/v1/recommend", json={"items": clicks, "k": 5}).json()
        check_answer(body, recommend(GRU4Rec.load(path, device="cpu"), clicks, 5))
        plain_items, plain_scores = recommend(model, clicks, 5)
        assert (body["items"], body["scores"]) != (plain_items, plain_scores)  # the boost changed the answer
    caplog.clear()
    with caplog.at_level("INFO", logger="gru4rec.serve.app"):
        plain = create_app(model_file[1], ServeSettings(device="cpu", scoring="float32"))
    assert not any("repeat boost" in r.getMessage() for r in caplog.records)
    with running(plain) as url, httpx.Client(base_url=url) as client:
        assert client.get("/v1/model").json()["repeat_boost"] is None
