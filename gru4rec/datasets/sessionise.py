"""The event arrays, from reading to sessions.

Every pipeline holds its events as three flat numpy arrays (one element per event) so that tens
of millions of events fit in a few hundred MB:

* while reading, an `ItemCoder` gives item ids dense int32 codes and an `Accumulator` collects
  each chunk's key (session or user id), item code and integer time;
* `Accumulator.finish` returns them as `RawEvents` (in file order);
* `sort_and_sessionise` sorts them by (key, time, item) and cuts sessions, giving `Events`, the
  input of the filters and the time split.

Times are integer "ticks" of the raw resolution (seconds or milliseconds) until the files are
written. Tie order: events of a session with the same timestamp are ordered by item id (as the
scripts behind the published numbers did), so the result does not depend on the order of the
raw rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.datasets.progress import Progress
from gru4rec.errors import DataError

__all__ = ["Accumulator", "Events", "ItemCoder", "RawEvents", "hash_keys", "sort_and_sessionise"]


class ItemCoder:
    """Dense int32 codes for item ids across chunks, in order of first appearance."""

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {}

    def encode(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Codes of `values` (new ids get the next free codes)."""
        local, uniques = pd.factorize(values)
        table = self._codes
        glob = np.fromiter(
            (table.setdefault(u, len(table)) for u in uniques.tolist()), dtype=np.int64, count=len(uniques)
        )
        if len(table) > np.iinfo(np.int32).max:  # pragma: no cover - billions of items
            raise DataError("more than 2^31 distinct item ids")
        return glob[local].astype(np.int32)

    def __len__(self) -> int:
        return len(self._codes)

    def ids(self) -> np.ndarray:
        """code -> original id (int64 array when every id is an int, else object)."""
        keys = list(self._codes)
        if keys and all(isinstance(k, (int, np.integer)) for k in keys):
            return np.asarray(keys, dtype=np.int64)
        return np.asarray(keys, dtype=object)


def hash_keys(values: pd.Series) -> np.ndarray:
    """64-bit hashes of string keys (session hashes): a fixed 8 bytes per event instead of a
    Python string, with a collision chance of ~n^2/2^65 (1e-6 for 5M distinct keys)."""
    return pd.util.hash_array(values.to_numpy(dtype=object)).astype(np.uint64)


@dataclass
class RawEvents:
    """The kept raw events as flat arrays (not yet sorted).

    key: session id (given sessions) or user/session-hash key (sessionised with a gap).
    item: int32 item codes; item_ids maps a code to the original id.
    time: int64 ticks.
    sources: the raw files read (for messages); n_rows: the rows read, kept or not;
    notes: remarks of the reader (e.g. rows it skipped).
    """

    key: np.ndarray
    item: np.ndarray
    time: np.ndarray
    item_ids: np.ndarray
    sources: list[str]
    n_rows: int = 0
    notes: list[str] = field(default_factory=list)


class Accumulator:
    """Collects per-chunk arrays; `finish` concatenates one column at a time (low peak memory)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {"key": [], "item": [], "time": []}
        self.n_rows = 0

    def add(self, key: np.ndarray, item: np.ndarray, time: np.ndarray) -> None:
        """Append one chunk's kept events (equal-length key, item code and time arrays)."""
        assert len(key) == len(item) == len(time)
        if key.dtype == np.int64 and len(key) and key.min() >= -(2**31) and key.max() < 2**31:
            # session/user ids of the public data sets fit in 32 bits: 4 bytes per event less;
            # np.concatenate upcasts if a later chunk needs 64 bits
            key = key.astype(np.int32)
        self.parts["key"].append(key)
        self.parts["item"].append(item)
        self.parts["time"].append(time)

    @property
    def n_kept(self) -> int:
        """Events collected so far."""
        return sum(len(a) for a in self.parts["key"])

    def finish(self, coder: ItemCoder, sources: list[str]) -> RawEvents:
        """All collected events as RawEvents (the chunks are released as they are joined)."""
        cols = {}
        for name in ("key", "item", "time"):
            parts = self.parts[name]
            cols[name] = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
            parts.clear()
        return RawEvents(
            key=cols["key"],
            item=cols["item"].astype(np.int32, copy=False),
            time=cols["time"].astype(np.int64, copy=False),
            item_ids=coder.ids(),
            sources=sources,
            n_rows=self.n_rows,
        )


@dataclass
class Events:
    """Events sorted by (session, time, item).

    session: int32 (or int64) session codes, non-decreasing (not necessarily dense after filtering).
    item: int32 item codes. time: int64 (or float64) ticks.
    session_ids / item_ids: code -> the id written to the files.
    """

    session: np.ndarray
    item: np.ndarray
    time: np.ndarray
    session_ids: np.ndarray
    item_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.session)

    def take(self, index: np.ndarray) -> Events:
        """The events at `index` (a bool mask or sorted positions); order is kept."""
        return Events(self.session[index], self.item[index], self.time[index], self.session_ids, self.item_ids)

    @property
    def n_session_codes(self) -> int:
        """Session codes in use before filtering (the length of session_ids)."""
        return len(self.session_ids)

    @property
    def n_item_codes(self) -> int:
        """Item codes in use before filtering (the length of item_ids)."""
        return len(self.item_ids)


def sort_and_sessionise(raw: RawEvents, gap_ticks: int | float | None, progress: Progress | None = None) -> Events:
    """Sort by (key, time, item); cut sessions at key changes and, if given, at gaps > gap_ticks.

    With given sessions (gap None) the written SessionId is the raw key; with a gap, sessions get
    new ids 1, 2, ... in (key, time) order.
    """
    # item codes are in order of first appearance, which depends on the row order of the raw
    # files; recode them in id order so that the tie-break below is by item id
    perm = np.argsort(raw.item_ids, kind="stable")
    rank = np.empty(len(perm), dtype=np.int32)
    rank[perm] = np.arange(len(perm), dtype=np.int32)
    raw.item = rank[raw.item]
    raw.item_ids = raw.item_ids[perm]
    del perm, rank
    order = np.lexsort((raw.item, raw.time, raw.key))
    key = raw.key[order]
    raw.key = np.empty(0, dtype=key.dtype)  # free the unsorted copies as we go
    item = raw.item[order]
    raw.item = np.empty(0, dtype=np.int32)
    tm = raw.time[order]
    raw.time = np.empty(0, dtype=np.int64)
    del order
    n = len(key)
    new = np.empty(n, dtype=bool)
    if n:
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        if gap_ticks is not None:
            new[1:] |= (tm[1:] - tm[:-1]) > gap_ticks
    # int32 codes while they fit: 4 bytes per event less in every later step
    session = np.cumsum(new, dtype=np.int32 if n < 2**31 else np.int64)
    session -= 1
    if gap_ticks is None:
        session_ids = key[new]
        if session_ids.dtype == np.uint64:
            # 64-bit hashes of string session keys (coveo) mean nothing to a user: number them
            session_ids = np.arange(1, len(session_ids) + 1, dtype=np.int64)
    else:
        session_ids = np.arange(1, int(new.sum()) + 1, dtype=np.int64)
    del key, new
    if progress is not None:
        progress(f"sorted; {len(session_ids):,} sessions")
    return Events(session, item, tm, session_ids, raw.item_ids)
