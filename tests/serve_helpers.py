"""Shared by the serving tests (tests/test_serve_*.py): small trained models, a real
``redis-server`` on a free loopback port, and a real uvicorn server in a thread.

Every server listens on 127.0.0.1 only and is stopped at the end of its ``with`` block or
fixture, also when the test fails.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason="the serving tests need the serve extra: pip install 'gru4rec[serve]'")
httpx = pytest.importorskip("httpx", reason="the serving tests need httpx")
uvicorn = pytest.importorskip("uvicorn", reason="the serving tests need uvicorn")

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.datasets.synthetic import generate  # noqa: E402

REDIS_SERVER = os.environ.get("GRU4REC_TEST_REDIS_SERVER") or shutil.which("redis-server") or (
    "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)

#: Two layers, so that the state kept between clicks is more than the last layer's output.
SMALL = "layers=24/16,batch_size=16,n_sample=32,n_epochs=1,sample_store_size=2000,dropout_p_hidden=0.0"


def train_small(n_items: int = 300, seed: int = 1, *, string_ids: bool = False, id_prefix: str = "item-") -> GRU4Rec:
    """A GRU4Rec trained for one epoch on synthetic sessions (a second on one thread); with
    ``string_ids`` its ids are strings, ``id_prefix`` and the synthetic integer id."""
    events = generate(n_sessions=400, n_items=n_items, seed=seed)
    if string_ids:
        events["ItemId"] = id_prefix + events["ItemId"].astype(str)
    return GRU4Rec(SMALL, device="cpu").fit(events, progress=False)


def recommend(model: GRU4Rec, items: list[Any], k: int, exclude_seen: bool = False) -> tuple[list[Any], list[float] | None]:
    """``GRU4Rec.recommend`` as the server answers it: ids, and scores (None for the fallback)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown items are expected in these sessions
        recs = model.recommend(items, k=k, exclude_seen=exclude_seen)
    if recs.fallback:  # popular items, no model scores (NaN in the Python API)
        return recs.item_ids.tolist(), None
    finite = np.isfinite(recs.scores)  # exclude_seen leaves -inf where fewer than k items remain
    return recs.item_ids[finite].tolist(), recs.scores[finite].tolist()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


class RedisProcess:
    """A real redis-server on a loopback port in ``directory``: with ``password`` it requires
    one, with ``aof`` it keeps an append-only file fsynced on every write, so that a restart
    (:meth:`kill` then :meth:`start`, same port and folder) comes back with every write."""

    def __init__(self, directory: Path, *, password: str | None = None, aof: bool = False) -> None:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
        self.directory, self.password, self.aof = directory, password, aof
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else ["--appendonly", "no"]
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persistence, *auth,
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start (exit code {self.proc.poll()})") from None
                time.sleep(0.05)
            except redis.ResponseError:  # loading its append-only file
                time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        """``kill -9``: no shutdown, nothing saved but what the append-only file holds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def redis_process(tmp_path: Path, *, password: str | None = None, aof: bool = False) -> Iterator[RedisProcess]:
    """A started :class:`RedisProcess`, stopped on exit."""
    server = RedisProcess(tmp_path, password=password, aof=aof)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def redis_server(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on a free loopback port (no persistence), stopped on exit; its URL."""
    with redis_process(tmp_path) as server:
        yield server.url


torch.set_num_threads(1)
