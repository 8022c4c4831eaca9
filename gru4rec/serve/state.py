"""Where live sessions are kept between clicks: in this process, or in Redis for many replicas.

A session's state (:class:`gru4rec.inference.SessionState`) is what the next click needs: the
hidden state of every GRU layer (float32, concatenated; ``None`` before the first known item)
and the known items clicked so far (for ``exclude_seen``). Both stores hold it as bytes of one layout (:func:`encode_state`), keyed by
the session id, and are used by the micro-batcher's worker thread only, one batch at a time:
``get_many`` before the batch's GRU step, ``put_many`` / ``delete`` after it.

* :class:`MemoryStore` — an LRU with a time-to-live and a cap on sessions; counts what it drops
  (``evictions["capacity"]``, ``evictions["ttl"]``).
* :class:`RedisStore` — one Redis key per session with the time-to-live as the key's expiry
  (``SET ... EX``), so that any replica can take a session's next click and a restarted server
  continues where it was. Keys carry the model file's checksum: a different model never reads
  another model's states.
"""
from __future__ import annotations

import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

import numpy as np

from gru4rec.errors import Gru4RecError
from gru4rec.inference.state import SessionState

__all__ = [
    "MemoryStore",
    "RedisStore",
    "SessionStore",
    "StoreUnavailable",
    "decode_state",
    "encode_state",
    "open_store",
]

_T = TypeVar("_T")

_MAGIC = b"G4RS"
_HEADER = struct.Struct("<4sHII")  # magic, layout version, hidden floats, seen items
_VERSION = 1


class StoreUnavailable(Gru4RecError):
    """The session store cannot be reached (Redis down): at start-up a one-line error, while
    serving a 503 with the reason."""


def encode_state(state: SessionState) -> bytes:
    """The state as bytes: a 14-byte header, the hidden floats, the seen item indices (int32)."""
    hidden = b"" if state.hidden is None else np.ascontiguousarray(state.hidden, dtype="<f4").tobytes()
    seen = np.ascontiguousarray(state.seen, dtype="<i4").tobytes()
    return _HEADER.pack(_MAGIC, _VERSION, len(hidden) // 4, len(seen) // 4) + hidden + seen


def decode_state(data: bytes, hidden_size: int) -> SessionState | None:
    """The state in ``data``, or None when the bytes are not a state of a model with
    ``hidden_size`` floats of hidden state (then the session starts fresh)."""
    if len(data) < _HEADER.size:
        return None
    magic, version, n_hidden, n_seen = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or n_hidden not in (0, hidden_size):
        return None
    if len(data) != _HEADER.size + 4 * (n_hidden + n_seen):
        return None
    offset = _HEADER.size
    # Read-only views of the bytes, no copies: the engine only reads a stored state.
    hidden = np.frombuffer(data, dtype="<f4", count=n_hidden, offset=offset) if n_hidden else None
    seen = np.frombuffer(data, dtype="<i4", count=n_seen, offset=offset + 4 * n_hidden)
    return SessionState(hidden, seen)


class SessionStore(Protocol):
    """What the batcher needs from a store (all calls from one thread at a time)."""

    kind: str
    evictions: dict[str, int]

    def get_many(self, keys: list[str]) -> list[bytes | None]: ...

    def put_many(self, items: list[tuple[str, bytes]]) -> None: ...

    def delete(self, key: str) -> bool: ...

    def size(self) -> int | None: ...

    def use_namespace(self, namespace: str) -> None:
        """From now on, hold sessions under ``namespace`` (a model whose states differ from the
        previous model's); the sessions of the previous namespace are no longer read."""
        ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


class MemoryStore:
    """Sessions in this process: least recently used first out when more than ``max_sessions``
    are held, and none kept longer than ``ttl_s`` after its last click.

    The dict's order is the order of last use, which is also the order of expiry, so expired
    sessions are dropped from the front on every write (amortised O(1)); one read past its time
    counts as expired too. ``clock`` is for tests.
    """

    kind = "memory"

    def __init__(self, max_sessions: int, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1 or ttl_s <= 0:
            raise ValueError("a memory store needs max_sessions >= 1 and ttl_s > 0")
        self.max_sessions, self.ttl_s, self._clock = max_sessions, ttl_s, clock
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()  # size() is read from the event loop's thread
        self.evictions = {"capacity": 0, "ttl": 0}

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        now = self._clock()
        found: list[bytes | None] = []
        with self._lock:
            for key in keys:
                entry = self._data.get(key)
                if entry is not None and now - entry[0] > self.ttl_s:
                    del self._data[key]
                    self.evictions["ttl"] += 1
                    entry = None
                found.append(None if entry is None else entry[1])
        return found

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        now = self._clock()
        with self._lock:
            for key, value in items:
                self._data[key] = (now, value)
                self._data.move_to_end(key)
            while self._data:
                oldest = next(iter(self._data.values()))
                if now - oldest[0] <= self.ttl_s:
                    break
                self._data.popitem(last=False)
                self.evictions["ttl"] += 1
            while len(self._data) > self.max_sessions:
                self._data.popitem(last=False)
                self.evictions["capacity"] += 1

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def size(self) -> int:
        with self._lock:
            return len(self._data)

    def use_namespace(self, namespace: str) -> None:
        """One process serves one model: the previous model's sessions are dropped."""
        with self._lock:
            self._data.clear()

    def ping(self) -> None:
        return None

    def close(self) -> None:
        with self._lock:
            self._data.clear()


class RedisStore:
    """Sessions in Redis at ``url`` (``redis://host:port/db``), one key per session,
    ``{prefix}{namespace}:{session id}``, expiring ``ttl_s`` after the last click. Redis's own
    eviction (``maxmemory-policy``) applies; ``evictions`` stays zero here because Redis does
    not tell its clients."""

    kind = "redis"

    def __init__(self, url: str, ttl_s: float, namespace: str, *, prefix: str = "gru4rec:session:", timeout_s: float = 2.0) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - the serve extra installs it
            raise ImportError("session state in Redis needs the redis package: pip install 'gru4rec[serve]'") from exc
        self._redis_errors = (redis.RedisError, OSError)
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.url, self.ttl_ms = url, max(1, int(ttl_s * 1000))
        self._base_prefix = prefix
        self._prefix = f"{prefix}{namespace}:"
        self.evictions = {"capacity": 0, "ttl": 0}

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except self._redis_errors as exc:
            raise StoreUnavailable(f"Redis at {self.url} failed on {what}: {exc}") from exc

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        names = [self._prefix + k for k in keys]
        # The client is made with decode_responses=False: values come back as bytes, never str.
        return cast("list[bytes | None]", self._call("MGET", lambda: self._client.mget(names)))

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        def write() -> None:
            pipe = self._client.pipeline(transaction=False)
            for key, value in items:
                pipe.set(self._prefix + key, value, px=self.ttl_ms)
            pipe.execute()

        if items:
            self._call("SET", write)

    def delete(self, key: str) -> bool:
        return bool(self._call("DEL", lambda: self._client.delete(self._prefix + key)))

    def size(self) -> None:
        """Not counted: other replicas and other data share the server."""
        return None

    def ping(self) -> None:
        self._call("PING", self._client.ping)

    def use_namespace(self, namespace: str) -> None:
        """Keys of the previous namespace are left to expire (other replicas may still use them)."""
        self._prefix = f"{self._base_prefix}{namespace}:"

    def close(self) -> None:
        self._client.close()


def open_store(spec: str, *, max_sessions: int, ttl_s: float, namespace: str) -> SessionStore:
    """``'memory'`` or a ``redis://`` / ``rediss://`` / ``unix://`` URL; checks that Redis answers."""
    if spec == "memory":
        return MemoryStore(max_sessions, ttl_s)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        store = RedisStore(spec, ttl_s, namespace)
        store.ping()
        return store
    raise ValueError(f"state must be 'memory' or a redis:// URL, got {spec!r}")

