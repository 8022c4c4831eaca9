"""Serving a model with click context (issue 49, point 3) over real HTTP: a click's ``time`` and
the session's previous click time kept with its state give the gap (the answers equal
``GRU4Rec.recommend`` with those times, not with others); a stateless request takes ``times``;
a bad time is one 4xx naming the field; a plain model ignores the field."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gru4rec import GRU4Rec
from gru4rec.datasets.synthetic import generate
from gru4rec.serve import ServeSettings, create_app
from serve_helpers import SMALL, httpx, running  # noqa: E402 - skips without the serve extra


@pytest.fixture(scope="module")
def context_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRU4Rec, Path]:
    events = generate(n_sessions=300, n_items=120, seed=2)
    model = GRU4Rec(SMALL + ",click_context=True", device="cpu").fit(events, progress=False)
    path = tmp_path_factory.mktemp("serve-context") / "model.safetensors"
    model.save(path)
    return GRU4Rec.load(path, device="cpu"), path


@pytest.fixture(scope="module")
def server(context_model: tuple[GRU4Rec, Path]) -> Iterator[httpx.Client]:
    _, path = context_model
    with running(create_app(path, ServeSettings(device="cpu"))) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def scores_of(model: GRU4Rec, items: list[Any], times: list[float], k: int) -> tuple[list[Any], np.ndarray]:
    recs = model.recommend(items, k=k, times=times)
    return recs.item_ids.tolist(), recs.scores


def test_two_clicks_with_their_times_give_the_state_their_gap(server: httpx.Client, context_model: tuple[GRU4Rec, Path]) -> None:
    model, _ = context_model
    ids = model.item_map.to_list()  # type: ignore[union-attr]
    t1, t2 = 1_700_000_000.0, 1_700_000_000.0 + 1234.5
    first = server.post("/v1/sessions/s1/events", json={"item": ids[5], "k": 10, "time": t1})
    assert first.status_code == 200, first.text
    items, scores = scores_of(model, [ids[5]], [t1], 10)
    assert first.json()["items"] == items
    np.testing.assert_allclose(first.json()["scores"], scores, rtol=1e-5, atol=1e-5)
    second = server.post("/v1/sessions/s1/events", json={"item": ids[9], "k": 10, "time": t2}).json()
    items, scores = scores_of(model, [ids[5], ids[9]], [t1, t2], 10)
    assert second["items"] == items
    np.testing.assert_allclose(second["scores"], scores, rtol=1e-5, atol=1e-5)
    # Another gap gives other scores: the state's previous time is what the answer used.
    _, other = scores_of(model, [ids[5], ids[9]], [t1, t2 - 1200.0], 10)
    assert np.abs(np.asarray(second["scores"]) - other).max() > 1e-4


def test_a_stateless_request_takes_its_clicks_times(server: httpx.Client, context_model: tuple[GRU4Rec, Path]) -> None:
    model, _ = context_model
    ids = model.item_map.to_list()  # type: ignore[union-attr]
    times = [1_700_100_000.0, 1_700_100_090.0, 1_700_107_000.0]
    body = server.post("/v1/recommend", json={"items": [ids[1], "no-such-item", ids[2]], "k": 7,
                                               "times": times}).json()
    items, scores = scores_of(model, [ids[1], ids[2]], [times[0], times[2]], 7)  # the unknown click and its time dropped
    assert body["items"] == items
    np.testing.assert_allclose(body["scores"], scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("body", "status", "says"), [
    ('{"item": 1, "time": "noon"}', 422, "'time' must be a number"),
    ('{"item": 1, "time": true}', 422, "'time' must be a number"),
    ('{"item": 1, "time": 1e400}', 422, "'time' must be a finite number"),
    ('{"item": 1, "time": NaN}', 400, "NaN is not valid JSON"),
])
def test_a_bad_time_is_one_4xx_naming_it(server: httpx.Client, body: str, status: int, says: str) -> None:
    r = server.post("/v1/sessions/bad/events", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and says in r.json()["error"]


def test_bad_times_of_a_stateless_request(server: httpx.Client) -> None:
    r = server.post("/v1/recommend", json={"items": [1, 2], "times": [1.0]})
    assert r.status_code == 422 and "'times' must be an array of 2 numbers" in r.json()["error"]
    r = server.post("/v1/recommend", json={"items": [1, 2], "times": [1.0, "later"]})
    assert r.status_code == 422 and "'times[1]' must be a number" in r.json()["error"]


def test_a_plain_model_ignores_the_time(tmp_path: Path) -> None:
    from serve_helpers import train_small

    model = train_small(n_items=80)
    path = tmp_path / "plain.safetensors"
    model.save(path)
    ids = model.item_map.to_list()  # type: ignore[union-attr]
    with running(create_app(path, ServeSettings(device="cpu"))) as url, httpx.Client(base_url=url, timeout=30) as client:
        timed = client.post("/v1/sessions/a/events", json={"item": ids[3], "k": 5, "time": 1.0}).json()
        bare = client.post("/v1/sessions/b/events", json={"item": ids[3], "k": 5}).json()
    assert timed["items"] == bare["items"] and timed["scores"] == bare["scores"]


def test_two_replicas_on_one_redis_keep_the_last_click_time(tmp_path: Path, context_model: tuple[GRU4Rec, Path]) -> None:
    """The state in Redis (layout 3) carries the previous click's time from one replica to the
    other: alternate replicas answer a timed session as recommend does on all its clicks' times,
    a sent-again click (same seq) is answered from the stored answer."""
    from serve_helpers import redis_server

    model, path = context_model
    ids = model.item_map.to_list()  # type: ignore[union-attr]
    clicks = [ids[4], ids[17], ids[4], ids[30]]
    times = [1_700_200_000.0, 1_700_200_050.0, 1_700_203_000.0, 1_700_290_000.0]
    with redis_server(tmp_path) as url:
        settings = ServeSettings(device="cpu", state=url)
        with running(create_app(path, settings)) as a, running(create_app(path, settings)) as b, \
                httpx.Client(base_url=a) as replica_a, httpx.Client(base_url=b) as replica_b:
            for t, (item, when) in enumerate(zip(clicks, times)):
                replica = (replica_a, replica_b)[t % 2]
                body = replica.post("/v1/sessions/timed/events", json={"item": item, "k": 6, "time": when, "seq": t + 1}).json()
                items, scores = scores_of(model, clicks[: t + 1], times[: t + 1], 6)
                assert body["items"] == items, t
                np.testing.assert_allclose(body["scores"], scores, rtol=1e-5, atol=1e-5)
            again = replica_a.post("/v1/sessions/timed/events", json={"item": clicks[-1], "k": 6, "time": times[-1], "seq": 4}).json()
            assert again["items"] == body["items"] and again["scores"] == body["scores"]
