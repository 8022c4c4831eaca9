"""The filters of the common protocol: consecutive repeats, short sessions, rare items.

They work on boolean masks over `Events` (1 byte per event) instead of copying the arrays at
every step, which keeps the peak memory of large data sets low; `Events.take` applies a mask
once at the end. `iterative_filter_mask` alternates the session-length and item-support filters
until nothing changes (the common protocol of docs/datasets.md, step 5).
"""
from __future__ import annotations

import numpy as np

from gru4rec.datasets.progress import Progress
from gru4rec.datasets.sessionise import Events

__all__ = [
    "consecutive_repeat_mask",
    "drop_consecutive_repeats",
    "iterative_filter",
    "iterative_filter_mask",
    "without_rare_items",
    "without_short_sessions",
]


def consecutive_repeat_mask(ev: Events) -> np.ndarray:
    """True for events that repeat the previous event's item in the same session."""
    rep = np.zeros(len(ev), dtype=bool)
    if len(ev) > 1:
        rep[1:] = (ev.session[1:] == ev.session[:-1]) & (ev.item[1:] == ev.item[:-1])
    return rep


def drop_consecutive_repeats(ev: Events) -> Events:
    """Keep the first of each run of the same item within a session ((i, i, j) -> (i, j))."""
    return ev.take(~consecutive_repeat_mask(ev))


def without_short_sessions(ev: Events, mask: np.ndarray, min_length: int) -> np.ndarray:
    """`mask` without the sessions that have fewer than `min_length` events inside it."""
    if min_length <= 1:
        return mask
    # decide per session, then gather booleans: 1 byte per event instead of an int64 gather
    ok = np.bincount(ev.session[mask], minlength=ev.n_session_codes) >= min_length
    return mask & ok[ev.session]


def without_rare_items(ev: Events, mask: np.ndarray, min_support: int) -> np.ndarray:
    """`mask` without the events whose item has fewer than `min_support` events inside it."""
    if min_support <= 1:
        return mask
    ok = np.bincount(ev.item[mask], minlength=ev.n_item_codes) >= min_support
    return mask & ok[ev.item]


def iterative_filter_mask(
    ev: Events,
    keep: np.ndarray,
    min_support: int,
    min_length: int,
    progress: Progress | None = None,
) -> tuple[np.ndarray, int]:
    """Alternately drop short sessions and rare items among the events in `keep` until
    nothing changes; returns the final mask and the number of passes (a pass = one session
    step + one item step).

    Both removals are monotone, so the result is the unique largest subset in which every
    session has >= min_length events and every item >= min_support events. Working on a mask
    (1 byte per event) instead of copying the arrays each pass keeps the peak memory low.
    """
    passes = 0
    n = int(keep.sum())
    while True:
        keep = without_rare_items(ev, without_short_sessions(ev, keep, min_length), min_support)
        passes += 1
        before, n = n, int(keep.sum())
        if progress is not None:
            progress(f"filter pass {passes}: {before:,} -> {n:,} events")
        if n == before or n == 0:
            return keep, passes


def iterative_filter(
    ev: Events, min_support: int, min_length: int, progress: Progress | None = None
) -> tuple[Events, int]:
    """`iterative_filter_mask` over all events; returns the kept events and the passes."""
    keep, passes = iterative_filter_mask(ev, np.ones(len(ev), dtype=bool), min_support, min_length, progress)
    return ev.take(keep), passes
