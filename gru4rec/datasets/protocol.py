"""How a data set is filtered and split after sessionisation: the `Protocol` and its two splits.

Two protocols (docs/datasets.md, "What each pipeline does"):

* 'common' (yoochoose, rees46, coveo, retailrocket, diginetica, and `gru4rec split`): drop
  consecutive repeats, filter sessions and items iteratively, then `time_split` at T - D
  (test = the sessions that start at or after it) and again at T - D - Dv within train_full;
* 'rsc15' (the 2016/2018 GRU4Rec papers): one filtering pass without de-duplication, then
  `last_event_split` (test = the sessions whose last event is in the final window, unknown
  test items removed).

`run_protocol` runs either and returns one boolean mask per output set over the filtered
events, so that the four sets share one copy of the arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from gru4rec.datasets.filters import (
    consecutive_repeat_mask,
    iterative_filter_mask,
    without_rare_items,
    without_short_sessions,
)
from gru4rec.datasets.progress import Progress
from gru4rec.datasets.sessionise import Events
from gru4rec.errors import ConfigError, DataError

__all__ = ["OUTPUT_NAMES", "SECONDS_PER_DAY", "Protocol", "last_event_split", "run_protocol", "time_split"]

#: The four sets every pipeline writes, in this order.
OUTPUT_NAMES: tuple[str, ...] = ("train_full", "test", "train_tr", "train_valid")
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class Protocol:
    """How a data set is sessionised, filtered and split (one row of the table in
    docs/datasets.md, "What each pipeline does").

    kind: 'common' (the five data sets, `split_events`) or 'rsc15' (the 2016/2018 papers' one-pass
        protocol: no de-duplication, test = sessions whose last event is in the final window,
        unknown test items removed).
    days: the test window D in days; valid_days: the validation window (default: days).
    ticks_per_second: resolution of the internal integer time (1 = s, 1000 = ms).
    output_time_divisor: ticks per written time unit (1000 writes ms ticks as float seconds).
    session_gap_s: None when sessions are given; else a new session starts when the time since
        the previous event of the same key is strictly greater than this many seconds.
    boundary: a fixed T in ticks (None: T = the latest event after filtering).
    dedup: drop consecutive repeats of an item within a session (common protocol only).
    min_item_support / min_session_length: the filters' minimums (published: 5 / 2).
    """

    kind: Literal["common", "rsc15"] = "common"
    days: float = 1.0
    valid_days: float | None = None
    ticks_per_second: int = 1
    output_time_divisor: int = 1
    session_gap_s: float | None = None
    boundary: int | float | None = None
    dedup: bool = True
    min_item_support: int = 5
    min_session_length: int = 2

    def ticks(self, days: float) -> int | float:
        """`days` as a duration in ticks (an int whenever it is whole)."""
        value = days * SECONDS_PER_DAY * self.ticks_per_second
        return int(value) if float(value).is_integer() else value

    def with_options(self, **options: Any) -> Protocol:
        """A copy with the given fields replaced; None values are ignored."""
        return replace(self, **{k: v for k, v in options.items() if v is not None})

    def validate(self) -> None:
        """Raise ConfigError listing every meaningless setting."""

        def positive(x: Any) -> bool:
            return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and bool(x > 0)

        def count(x: Any) -> bool:
            return positive(x) and float(x).is_integer()

        problems = []
        if not positive(self.days):
            problems.append(f"days must be > 0, got {self.days!r}")
        if self.valid_days is not None and not positive(self.valid_days):
            problems.append(f"valid_days must be > 0, got {self.valid_days!r}")
        if not count(self.min_item_support):
            problems.append(f"min_item_support must be an integer >= 1, got {self.min_item_support!r}")
        if not count(self.min_session_length):
            problems.append(f"min_session_length must be an integer >= 1, got {self.min_session_length!r}")
        if self.session_gap_s is not None and not positive(self.session_gap_s):
            problems.append(f"session_gap_s must be > 0, got {self.session_gap_s!r}")
        if self.boundary is not None and not isinstance(self.boundary, (int, float, np.integer, np.floating)):
            problems.append(f"boundary must be a number, got {self.boundary!r}")
        if problems:
            raise ConfigError("; ".join(problems))


def _session_first_last(ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """Per session code: the time of its first and last event (events sorted by session, time);
    codes without events get the largest / smallest value of the time dtype."""
    n = len(ev)
    # keep the time dtype: int64 ticks beyond 2**53 would lose precision as floats
    info = np.iinfo(ev.time.dtype) if ev.time.dtype.kind in "iu" else np.finfo(ev.time.dtype)
    first = np.full(ev.n_session_codes, info.max, dtype=ev.time.dtype)
    last = np.full(ev.n_session_codes, info.min, dtype=ev.time.dtype)
    if n:
        change = np.flatnonzero(ev.session[1:] != ev.session[:-1]) + 1
        starts = np.r_[0, change]
        ends = np.r_[change - 1, n - 1]
        first[ev.session[starts]] = ev.time[starts]
        last[ev.session[ends]] = ev.time[ends]
    return first, last


def time_split(
    ev: Events, split_time: int | float, min_length: int, within: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The common protocol's split at `split_time` of the events in `within` (default: all),
    as boolean masks.

    test = the sessions that START at or after it (all their events); train = the events
    strictly before it, then sessions with fewer than `min_length` events there dropped. A
    session that starts before the boundary and continues after it keeps only its earlier
    events in train; its later events are in neither set. Session starts are taken over all of
    `ev`, which is right for `within` = train_full: train_full keeps every session's first event.
    """
    if within is None:
        within = np.ones(len(ev), dtype=bool)
    first, _ = _session_first_last(ev)
    test = within & (first >= split_time)[ev.session]
    train = without_short_sessions(ev, within & (ev.time < split_time), min_length)
    return train, test


def last_event_split(
    ev: Events, window: int | float, min_length: int, within: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """rsc15 split of the (whole) sessions in `within` as boolean masks: test = sessions whose
    LAST event is at or after (latest event in `within`) - window; train = the other sessions.
    Test events whose item is not in train are removed, then test sessions shorter than
    `min_length`."""
    if within is None:
        within = np.ones(len(ev), dtype=bool)
    tmax = ev.time[within].max()
    _, last = _session_first_last(ev)
    is_test = (last >= tmax - window)[ev.session]
    train = within & ~is_test
    test = within & is_test
    known = np.bincount(ev.item[train], minlength=ev.n_item_codes) > 0
    test = without_short_sessions(ev, test & known[ev.item], min_length)
    return train, test


def run_protocol(ev: Events, protocol: Protocol, progress: Progress) -> tuple[Events, dict[str, np.ndarray]]:
    """Filtering and splitting after sessionisation.

    Returns the filtered events and one boolean mask over them per output file: the four sets
    share the filtered arrays instead of holding copies (bounded memory on large data).
    """
    p = protocol
    D = p.ticks(p.days)
    Dv = p.ticks(p.valid_days if p.valid_days is not None else p.days)
    # callers pass `ev` as a temporary, so rebinding it here frees the unfiltered arrays
    if p.kind == "rsc15":
        # the 2016 protocol: one pass, in this order, no de-duplication
        keep = np.ones(len(ev), dtype=bool)
        keep = without_short_sessions(ev, keep, p.min_session_length)
        keep = without_rare_items(ev, keep, p.min_item_support)
        keep = without_short_sessions(ev, keep, p.min_session_length)
        ev = ev.take(keep)
        del keep
        progress(f"filtered (one pass): {len(ev):,} events")
        _require_nonempty(len(ev), None, p)
        train_full, test = last_event_split(ev, D, p.min_session_length)
        _require_nonempty(int(train_full.sum()), "train_full", p)
        train_tr, valid = last_event_split(ev, Dv, p.min_session_length, within=train_full)
    else:
        if p.dedup:
            keep = ~consecutive_repeat_mask(ev)
            progress(f"dropped {len(ev) - int(keep.sum()):,} consecutive repeats")
        else:
            keep = np.ones(len(ev), dtype=bool)
        keep, _ = iterative_filter_mask(ev, keep, p.min_item_support, p.min_session_length, progress)
        ev = ev.take(keep)
        del keep
        _require_nonempty(len(ev), None, p)
        T = p.boundary if p.boundary is not None else ev.time.max()
        train_full, test = time_split(ev, T - D, p.min_session_length)
        train_tr, valid = time_split(ev, T - D - Dv, p.min_session_length, within=train_full)
    masks = {"train_full": train_full, "test": test, "train_tr": train_tr, "train_valid": valid}
    for name in OUTPUT_NAMES:
        _require_nonempty(int(masks[name].sum()), name, p)
    return ev, masks


def _require_nonempty(n: int, what: str | None, p: Protocol) -> None:
    """DataError when a step left nothing: the filters (`what` None) or the split of set `what`."""
    if n > 0:
        return
    if what is None:
        raise DataError(
            f"no events left after filtering (sessions of >= {p.min_session_length} events, "
            f"items of >= {p.min_item_support} events)"
        )
    window = f"{p.days:g} day(s)" if what in ("train_full", "test") else f"{p.valid_days or p.days:g} day(s)"
    raise DataError(f"{what} is empty after the time split (window {window}): the data cover too short a time span")
