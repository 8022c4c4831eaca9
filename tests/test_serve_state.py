"""Session stores: the stored session's byte layout (and the old layout 1, still read), the
compare-and-set of both stores, the memory store's LRU cap and TTL with their counters, and the
Redis store against a real redis-server."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from gru4rec.inference import SessionState
from gru4rec.serve.state import (
    LastClick,
    MemoryStore,
    RedisStore,
    StoreUnavailable,
    cas_prefix,
    decode_session,
    encode_session,
    open_store,
    redacted_url,
)
from serve_helpers import free_port, redis_server


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(seed: int, n_hidden: int = 40, n_seen: int = 3) -> SessionState:
    rng = np.random.default_rng(seed)
    return SessionState(rng.standard_normal(n_hidden).astype(np.float32), rng.integers(0, 500, n_seen).astype(np.int32))


def last_click(seed: int, k: int = 5, fallback: bool = False) -> LastClick:
    rng = np.random.default_rng(seed)
    scores = None if fallback else rng.standard_normal(k).astype(np.float32)
    return LastClick(int(rng.integers(0, 500)), rng.integers(0, 500, k).astype(np.int32), scores, fallback, bool(seed % 2))


def test_session_bytes_round_trip_exactly() -> None:
    s, last = state(1), last_click(1)
    data = encode_session(s, 7, last)
    assert len(data) == 34 + 4 * 40 + 4 * 3 + 2 * 4 * 5  # header, hidden, seen, the answer's items and scores
    back = decode_session(data, 40)
    assert back is not None and back.position == 7 and back.last is not None
    np.testing.assert_array_equal(back.state.hidden, s.hidden)  # bit for bit: float32 stays float32
    np.testing.assert_array_equal(back.state.seen, s.seen)
    np.testing.assert_array_equal(back.last.items, last.items)
    np.testing.assert_array_equal(back.last.scores, last.scores)  # type: ignore[arg-type]
    assert (back.last.item, back.last.fallback, back.last.started) == (last.item, False, last.started)
    fallback = decode_session(encode_session(SessionState(), 1, last_click(2, fallback=True)), 40)
    assert fallback is not None and fallback.state.hidden is None and len(fallback.state.seen) == 0
    assert fallback.last is not None and fallback.last.fallback and fallback.last.scores is None and len(fallback.last.items) == 5


def test_a_layout_1_state_is_still_read() -> None:
    """Written by the server before positions and versions: hand-built here, not by the encoder."""
    s = state(3)
    old = struct.pack("<4sHII", b"G4RS", 1, 40, 3) + s.hidden.astype("<f4").tobytes() + s.seen.astype("<i4").tobytes()  # type: ignore[union-attr]
    back = decode_session(old, 40)
    assert back is not None and back.position == 0 and back.last is None  # position 0: unknown
    np.testing.assert_array_equal(back.state.hidden, s.hidden)
    np.testing.assert_array_equal(back.state.seen, s.seen)
    assert cas_prefix(old) == old  # no version: the whole value is compared


def test_every_write_has_a_new_version() -> None:
    s, last = state(4), last_click(4)
    a, b = encode_session(s, 2, last), encode_session(s, 2, last)
    assert a[14:] == b[14:] and cas_prefix(a) != cas_prefix(b) and len(cas_prefix(a)) == 14
    assert a.startswith(cas_prefix(a)) and not b.startswith(cas_prefix(a))


@pytest.mark.parametrize("damage", ["short", "magic", "size", "truncated", "layout"])
def test_foreign_or_damaged_state_bytes_are_refused(damage: str) -> None:
    data = bytearray(encode_session(state(2), 1, last_click(2)))
    if damage == "short":
        data = data[:5]
    elif damage == "magic":
        data[0:4] = b"XXXX"
    elif damage == "size":
        assert decode_session(bytes(data), 41) is None  # another model's hidden size
        return
    elif damage == "truncated":
        data = data[:-2]
    else:
        data[4] = 9
    assert decode_session(bytes(data), 40) is None


def test_redacted_url_hides_only_the_password() -> None:
    assert redacted_url("redis://:s3cret@cache:6380/2") == "redis://:***@cache:6380/2"
    assert redacted_url("rediss://app:s3cret@[::1]:6379/0?ssl_cert_reqs=required") == "rediss://app:***@[::1]:6379/0?ssl_cert_reqs=required"
    assert redacted_url("redis://cache:6379/0") == "redis://cache:6379/0"
    # redis-py also takes the password, and the passphrase of the client's TLS key, as parameters.
    assert (redacted_url("rediss://:pw@cache/0?ssl_ca_certs=/etc/ca.pem&password=s3cret&ssl_password=k3y&db=1")
            == "rediss://:***@cache/0?ssl_ca_certs=/etc/ca.pem&password=***&ssl_password=***&db=1")
    assert redacted_url("rediss://cache/0?ssl_keyfile=/k.pem&ssl_password=k3y") == "rediss://cache/0?ssl_keyfile=/k.pem&ssl_password=***"


def check_compare_and_set(store: MemoryStore | RedisStore) -> None:
    """The contract both stores keep: a write lands only on the value it read."""
    a1, a2, a3 = (encode_session(state(i), i, last_click(i)) for i in (1, 2, 3))
    assert store.compare_and_set([("a", None, a1), ("b", None, b"junk-b")]) == []
    assert store.get_many(["a", "b"]) == [a1, b"junk-b"]
    # "a" must be absent for the first write, and still a1 for the second: only the second lands.
    assert store.compare_and_set([("a", None, a2), ("a", cas_prefix(a1), a2)]) == [0]
    assert store.get_many(["a"]) == [a2]
    # A writer that read a1 is refused now (a2 has another version); one that read a2 is not.
    assert store.compare_and_set([("a", cas_prefix(a1), a3), ("b", cas_prefix(b"junk-b"), a3)]) == [0]
    assert store.get_many(["a", "b"]) == [a2, a3]
    # A session deleted meanwhile: a writer that read it is refused.
    assert store.delete("a")
    assert store.compare_and_set([("a", cas_prefix(a2), a3)]) == [0] and store.get_many(["a"]) == [None]


def test_memory_store_compare_and_set() -> None:
    check_compare_and_set(MemoryStore(10, ttl_s=100))
    clock = FakeClock()
    store = MemoryStore(10, ttl_s=10, clock=clock)
    store.compare_and_set([("s", None, b"v1")])
    clock.now += 11  # expired: it counts as absent
    assert store.compare_and_set([("s", cas_prefix(b"v1"), b"v2")]) == [0]
    assert store.compare_and_set([("s", None, b"v3")]) == [] and store.get_many(["s"]) == [b"v3"]


def put(store: MemoryStore, *items: tuple[str, bytes]) -> None:
    """Unconditional writes, as the compare-and-set of a writer that read what is there."""
    current = store.get_many([key for key, _ in items])
    assert store.compare_and_set([(key, None if was is None else cas_prefix(was), value)
                                  for (key, value), was in zip(items, current)]) == []


def test_memory_store_drops_the_least_recently_used_beyond_the_cap() -> None:
    clock = FakeClock()
    store = MemoryStore(3, ttl_s=100, clock=clock)
    put(store, ("a", b"1"), ("b", b"2"), ("c", b"3"))
    clock.now += 1
    assert store.get_many(["a"]) == [b"1"]  # a read does not count as use: only writes do
    put(store, ("a", b"1b"))  # a is now the most recent
    put(store, ("d", b"4"))  # b is the least recently used
    assert store.get_many(["a", "b", "c", "d"]) == [b"1b", None, b"3", b"4"]
    assert store.evictions == {"capacity": 1, "ttl": 0} and store.size() == 3
    put(store, ("e", b"5"), ("f", b"6"))
    assert store.get_many(["c", "a", "d", "e", "f"]) == [None, None, b"4", b"5", b"6"]  # order was c, a, d
    assert store.evictions["capacity"] == 3


def test_memory_store_expires_sessions_after_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryStore(100, ttl_s=10, clock=clock)
    put(store, ("old", b"x"))
    clock.now += 6
    put(store, ("young", b"y"))
    clock.now += 5  # old: 11 s since its last click, young: 5 s
    assert store.get_many(["old", "young"]) == [None, b"y"]
    assert store.evictions == {"capacity": 0, "ttl": 1}
    clock.now += 6  # young: 11 s; the next write sweeps it from the front
    put(store, ("new", b"z"))
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
        assert store.compare_and_set([("s1", None, encode_session(s, 1, last_click(3))), ("s2", None, b"other")]) == []
        got = store.get_many(["s1", "s2", "nope"])
        assert got[1] == b"other" and got[2] is None
        back = decode_session(got[0], 40)  # type: ignore[arg-type]
        np.testing.assert_array_equal(back.state.hidden, s.hidden)  # type: ignore[union-attr]
        # Keys are namespaced by the model: another model's store sees nothing.
        other = open_store(url, max_sessions=10, ttl_s=10, namespace="xyz")
        assert other.get_many(["s1"]) == [None]
        assert store.delete("s2") and not store.delete("s2")
        import time

        time.sleep(0.5)  # past the TTL: Redis expired the key
        assert store.get_many(["s1"]) == [None]
        store.close()
        other.close()


def test_redis_store_compare_and_set_and_a_lost_script_cache(tmp_path: Path) -> None:
    with redis_server(tmp_path) as url:
        store = open_store(url, max_sessions=10, ttl_s=60, namespace="cas")
        assert isinstance(store, RedisStore)
        check_compare_and_set(store)
        store._client.script_flush()  # what a Redis restart does to the script cache
        assert store.compare_and_set([("fresh", None, b"v")]) == [] and store.get_many(["fresh"]) == [b"v"]
        assert 0 < store._client.pttl("gru4rec:session:cas:fresh") <= 60_000  # the write carries the TTL
        store.close()
