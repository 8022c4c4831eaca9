"""A served model replaced without downtime (``gru4rec.serve.reload``): SIGHUP and ``--watch``
against a real ``gru4rec serve`` process, under a bounded load. No request fails; answers after
the switch are the new model's ``recommend``; a live session continues from the state the old
model left (checked against the two networks stepped by hand); a file that fails its checks is
refused and the old model keeps answering; another architecture starts sessions afresh."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.datasets.synthetic import generate  # noqa: E402
from gru4rec.inference import Engine  # noqa: E402
from gru4rec.serve.app import create_app  # noqa: E402
from gru4rec.serve.batcher import Job, MicroBatcher  # noqa: E402
from gru4rec.serve.reload import file_sha256  # noqa: E402
from gru4rec.serve.settings import ServeSettings  # noqa: E402
from gru4rec.serve.state import MemoryStore  # noqa: E402
from serve_helpers import SMALL, httpx, recommend, redis_server, running, train_small  # noqa: E402
from test_serve_cli import environment, processes_fixture, start, stop, wait_healthy  # noqa: E402,F401

K = 10


@pytest.fixture(scope="module")
def models() -> dict[str, GRU4Rec]:
    """Yesterday's model, today's warm start of it (new items appended), and a model of another
    architecture on the same data."""
    old = train_small(seed=3)
    today = generate(n_sessions=200, n_items=80, seed=9)
    today["ItemId"] += 5_000  # new items
    yesterday = generate(n_sessions=400, n_items=300, seed=3)
    both = pd.concat([yesterday[yesterday["SessionId"] < 150], today.assign(SessionId=today["SessionId"] + 100_000)],
                     ignore_index=True)
    warm = GRU4Rec(SMALL, device="cpu", threads=1).fit(both, progress=False, init_from=old)
    other = GRU4Rec(SMALL.replace("layers=24/16", "layers=20"), device="cpu", threads=1).fit(yesterday, progress=False)
    assert len(warm.item_map) > len(old.item_map)
    return {"old": old, "warm": warm, "other": other}


def replace_atomically(model: GRU4Rec, path: Path) -> None:
    """What a daily job does: write beside the served file, then rename over it."""
    tmp = path.with_name(path.name + ".new")
    model.save(tmp, overwrite=True)
    os.replace(tmp, path)


def serve(path: Path, processes: list, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = start(["-m", "gru4rec", "serve", str(path), "--port", "0", "--device", "cpu", "--scoring", "float32",
                  "--threads", "1", *extra], environment())
    processes.append(proc)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    url = line.split(" at ")[1].split()[0]
    wait_healthy(url, proc)
    return proc, url


def serve_model(model: GRU4Rec, tmp_path: Path, processes: list, *extra: str) -> tuple[Path, Any, str]:
    """``model`` saved to tmp_path/model.safetensors and served from there: (path, process, url)."""
    path = tmp_path / "model.safetensors"
    model.save(path)
    return (path, *serve(path, processes, *extra))


def wait_for_info(url: str, done: Any, what: str, timeout_s: float = 60) -> dict[str, Any]:
    """The server's /v1/model once ``done(info)``; AssertionError ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = httpx.get(url + "/v1/model").json()
        if done(info):
            return info
        time.sleep(0.05)
    raise AssertionError(what)


def wait_for_model(url: str, sha: str, timeout_s: float = 60) -> dict[str, Any]:
    return wait_for_info(url, lambda info: info["sha256"] == sha, f"the server did not switch to {sha[:12]}", timeout_s)


def continued(old: GRU4Rec, new: GRU4Rec, before: list[Any], click: Any) -> tuple[list[Any], np.ndarray]:
    """A session's answer after ``click`` when the old model saw ``before``: the old network's
    state, one step of the new network, the new scores, top-k. Written out with the networks."""
    with torch.no_grad():
        hidden = old.net.init_hidden(1)
        for item in old.item_map.index_of(before):
            old.net.step(torch.tensor([int(item)]), hidden)
        out = new.net.step(torch.tensor([int(new.item_map.index_of([click])[0])]), hidden)
        scores = new.net.score_all(out)[0]
        top = torch.topk(scores, K)
    return new.item_map.ids[top.indices.numpy()].tolist(), top.values.numpy()


def test_a_job_indexed_by_the_old_model_is_answered_by_the_new_one_by_id(models: dict[str, GRU4Rec]) -> None:
    old, other = Engine(models["old"], scoring="float32"), Engine(models["other"], scoring="float32")
    batcher = MicroBatcher(old, MemoryStore(100, 60.0))
    ids = models["old"].item_map.to_list()
    clicks = [ids[3], ids[7], ids[11]]
    known, _ = old.index_of(clicks)
    batcher.swap(other, keep_sessions=other.keeps_states_of(old), namespace="x").result()
    job = Job("recommend", None, known, K, engine=old)
    batcher._run([job])
    result = job.future.result()
    assert result.engine is other
    want_ids, want_scores = recommend(models["other"], clicks, K)
    assert [other.item_ids[i] for i in result.answer.items.tolist()] == want_ids
    np.testing.assert_allclose(result.answer.scores, want_scores, rtol=1e-5, atol=1e-6)
    assert not other.keeps_states_of(old) and Engine(models["warm"]).keeps_states_of(old)


def test_the_switch_falls_between_two_batches(models: dict[str, GRU4Rec]) -> None:
    """Jobs queued before the model change run in a batch on the old model, jobs after it on the
    new one (the worker's loop, run here on the test's thread)."""
    from gru4rec.serve.batcher import _Swap

    old, warm = Engine(models["old"], scoring="float32"), Engine(models["warm"], scoring="float32")
    batcher = MicroBatcher(old, MemoryStore(100, 60.0), max_batch=8)
    ids = models["old"].item_map.to_list()
    jobs = [Job("recommend", None, old.index_of([ids[i]])[0], K, engine=old) for i in (1, 2, 3)]
    change = _Swap(warm, True, "x")
    for item in (jobs[0], jobs[1], change, jobs[2], None):
        batcher._queue.put(item)
    batcher._loop()
    results = [job.future.result() for job in jobs]
    assert [r.engine for r in results] == [old, old, warm] and change.done.result() is warm and batcher.engine is warm
    for job, result, model in zip(jobs, results, ("old", "old", "warm")):
        want = recommend(models[model], [old.item_ids[int(job.items[0])]], K)
        assert [result.engine.item_ids[i] for i in result.answer.items.tolist()] == want[0]


def test_sighup_switches_to_the_warm_start_under_load_without_a_failed_request(
    models: dict[str, GRU4Rec], tmp_path: Path, processes: list
) -> None:
    old, warm = models["old"], models["warm"]
    path, proc, url = serve_model(old, tmp_path, processes)
    ids = old.item_map.to_list()
    session = [ids[5], ids[17], ids[2]]
    with httpx.Client(base_url=url, timeout=30) as client:
        for item in session:
            assert client.post("/v1/sessions/live/events", json={"item": item, "k": K}).status_code == 200
    rng = np.random.default_rng(0)
    queries = [[ids[i] for i in rng.integers(0, len(ids), rng.integers(1, 5))] for _ in range(40)]
    old_answers = [recommend(old, q, K) for q in queries]
    new_answers = [recommend(warm, q, K) for q in queries]
    records: list[tuple[float, int, int, Any]] = []  # (sent at, query, status, body)
    stop_load = threading.Event()
    max_requests, deadline = 3000, time.monotonic() + 60

    def load(worker: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            n = worker
            while not stop_load.is_set() and len(records) < max_requests and time.monotonic() < deadline:
                q = n % len(queries)
                sent = time.monotonic()
                response = client.post("/v1/recommend", json={"items": queries[q], "k": K})
                records.append((sent, q, response.status_code, response.json()))
                n += 4

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    replace_atomically(warm, path)
    new_sha = file_sha256(path)
    proc.send_signal(signal.SIGHUP)
    info = wait_for_model(url, new_sha)
    switched = time.monotonic()
    time.sleep(0.5)
    stop_load.set()
    for t in threads:
        t.join(60)
    assert info["n_items"] == len(warm.item_map) and info["reloads"] == {"done": 1, "refused": 0}
    assert records and all(status == 200 for _, _, status, _ in records), [r for r in records if r[2] != 200][:3]
    assert len([r for r in records if r[0] > switched]) >= 10, "too few requests after the switch to mean anything"
    for sent, q, _, body in records:
        answer = (body["items"], body["scores"])
        if sent > switched:
            assert answer[0] == new_answers[q][0], "a request sent after the switch got another model's answer"
            np.testing.assert_allclose(answer[1], new_answers[q][1], rtol=1e-5, atol=1e-6)
        else:
            assert answer[0] in (old_answers[q][0], new_answers[q][0])  # in flight during the switch: either
    assert any(sent <= switched and body["items"] == old_answers[q][0] != new_answers[q][0] for sent, q, _, body in records), \
        "no request was answered by the old model: the load did not overlap the switch"
    # The live session keeps its state: one more click, answered by the new network from the old state.
    new_item = warm.item_map.to_list()[-1]  # an item only the new model knows
    body = httpx.post(url + "/v1/sessions/live/events", json={"item": new_item, "k": K}).json()
    want_ids, want_scores = continued(old, warm, session, new_item)
    assert body["new_session"] is False and body["unknown"] == []
    assert body["items"] == want_ids
    np.testing.assert_allclose(body["scores"], want_scores, rtol=1e-5, atol=1e-6)
    code, _, err = stop(proc, signal.SIGTERM)
    assert code == 0 and f"Now serving {path}: sha256 {new_sha[:12]}" in err and "live sessions kept" in err, err[-2000:]


def test_a_file_that_fails_its_checks_is_refused_and_the_old_model_keeps_serving(
    models: dict[str, GRU4Rec], tmp_path: Path, processes: list
) -> None:
    old = models["old"]
    path, proc, url = serve_model(old, tmp_path, processes)
    old.save(tmp_path / "copy.safetensors")
    sha = file_sha256(path)
    ids = old.item_map.to_list()
    query = [ids[1], ids[9]]
    damaged = bytearray(path.read_bytes())
    damaged[-5] ^= 0xFF  # a flipped byte in the last tensor: its checksum no longer matches
    tmp = tmp_path / "damaged"
    tmp.write_bytes(bytes(damaged))
    os.replace(tmp, path)
    proc.send_signal(signal.SIGHUP)
    wait_for_info(url, lambda info: info["reloads"]["refused"] >= 1, "the damaged file was not refused", 30)
    broken = GRU4Rec.load(tmp_path / "copy.safetensors", device="cpu")
    with torch.no_grad():
        broken.net.Wy[3, 0] = float("nan")
    replace_atomically(broken, path)
    proc.send_signal(signal.SIGHUP)
    wait_for_info(url, lambda info: info["reloads"]["refused"] >= 2, "the file with a NaN weight was not refused", 30)
    info = httpx.get(url + "/v1/model").json()
    assert info["sha256"] == sha and info["reloads"]["done"] == 0
    body = httpx.post(url + "/v1/recommend", json={"items": query, "k": K}).json()
    assert (body["items"], body["scores"])[0] == recommend(old, query, K)[0]
    code, _, err = stop(proc, signal.SIGTERM)
    refusals = [line for line in err.splitlines() if "Refused the new model" in line]
    assert code == 0 and len(refusals) == 2, err[-2000:]
    assert "corrupt" in refusals[0] and "not finite in Wy" in refusals[1] and f"still serving sha256 {sha[:12]}" in refusals[1]


def test_watch_picks_up_a_replaced_file_and_another_architecture_starts_sessions_afresh(
    models: dict[str, GRU4Rec], tmp_path: Path, processes: list
) -> None:
    old, other = models["old"], models["other"]
    path, proc, url = serve_model(old, tmp_path, processes, "--watch", "0.2")
    ids = old.item_map.to_list()
    assert httpx.post(url + "/v1/sessions/s1/events", json={"item": ids[4], "k": K}).json()["new_session"] is True
    assert httpx.post(url + "/v1/sessions/s1/events", json={"item": ids[6], "k": K}).json()["new_session"] is False
    replace_atomically(other, path)  # no signal: the watch sees the new inode
    info = wait_for_model(url, file_sha256(path))
    assert info["layers"] == [20] and info["n_items"] == len(other.item_map)
    item = other.item_map.to_list()[2]
    body = httpx.post(url + "/v1/sessions/s1/events", json={"item": item, "k": K}).json()
    assert body["new_session"] is True  # the old state means nothing to another architecture
    assert body["items"] == recommend(other, [item], K)[0]
    code, _, err = stop(proc, signal.SIGTERM)
    assert code == 0 and "live sessions start afresh" in err, err[-2000:]


def test_sessions_in_redis_survive_a_warm_start_and_not_another_architecture(models: dict[str, GRU4Rec], tmp_path: Path) -> None:
    old, warm, other = models["old"], models["warm"], models["other"]
    path = tmp_path / "model.safetensors"
    old.save(path)
    ids = old.item_map.to_list()
    with redis_server(tmp_path) as redis_url:
        app = create_app(path, ServeSettings(device="cpu", scoring="float32", state=redis_url))
        with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            for item in (ids[2], ids[8]):
                client.post("/v1/sessions/r1/events", json={"item": item, "k": K})
            replace_atomically(warm, path)
            assert app.state.reloader.reload()  # what SIGHUP starts, here synchronously
            click = warm.item_map.to_list()[-1]
            body = client.post("/v1/sessions/r1/events", json={"item": click, "k": K}).json()
            assert body["new_session"] is False and body["items"] == continued(old, warm, [ids[2], ids[8]], click)[0]
            replace_atomically(other, path)
            assert app.state.reloader.reload() and not app.state.reloader.reload()  # the second: unchanged
            body = client.post("/v1/sessions/r1/events", json={"item": ids[2], "k": K}).json()
            assert body["new_session"] is True and body["items"] == recommend(other, [ids[2]], K)[0]


def test_a_refused_file_marks_the_model_stale_until_a_good_file_arrives(
    models: dict[str, GRU4Rec], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, item 6: after a refused (truncated) file the server serves the old model from
    memory, but a restart would load the broken file: /healthz and /v1/model say so, a warning
    repeats, and --watch keeps trying until a good file arrives."""
    old, warm = models["old"], models["warm"]
    path = tmp_path / "model.safetensors"
    old.save(path)
    sha = file_sha256(path)
    app = create_app(path, ServeSettings(device="cpu", scoring="float32", watch_s=0.1, log_interval_s=0.1))
    with caplog.at_level("WARNING", logger="gru4rec.serve"), running(app) as url, httpx.Client(base_url=url) as client:
        assert client.get("/healthz").json()["stale"] is False and client.get("/v1/model").json()["stale"] is False
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # a copy cut short, in place
        info = wait_for_info(url, lambda info: info["stale"], "the truncated file was not flagged", 30)
        assert info["sha256"] == sha and info["reloads"]["refused"] >= 1
        assert info["stale_reason"].startswith(f"the new model in {path} was refused: ")
        health = client.get("/healthz").json()
        assert health["status"] == "ok" and health["stale"] is True and health["stale_reason"] == info["stale_reason"]
        deadline = time.monotonic() + 30
        while sum("Stale model file" in r.getMessage() for r in caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        warnings = [r.getMessage() for r in caplog.records if "Stale model file" in r.getMessage()]
        assert len(warnings) >= 2 and "a restart would load the file on disk" in warnings[0]  # it repeats
        ids = old.item_map.to_list()
        assert client.post("/v1/recommend", json={"items": [ids[3]], "k": K}).json()["items"] == recommend(old, [ids[3]], K)[0]
        replace_atomically(warm, path)  # the good file: the watch, still trying, takes it
        info = wait_for_model(url, file_sha256(path))
        assert info["stale"] is False and info["stale_reason"] is None and client.get("/healthz").json()["stale"] is False
        assert "stale_reason" not in client.get("/healthz").json()
