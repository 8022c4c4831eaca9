"""benchmarks/serve/serve_load.py's arithmetic and its load generator on a tiny real server (a bounded
run: the counts it reports are checked, its timings are not)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gru4rec.serve import ServeSettings, create_app  # noqa: E402
from script_modules import import_module
from serve_helpers import running, train_small  # noqa: E402 - skips without the serve extra

ROOT = Path(__file__).resolve().parents[1]
serve_load = import_module("benchmarks.serve.serve_load")


def test_summarize_is_numpy_percentiles_and_the_rate() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    got = serve_load.summarize(latencies, elapsed_s=4.0)
    assert got == {"p50_ms": 50.5, "p95_ms": 95.05, "p99_ms": 99.01, "requests_per_s": 25.0}
    assert np.isnan(serve_load.summarize([], 1.0)["p50_ms"])


def test_sessions_are_replayed_click_by_click_or_as_growing_prefixes() -> None:
    assert serve_load.requests_of([7, 8, 9], "stateful", "u1") == [
        ("/v1/sessions/u1/events", {"item": 7, "k": 20}),
        ("/v1/sessions/u1/events", {"item": 8, "k": 20}),
        ("/v1/sessions/u1/events", {"item": 9, "k": 20}),
    ]
    assert [body["items"] for _, body in serve_load.requests_of([7, 8, 9], "stateless", "u1")] == [[7], [7, 8], [7, 8, 9]]


@pytest.mark.parametrize("mode", ["stateful", "stateless"])
def test_the_closed_loop_stops_after_its_requests(mode: str) -> None:
    pytest.importorskip("aiohttp", reason="the load generator needs aiohttp")
    model = train_small(n_items=60, seed=2)
    ids = model.item_map.to_list()
    sessions = [[ids[1], ids[2], ids[3]], [ids[4], ids[5]]]
    with running(create_app(model, ServeSettings(device="cpu"))) as url:
        got = asyncio.run(serve_load.closed_loop([url], mode, sessions, concurrency=3, max_requests=25, max_seconds=60,
                                                 warmup=5, tag="t"))
    assert got["errors"] == 0
    assert 25 <= got["requests"] <= 25 + 2  # users still waiting on an answer when the count is reached finish it
    assert got["p50_ms"] <= got["p95_ms"] <= got["p99_ms"] and got["requests_per_s"] > 0


def test_the_synthetic_catalogue_is_filled_to_its_size() -> None:
    import pandas as pd

    train = pd.DataFrame({"SessionId": [1, 1, 2, 2], "ItemId": [10, 11, 11, 12], "Time": [5, 6, 7, 8]})
    filled = serve_load._fill_catalogue(train, 7)
    assert filled["ItemId"].nunique() == 7 and len(filled) == 4 + 2 * 4
    pd.testing.assert_frame_equal(filled.iloc[:4], train)
    extra = filled.iloc[4:]
    assert set(extra["ItemId"]) - {10, 11, 12} == {13, 14, 15, 16}  # the new items, each in one two-click session
    assert (extra.groupby("SessionId").size() == 2).all() and extra["SessionId"].min() > 2
    assert serve_load._fill_catalogue(train, 3) is train
