"""Session stores: the state's byte layout, the memory store's LRU cap and TTL with their
counters, and the Redis store against a real redis-server."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gru4rec.inference import SessionState
from gru4rec.serve.state import MemoryStore, RedisStore, StoreUnavailable, decode_state, encode_state, open_store
from serve_helpers import free_port, redis_server


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(seed: int, n_hidden: int = 40, n_seen: int = 3) -> SessionState:
    rng = np.random.default_rng(seed)
    return SessionState(rng.standard_normal(n_hidden).astype(np.float32), rng.integers(0, 500, n_seen).astype(np.int32))


def test_state_bytes_round_trip_exactly() -> None:
    s = state(1)
    data = encode_state(s)
    assert len(data) == 14 + 4 * 40 + 4 * 3
    back = decode_state(data, 40)
    assert back is not None
    np.testing.assert_array_equal(back.hidden, s.hidden)  # bit for bit: float32 stays float32
    np.testing.assert_array_equal(back.seen, s.seen)
    empty = decode_state(encode_state(SessionState()), 40)
    assert empty is not None and empty.hidden is None and len(empty.seen) == 0


@pytest.mark.parametrize("damage", ["short", "magic", "size", "truncated", "version"])
def test_foreign_or_damaged_state_bytes_are_refused(damage: str) -> None:
    data = bytearray(encode_state(state(2)))
    if damage == "short":
        data = data[:5]
    elif damage == "magic":
        data[0:4] = b"XXXX"
    elif damage == "size":
        return_value = decode_state(bytes(data), 41)  # another model's hidden size
        assert return_value is None
        return
    elif damage == "truncated":
        data = data[:-2]
    else:
        data[4] = 9
    assert decode_state(bytes(data), 40) is None


def test_memory_store_drops_the_least_recently_used_beyond_the_cap() -> None:
    clock = FakeClock()
    store = MemoryStore(3, ttl_s=100, clock=clock)
    store.put_many([("a", b"1"), ("b", b"2"), ("c", b"3")])
    clock.now += 1
    assert store.get_many(["a"]) == [b"1"]  # a read does not count as use: only writes do
    store.put_many([("a", b"1b")])  # a is now the most recent
    store.put_many([("d", b"4")])  # b is the least recently used
    assert store.get_many(["a", "b", "c", "d"]) == [b"1b", None, b"3", b"4"]
    assert store.evictions == {"capacity": 1, "ttl": 0} and store.size() == 3
    store.put_many([("e", b"5"), ("f", b"6")])
    assert store.get_many(["c", "a", "d", "e", "f"]) == [None, None, b"4", b"5", b"6"]  # order was c, a, d
    assert store.evictions["capacity"] == 3


def test_memory_store_expires_sessions_after_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryStore(100, ttl_s=10, clock=clock)
    store.put_many([("old", b"x")])
    clock.now += 6
    store.put_many([("young", b"y")])
    clock.now += 5  # old: 11 s since its last click, young: 5 s
    assert store.get_many(["old", "young"]) == [None, b"y"]
    assert store.evictions == {"capacity": 0, "ttl": 1}
    clock.now += 6  # young: 11 s; the next write sweeps it from the front
    store.put_many([("new", b"z")])
    assert store.size() == 1 and store.evictions["ttl"] == 2
    assert store.delete("new") and not store.delete("new")


def test_open_store_refuses_unknown_specs_and_reports_a_dead_redis() -> None:
    with pytest.raises(ValueError, match="memory' or a redis:// URL"):
        open_store("postgres://x", max_sessions=10, ttl_s=10, namespace="n")
    with pytest.raises(StoreUnavailable, match=r"Redis at redis://127\.0\.0\.1:\d+/0 failed on PING"):
        open_store(f"redis://127.0.0.1:{free_port()}/0", max_sessions=10, ttl_s=10, namespace="n")


def test_redis_store_against_a_real_server(tmp_path: Path) -> None:
    with redis_server(tmp_path) as url:
        store = open_store(url, max_sessions=10, ttl_s=0.3, namespace="abc")
        assert isinstance(store, RedisStore) and store.size() is None
        s = state(3)
        store.put_many([("s1", encode_state(s)), ("s2", b"other")])
        got = store.get_many(["s1", "s2", "nope"])
        assert got[1] == b"other" and got[2] is None
        back = decode_state(got[0], 40)  # type: ignore[arg-type]
        np.testing.assert_array_equal(back.hidden, s.hidden)  # type: ignore[union-attr]
        # Keys are namespaced by the model: another model's store sees nothing.
        other = open_store(url, max_sessions=10, ttl_s=10, namespace="xyz")
        assert other.get_many(["s1"]) == [None]
        assert store.delete("s2") and not store.delete("s2")
        import time

        time.sleep(0.5)  # past the TTL: Redis expired the key
        assert store.get_many(["s1"]) == [None]
        store.close()
        other.close()
