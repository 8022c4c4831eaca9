"""Where live sessions are kept between clicks: in this process, or in Redis for many replicas.

A stored session (:class:`StoredSession`) is what the next click needs — the hidden state of
every GRU layer (float32, concatenated; ``None`` before the first known item) and the known items
clicked so far (for ``exclude_seen``): a :class:`gru4rec.inference.SessionState` — and what makes
a click safe to send twice: the session's *position* (clicks applied so far) and the answer to
its last click (:class:`LastClick`). Both stores hold it as bytes of one layout
(:func:`encode_session`), keyed by the session id, and are used by the micro-batcher's worker
thread only, one batch at a time: ``get_many`` before the batch's GRU step,
``compare_and_set`` / ``delete`` after it.

**Compare-and-set.** Every write carries a fresh random 64-bit *version* in the value's first
bytes (:func:`cas_prefix`). A write names the prefix it read (or ``None``: the key was absent)
and succeeds only if the stored value still starts with it; a write whose session changed in
between (another replica's click, a DELETE, an expiry) is refused and reported, so that the
batcher runs that click again on the fresh state. Random versions, not counters: a session
deleted and clicked again never comes back to a version read before (no ABA).

* :class:`MemoryStore` — an LRU with a time-to-live and a cap on sessions; counts what it drops
  (``evictions["capacity"]``, ``evictions["ttl"]``). One process, one batcher: its
  compare-and-set never fails, but keeps the contract.
* :class:`RedisStore` — one Redis key per session with the time-to-live as the key's expiry,
  so that any replica can take a session's next click and a restarted server continues where it
  was. The compare-and-set of a whole batch is one Lua script (``EVALSHA``: one round trip,
  atomic on the server). Keys carry the model file's checksum: a different model never reads
  another model's states.

Layout 1 (before versions and positions) is still read: such a state has position 0
("unknown") and its whole value is its compare-and-set prefix. Layout 3 is layout 2 with the
time of the session's last click after the header (float64): what a model with click context
measures the next click's gap from (:attr:`SessionState.last_time`). It is written only for such
a model's sessions (a plain model's stay layout 2, byte for byte); versions, positions and the
compare-and-set are the same.
"""
from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from gru4rec.errors import Gru4RecError
from gru4rec.inference.state import SessionState

__all__ = [
    "LastClick",
    "MemoryStore",
    "RedisStore",
    "SessionStore",
    "StoreUnavailable",
    "StoredSession",
    "cas_prefix",
    "decode_session",
    "encode_session",
    "open_store",
    "redacted_url",
]

_MAGIC = b"G4RS"
_V1 = struct.Struct("<4sHII")  # magic, layout 1, hidden floats, seen items
# magic, layout 2, version (8 random bytes), position, hidden floats, seen items, answer items,
# flags (1: fallback, 2: the click started the session), the last click's item index (-1: unknown)
_V2 = struct.Struct("<4sH8sIIIHBxi")
# layout 2's header, then the time of the session's last click (float64, unix seconds)
_V3 = struct.Struct("<4sH8sIIIHBxid")
_PREFIX = 4 + 2 + 8  # magic, layout, version: what a compare-and-set compares
_FALLBACK, _STARTED = 1, 2


class StoreUnavailable(Gru4RecError):
    """The session store cannot be reached (Redis down): at start-up a one-line error, while
    serving a 503 with the reason."""


@dataclass(frozen=True)
class LastClick:
    """The last click a session applied and its answer: what a retry of it is answered with.
    ``item`` is the click's known item index (-1: an unknown item); ``items``/``scores`` the
    answer (``scores`` None for the popularity fallback); ``started`` whether the click started
    the session (its ``new_session``)."""

    item: int
    items: np.ndarray
    scores: np.ndarray | None
    fallback: bool
    started: bool


@dataclass(frozen=True)
class StoredSession:
    """A session as stored: its state, its position (clicks applied; 0 for a layout-1 state,
    whose position is unknown) and its last click (None for a layout-1 state)."""

    state: SessionState
    position: int
    last: LastClick | None


def encode_session(state: SessionState, position: int, last: LastClick) -> bytes:
    """The session as layout-2 bytes with a new random version: the header, the hidden floats,
    the seen item indices (int32), the last answer's items (int32) and scores (float32, absent
    for a fallback)."""
    hidden = b"" if state.hidden is None else np.ascontiguousarray(state.hidden, dtype="<f4").tobytes()
    seen = np.ascontiguousarray(state.seen, dtype="<i4").tobytes()
    items = np.ascontiguousarray(last.items, dtype="<i4").tobytes()
    scores = b"" if last.scores is None else np.ascontiguousarray(last.scores, dtype="<f4").tobytes()
    flags = (_FALLBACK if last.scores is None else 0) | (_STARTED if last.started else 0)
    fields = (os.urandom(8), position, len(hidden) // 4, len(seen) // 4, len(items) // 4, flags, last.item)
    if state.last_time is None:
        header = _V2.pack(_MAGIC, 2, *fields)
    else:  # a model with click context: layout 3 keeps the last click's time
        header = _V3.pack(_MAGIC, 3, *fields, state.last_time)
    return b"".join((header, hidden, seen, items, scores))


def decode_session(data: bytes, hidden_size: int) -> StoredSession | None:
    """The session in ``data``, or None when the bytes are not a session of a model with
    ``hidden_size`` floats of hidden state (then the session starts fresh)."""
    if len(data) < _V1.size or data[:4] != _MAGIC:
        return None
    layout = int.from_bytes(data[4:6], "little")
    last_time: float | None = None
    if layout == 1:
        _, _, n_hidden, n_seen = _V1.unpack_from(data)
        offset, position, n_items, flags, item = _V1.size, 0, 0, 0, -1
    elif layout == 2 and len(data) >= _V2.size:
        _, _, _, position, n_hidden, n_seen, n_items, flags, item = _V2.unpack_from(data)
        offset = _V2.size
    elif layout == 3 and len(data) >= _V3.size:
        _, _, _, position, n_hidden, n_seen, n_items, flags, item, last_time = _V3.unpack_from(data)
        offset = _V3.size
    else:
        return None
    n_scores = 0 if flags & _FALLBACK else n_items
    if n_hidden not in (0, hidden_size) or len(data) != offset + 4 * (n_hidden + n_seen + n_items + n_scores):
        return None
    # Read-only views of the bytes, no copies: the engine only reads a stored state.
    hidden = np.frombuffer(data, dtype="<f4", count=n_hidden, offset=offset) if n_hidden else None
    offset += 4 * n_hidden
    seen = np.frombuffer(data, dtype="<i4", count=n_seen, offset=offset)
    state = SessionState(hidden, seen, last_time)
    if layout == 1:
        return StoredSession(state, 0, None)
    offset += 4 * n_seen
    answer = np.frombuffer(data, dtype="<i4", count=n_items, offset=offset)
    scores = None if flags & _FALLBACK else np.frombuffer(data, dtype="<f4", count=n_items, offset=offset + 4 * n_items)
    return StoredSession(state, position, LastClick(item, answer, scores, bool(flags & _FALLBACK), bool(flags & _STARTED)))


def cas_prefix(data: bytes) -> bytes:
    """What a compare-and-set of a write after reading ``data`` compares: the magic, layout and
    version of a layout-2 or layout-3 value, or the whole value otherwise (a layout-1 state,
    foreign bytes). The prefix of one layout's value never starts another layout's value (the
    layout number differs), so one comparison (``value.startswith(prefix)``) serves all."""
    versioned = data[4:6] in (b"\x02\x00", b"\x03\x00")
    return data[:_PREFIX] if len(data) >= _V2.size and versioned and data[:4] == _MAGIC else data


#: Query parameters of a Redis URL that hold a secret (redis-py takes ``password`` there too, and
#: ``ssl_password`` unlocks the client's TLS key).
_SECRET_PARAMETER = re.compile(r"(^|&)((?:ssl_)?password)=[^&]*")


def redacted_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, and the values of its
    ``password`` and ``ssl_password`` query parameters: for messages and logs."""
    parts = urlsplit(url)
    if parts.query and _SECRET_PARAMETER.search(parts.query):
        parts = parts._replace(query=_SECRET_PARAMETER.sub(r"\1\2=***", parts.query))
        url = urlunsplit(parts)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class SessionStore(Protocol):
    """What the batcher needs from a store (all calls from one thread at a time)."""

    kind: str
    evictions: dict[str, int]

    def get_many(self, keys: list[str]) -> list[bytes | None]: ...

    def compare_and_set(self, writes: list[tuple[str, bytes | None, bytes]]) -> list[int]:
        """Write each ``(key, expected, value)`` whose stored value still starts with
        ``expected`` (``None``: the key must be absent); the indices of the writes refused."""
        ...

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

    def _live(self, key: str, now: float) -> bytes | None:
        """The key's value, or None (an expired one is dropped and counted); under the lock."""
        entry = self._data.get(key)
        if entry is not None and now - entry[0] > self.ttl_s:
            del self._data[key]
            self.evictions["ttl"] += 1
            entry = None
        return None if entry is None else entry[1]

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        now = self._clock()
        with self._lock:
            return [self._live(key, now) for key in keys]

    def compare_and_set(self, writes: list[tuple[str, bytes | None, bytes]]) -> list[int]:
        now = self._clock()
        refused = []
        with self._lock:
            for i, (key, expected, value) in enumerate(writes):
                current = self._live(key, now)
                if (current is None) != (expected is None) or (
                        current is not None and expected is not None and not current.startswith(expected)):
                    refused.append(i)
                    continue
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
        return refused

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


#: The compare-and-set of a batch, atomic in Redis. KEYS: the sessions' keys; ARGV[1]: the
#: time-to-live in ms, then per key the expected prefix ('' : the key must be absent; a stored
#: value is never empty) and the new value. Returns the 0-based indices of the refused writes.
_CAS_SCRIPT = """
local refused = {}
for i = 1, #KEYS do
  local want = ARGV[2 * i]
  local cur = redis.call('GET', KEYS[i])
  local ok
  if want == '' then
    ok = (cur == false)
  else
    ok = (cur ~= false) and (string.sub(cur, 1, #want) == want)
  end
  if ok then
    redis.call('SET', KEYS[i], ARGV[2 * i + 1], 'PX', ARGV[1])
  else
    refused[#refused + 1] = i - 1
  end
end
return refused
"""


class RedisStore:
    """Sessions in Redis at ``url`` (``redis://[:password@]host:port/db``, ``rediss://`` for
    TLS — its settings as URL parameters, ``ssl_ca_certs``, ``ssl_certfile``/``ssl_keyfile``,
    ``ssl_check_hostname``, passed to redis-py as they are — ``unix://``), one key per session,
    ``{prefix}{namespace}:{session id}``, expiring ``ttl_s`` after the last click. Redis's own
    eviction (``maxmemory-policy``) applies; ``evictions`` stays zero here because Redis does
    not tell its clients. One Redis server (or a primary): a batch's keys go to one script,
    which Redis Cluster would refuse across slots. Messages name the URL without its password."""

    kind = "redis"

    def __init__(self, url: str, ttl_s: float, namespace: str, *, prefix: str = "gru4rec:session:", timeout_s: float = 2.0) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - the serve extra installs it
            raise ImportError("session state in Redis needs the redis package: pip install 'gru4rec[serve]'") from exc
        self._redis_errors = (redis.RedisError, OSError)
        self.url = redacted_url(url)
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        except ValueError as exc:  # a malformed URL: say which, without its password
            raise StoreUnavailable(f"Redis URL {self.url} is not valid: {exc}") from None
        # EVALSHA, and EVAL once when the server does not hold the script (first use, a restart).
        self._cas = self._client.register_script(_CAS_SCRIPT)
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._base_prefix = prefix
        self._prefix = f"{prefix}{namespace}:"
        self.evictions = {"capacity": 0, "ttl": 0}

    def _call(self, what: str, fn: Callable[[], object]) -> object:
        try:
            return fn()
        except self._redis_errors as exc:
            raise StoreUnavailable(f"Redis at {self.url} failed on {what}: {exc}") from exc

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        names = [self._prefix + k for k in keys]
        return cast("list[bytes | None]", self._call("MGET", lambda: self._client.mget(names)))

    def compare_and_set(self, writes: list[tuple[str, bytes | None, bytes]]) -> list[int]:
        if not writes:
            return []
        keys = [self._prefix + key for key, _, _ in writes]
        args: list[bytes | int] = [self.ttl_ms]
        for _, expected, value in writes:
            args += [b"" if expected is None else expected, value]
        refused = self._call("EVALSHA (compare-and-set)", lambda: self._cas(keys=keys, args=args))
        return [int(i) for i in cast("list[int]", refused)]

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
    raise ValueError(f"state must be 'memory' or a redis:// URL, got {redacted_url(spec)!r}")
