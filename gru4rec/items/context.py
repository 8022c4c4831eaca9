"""Click context: when a click happens, as five numbers per click.

Times are unix time, **UTC**: ``time * seconds_per_tick`` seconds since 1970-01-01 00:00 UTC (the
event readers turn datetimes into unix seconds, naive ones taken as UTC; a data set whose times
are milliseconds passes ``seconds_per_tick=0.001``). The features of a click at time t, in
:data:`CONTEXT_FEATURES` order:

* ``hour_sin``, ``hour_cos``: ``sin/cos(2π h / 24)`` with h the hour of day, fractional
  (``(t mod 86400) / 3600``: 06:30 UTC is 6.5);
* ``dow_sin``, ``dow_cos``: ``sin/cos(2π d / 7)`` with d the day of week, Monday = 0 ... Sunday = 6
  (1970-01-01 was a Thursday, d = 3);
* ``log_gap``: ``log(1 + s)``, s the seconds since the session's previous click; 0 at a session's
  first click (no previous click).

:func:`click_context` computes them over a whole event frame (sorted by session, then time) in
one vectorised pass; :func:`context_of` is the same formula on arrays of times and previous
times (NaN: none), for one click at serving time or a batch of them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gru4rec.data.events import show_value
from gru4rec.errors import DataError

__all__ = ["CONTEXT_FEATURES", "N_CONTEXT", "click_context", "context_of", "sessions_context"]

#: The columns of the context matrix, in order.
CONTEXT_FEATURES = ("hour_sin", "hour_cos", "dow_sin", "dow_cos", "log_gap")
#: Their number: the rows of the network's context projection ``Wc``.
N_CONTEXT = len(CONTEXT_FEATURES)
_DAY = 86_400.0
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday = 0)


def context_of(times: np.ndarray | float, previous: np.ndarray | float | None = None, *,
               seconds_per_tick: float = 1.0) -> np.ndarray:
    """The context features (float32, [n × 5]; a scalar time gives [1 × 5]) of clicks at
    ``times`` whose session's previous click was at ``previous`` (same unit; NaN or None: the
    session's first click). DataError for a non-finite time or a previous click after its click."""
    t = np.atleast_1d(np.asarray(times, dtype=np.float64)) * seconds_per_tick
    prev = np.full_like(t, np.nan) if previous is None else np.atleast_1d(np.asarray(previous, dtype=np.float64)) * seconds_per_tick
    if prev.shape != t.shape:
        raise DataError(f"click context: {len(t)} times but {len(prev)} previous times")
    if not np.all(np.isfinite(t)):
        raise DataError(f"click context: non-finite time {show_value(t[~np.isfinite(t)][0])}")
    gap = t - prev
    if np.any(gap < 0):
        i = int(np.argmax(gap < 0))
        raise DataError(f"click context: the previous click ({show_value(prev[i] / seconds_per_tick)}) is after the click "
                        f"({show_value(t[i] / seconds_per_tick)}); sort the events by session and time")
    seconds_of_day = np.mod(t, _DAY)
    day = np.floor_divide(t, _DAY)
    hour_angle = 2 * np.pi * seconds_of_day / _DAY
    dow_angle = 2 * np.pi * np.mod(day + _EPOCH_WEEKDAY, 7) / 7
    out = np.empty((len(t), len(CONTEXT_FEATURES)), dtype=np.float32)
    out[:, 0] = np.sin(hour_angle)
    out[:, 1] = np.cos(hour_angle)
    out[:, 2] = np.sin(dow_angle)
    out[:, 3] = np.cos(dow_angle)
    out[:, 4] = np.log1p(np.nan_to_num(gap, nan=0.0))
    return out


def click_context(events: pd.DataFrame, *, session_key: str = "SessionId", time_key: str = "Time",
                  seconds_per_tick: float = 1.0) -> np.ndarray:
    """The context features of every event of ``events`` (float32 [rows × 5], row order kept),
    which must be sorted by session and, within a session, by time — the order
    :func:`gru4rec.data.sessions_from_events` builds sessions in. A session's rows must be
    contiguous: DataError naming the session otherwise (and for a time that goes back)."""
    for key in (session_key, time_key):
        if key not in events.columns:
            raise DataError(f"click context: no column {key!r}; the columns are {[str(c) for c in events.columns]}")
    sessions = events[session_key].to_numpy()
    times = events[time_key].to_numpy(dtype=np.float64)
    starts = np.ones(len(sessions), dtype=bool)
    starts[1:] = sessions[1:] != sessions[:-1]
    n_starts = int(starts.sum())
    if n_starts != pd.unique(sessions).size:
        seen = pd.Series(sessions[starts]).duplicated().to_numpy()
        raise DataError(f"click context: the rows of session {show_value(sessions[starts][np.argmax(seen)])} are not "
                        "contiguous; sort the events by session and time")
    prev = np.empty_like(times)
    prev[0:1] = np.nan
    prev[1:] = times[:-1]
    prev[starts] = np.nan
    back = np.flatnonzero(~starts & (times < prev))
    if len(back):
        raise DataError(f"click context: session {show_value(sessions[back[0]])} goes back in time at row {int(back[0])}; "
                        "sort the events by session and time")
    return context_of(times, prev, seconds_per_tick=seconds_per_tick)


def sessions_context(times: np.ndarray, offsets: np.ndarray, *, seconds_per_tick: float = 1.0) -> np.ndarray:
    """The context features (float32 [E × 5]) of events laid out as sessions: session s is
    ``times[offsets[s]:offsets[s+1]]`` (unix time, in order within the session, as
    :class:`gru4rec.data.Sessions` holds them). A session's first click has no previous click."""
    times = np.asarray(times, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    prev = np.empty_like(times)
    prev[1:] = times[:-1]
    starts = offsets[:-1][offsets[:-1] < len(times)]
    prev[starts] = np.nan
    return context_of(times, prev, seconds_per_tick=seconds_per_tick)
