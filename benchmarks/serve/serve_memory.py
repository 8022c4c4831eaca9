"""Memory per live session of ``gru4rec serve``, measured, for the memory store and for Redis.

A session's state is its hidden state (float32, every layer: 512 floats for the DIGINETICA
configuration) and its known items (int32), in the layout of ``gru4rec.serve.state``. This
script fills

* a :class:`~gru4rec.serve.state.MemoryStore` with ``--sessions`` states in this process and
  reads the growth of the resident set (``/proc/self/statm``), and
* a real ``redis-server`` (started here on a free loopback port, no persistence, stopped at the
  end) through :class:`~gru4rec.serve.state.RedisStore` and reads the growth of its
  ``used_memory`` (``INFO memory``),

and prints bytes per session and what 1M live sessions need, as one JSON line per store.

    python -m benchmarks.serve.serve_memory --sessions 200000 --hidden 512 --clicks 5
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys

import numpy as np

from benchmarks.serve.serve_load import redis_binary, start_redis
from gru4rec.inference import SessionState
from gru4rec.serve.state import LastClick, MemoryStore, RedisStore, encode_session


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


#: The length of the last answer each stored session keeps (the server's default k).
K = 20


def encoded(hidden: np.ndarray, seen: np.ndarray, answer: np.ndarray, scores: np.ndarray) -> bytes:
    """A stored session as the server writes it: the state and the answer to its last click."""
    return encode_session(SessionState(hidden, seen), len(seen), LastClick(int(seen[-1]), answer, scores, False, False))


def states(n: int, hidden: int, clicks: int, seed: int = 0) -> list[tuple[str, bytes | None, bytes]]:
    """``n`` writes of new sessions (id, expected None, stored bytes), with ids as a web shop's
    would look (uuid-like)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[str, bytes | None, bytes]] = []
    for i in range(n):
        value = encoded(rng.standard_normal(hidden).astype(np.float32), rng.integers(0, 43_097, clicks).astype(np.int32),
                        rng.integers(0, 43_097, K).astype(np.int32), rng.standard_normal(K).astype(np.float32))
        out.append((f"{i:08x}-{rng.integers(1 << 62):016x}", None, value))
    return out


def measure_memory(n: int, hidden: int, clicks: int) -> dict[str, float]:
    store = MemoryStore(max_sessions=n + 1, ttl_s=3600)
    gc.collect()
    before = rss_bytes()
    for start in range(0, n, 10_000):
        store.compare_and_set(states(min(10_000, n - start), hidden, clicks, seed=start + 1))
    gc.collect()
    grown = rss_bytes() - before
    assert store.size() == n
    return {"store": "memory", "sessions": n, "bytes_per_session": round(grown / n), "gib_per_1m": round(grown / n * 1e6 / 2**30, 2)}


def measure_redis(n: int, hidden: int, clicks: int) -> dict[str, float] | None:
    if redis_binary() is None:
        print("redis-server is not installed: no Redis figure", file=sys.stderr)
        return None
    import redis

    proc, url, workdir = start_redis()
    try:
        client = redis.Redis.from_url(url)
        store = RedisStore(url, ttl_s=3600, namespace="0123456789abcdef")
        before = int(client.info("memory")["used_memory"])
        for start in range(0, n, 10_000):
            store.compare_and_set(states(min(10_000, n - start), hidden, clicks, seed=start + 1))
        grown = int(client.info("memory")["used_memory"]) - before
        assert client.dbsize() == n
        store.close()
        client.close()
        return {"store": "redis", "sessions": n, "bytes_per_session": round(grown / n), "gib_per_1m": round(grown / n * 1e6 / 2**30, 2)}
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--hidden", type=int, default=512, help="floats of hidden state (sum of the layers)")
    parser.add_argument("--clicks", type=int, default=5, help="known items per session")
    args = parser.parse_args(argv)
    payload = len(encoded(np.zeros(args.hidden, np.float32), np.zeros(args.clicks, np.int32), np.zeros(K, np.int32),
                          np.zeros(K, np.float32)))
    print(json.dumps({"state_bytes": payload, "hidden": args.hidden, "clicks": args.clicks}), flush=True)
    print(json.dumps(measure_memory(args.sessions, args.hidden, args.clicks)), flush=True)
    line = measure_redis(args.sessions, args.hidden, args.clicks)
    if line is not None:
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
