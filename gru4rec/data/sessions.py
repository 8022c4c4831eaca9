"""Sessions as flat arrays: grouping validated events into time-ordered sessions, their order,
and the number of events per item.

Vectorised (NumPy/pandas), with no Python loop over events or sessions: it handles tens of
millions of events.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from gru4rec.data.events import KEY_COLUMNS_HINT, check_keys, missing_columns_error, show_value, time_to_numeric
from gru4rec.data.items import ItemMap
from gru4rec.errors import DataError

__all__ = ["IndexedSessions", "Sessions", "index_sessions", "item_support", "sessions_from_events"]


@dataclass(frozen=True)
class Sessions:
    """Events grouped into sessions, as flat arrays.

    ``items[offsets[s]:offsets[s + 1]]`` are the dense item indices of session s in time order;
    ``session_ids[s]`` its original id. Sessions of length 1 are kept here (they produce no
    training step or prediction: the schedule and the evaluation skip them).
    """

    items: np.ndarray  # int64 [E]
    offsets: np.ndarray  # int64 [n_sessions + 1], offsets[0] = 0, offsets[-1] = E
    session_ids: np.ndarray  # [n_sessions]
    #: The events' times (float64 [E], unix seconds, aligned with ``items``); None where the
    #: sessions were built without them. A model with click context reads them.
    times: np.ndarray | None = None

    @property
    def n_sessions(self) -> int:
        """Number of sessions."""
        return len(self.offsets) - 1

    @property
    def n_events(self) -> int:
        """Number of events."""
        return len(self.items)

    @property
    def lengths(self) -> np.ndarray:
        """Session lengths (int64 [n_sessions])."""
        return np.diff(self.offsets)


def _session_rank(session_ids: Any) -> np.ndarray:
    """rank[s] = position of session s when sessions are sorted by id (numeric for numbers,
    lexicographic for strings; str() order if types are mixed)."""
    idx = pd.Index(session_ids)
    try:
        order = idx.argsort()
    except TypeError:
        order = pd.Index(idx.astype(str)).argsort()
    rank = np.empty(len(idx), dtype=np.int64)
    rank[order] = np.arange(len(idx), dtype=np.int64)
    return rank


def sessions_from_events(
    df: pd.DataFrame,
    item_map: ItemMap,
    *,
    session_key: str = "SessionId",
    item_key: str = "ItemId",
    time_key: str = "Time",
    order: Literal["time", "id"] = "time",
    drop_unknown: bool = False,
) -> tuple[Sessions, int]:
    """Group validated events (see `validate_events`) into sessions.

    Within a session, events are ordered by time (stable: equal times keep file order). Sessions
    are arranged by their first timestamp, ties broken by session id (``order='time'``), or by
    session id (``order='id'``). With ``drop_unknown``, events whose item is not in ``item_map``
    are removed before sessions are formed (a session A, X, B becomes A, B) and their number is
    returned; otherwise an unknown item is a DataError. Sessions of length 1 stay in the arrays.

    Returns ``(sessions, n_dropped)``.
    """
    if order not in ("time", "id"):
        raise ValueError(f"order must be 'time' or 'id', got {order!r}")
    keys = check_keys(session_key, item_key, time_key)
    missing = [c for c in keys if c not in df.columns]
    if missing:
        raise missing_columns_error("<DataFrame>", missing, df.columns, KEY_COLUMNS_HINT)

    item_idx = item_map.index_of(df[item_key])
    unknown = item_idx < 0
    n_unknown = int(np.count_nonzero(unknown))
    sess = df[session_key]
    time_col = df[time_key]
    if n_unknown:
        if not drop_unknown:
            first = int(np.argmax(unknown))
            raise DataError(
                f"<DataFrame>: column {item_key!r} has {n_unknown} item id(s) not in the item map, "
                f"first {show_value(df[item_key].iloc[first])} at row {first}"
            )
        keep = ~unknown
        item_idx = item_idx[keep]
        sess = sess[keep]
        time_col = time_col[keep]
    if not (isinstance(time_col.dtype, np.dtype) and time_col.dtype.kind in "iuf"):
        time_col = time_to_numeric(time_col, time_key, "<DataFrame>", 0)
    times = time_col.to_numpy()

    # Session codes in order of first appearance; the frame is "sorted" when every session is
    # one contiguous block (codes never decrease) with non-decreasing times inside.
    codes, uniques = pd.factorize(sess)
    codes = codes.astype(np.int64, copy=False)
    if len(codes) > 1:
        same = codes[1:] == codes[:-1]
        is_sorted = bool(np.all(codes[1:] >= codes[:-1])) and bool(
            np.all(~same | (times[1:] >= times[:-1]))
        )
    else:
        is_sorted = True
    if not is_sorted:
        # Sort by (session, time), keeping the original order of ties. Raw logs are often
        # sorted by time already; then one stable sort by session is enough.
        if bool(np.all(times[1:] >= times[:-1])):
            perm = np.argsort(codes, kind="stable")
        else:
            perm = np.lexsort((times, codes))  # lexsort is stable
        codes = codes[perm]
        times = times[perm]
        item_idx = item_idx[perm]

    n_events = len(codes)
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if n_events else np.zeros(0, np.int64)
    offsets = np.empty(len(starts) + 1, dtype=np.int64)
    offsets[:-1] = starts
    offsets[-1] = n_events
    # Blocks appear in code order, so block s holds the session with code s.
    session_ids = np.asarray(uniques.to_numpy() if hasattr(uniques, "to_numpy") else uniques)
    assert len(session_ids) == len(starts)

    n_sessions = len(starts)
    if order == "time":
        first_time = times[starts]
        sess_perm = np.argsort(first_time, kind="stable")
        ft_sorted = first_time[sess_perm]
        if n_sessions > 1 and np.any(ft_sorted[1:] == ft_sorted[:-1]):
            # Ties in start time: break them by session id, not by file order.
            sess_perm = np.lexsort((_session_rank(session_ids), first_time))
    else:
        sess_perm = np.argsort(_session_rank(session_ids), kind="stable")

    if n_sessions and not np.array_equal(sess_perm, np.arange(n_sessions)):
        lengths = np.diff(offsets)[sess_perm]
        new_offsets = np.zeros(n_sessions + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        # Source position of every event in the new layout: its session's old start plus its
        # position inside the session.
        shift = np.repeat(offsets[:-1][sess_perm] - new_offsets[:-1], lengths)
        src = shift + np.arange(n_events, dtype=np.int64)
        item_idx = item_idx[src]
        times = times[src]
        offsets = new_offsets
        session_ids = session_ids[sess_perm]

    sessions = Sessions(
        items=np.ascontiguousarray(item_idx, dtype=np.int64),
        offsets=offsets,
        session_ids=session_ids,
        times=np.asarray(times, dtype=np.float64),
    )
    return sessions, n_unknown


class IndexedSessions(NamedTuple):
    """Sessions to recommend for, as flat arrays (:func:`index_sessions`)."""

    #: The known clicks' item indices (int64, flat).
    items: np.ndarray
    #: The offsets of every session (int64 [n_sessions + 1]): one with no known item is empty, not dropped.
    offsets: np.ndarray
    #: Each session's number of unknown ids.
    n_unknown: np.ndarray
    #: The known clicks' times (float64, aligned with ``items``); None when none were given.
    times: np.ndarray | None


def index_sessions(item_map: ItemMap, item_ids: Any, session_of: np.ndarray, n_sessions: int,
                   times: Any = None) -> IndexedSessions:
    """Sessions to recommend for, as flat arrays: event e has id ``item_ids[e]`` (and, if given,
    time ``times[e]``) and belongs to session ``session_of[e]`` (0 .. n_sessions − 1, each
    session's events contiguous and in click order). One lookup for all ids."""
    index = item_map.index_of(item_ids) if len(item_ids) else np.zeros(0, dtype=np.int64)
    known = index >= 0
    offsets = np.r_[0, np.cumsum(np.bincount(session_of[known], minlength=n_sessions))].astype(np.int64)
    return IndexedSessions(index[known], offsets, np.bincount(session_of[~known], minlength=n_sessions),
                           None if times is None else np.asarray(times, dtype=np.float64).reshape(-1)[known])


def item_support(items: np.ndarray | Sessions, n_items: int) -> np.ndarray:
    """Number of events of each item index 0..n_items-1 (int64 [n_items]). Accepts the dense
    item indices or a `Sessions`."""
    if isinstance(items, Sessions):
        items = items.items
    items = np.asarray(items)
    if items.size and (items.min() < 0 or items.max() >= n_items):
        raise ValueError(f"item indices must lie in [0, {n_items}), got [{items.min()}, {items.max()}]")
    return np.bincount(items, minlength=n_items).astype(np.int64, copy=False)
