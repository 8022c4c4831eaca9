"""The vectorised preprocessing steps (sessionise, filters, time splits) against hand-computed
cases and a brute-force reference (the rules of docs/datasets.md)."""
from __future__ import annotations

import numpy as np
import pytest

from gru4rec.datasets import filters, protocol, sessionise
from gru4rec.datasets.sessionise import Events, RawEvents

# ------------------------------------------------------------------------------------------
# the vectorised steps against hand-computed cases and a brute-force reference


def raw(key, item, time) -> RawEvents:
    item = np.asarray(item)
    uniq, codes = np.unique(item, return_inverse=True)
    return RawEvents(np.asarray(key, np.int64), codes.astype(np.int32), np.asarray(time, np.int64), uniq, ["x"])


def events(session, item, time) -> Events:
    s = np.asarray(session, np.int64)
    i = np.asarray(item, np.int32)
    return Events(s, i, np.asarray(time, np.int64), np.arange(s.max() + 1), np.arange(i.max() + 1))


def test_sessionise_cuts_only_gaps_longer_than_the_threshold() -> None:
    # user 7: 0, 3600 (exactly 1 h: same session), 7201 (1 h + 1 s: new); user 5: 100, 50
    ev = sessionise.sort_and_sessionise(raw([7, 7, 5, 7, 5], [1, 2, 3, 4, 5], [0, 3600, 100, 7201, 50]), 3600)
    # sorted by user then time: (5,50,i5) (5,100,i3) (7,0,i1) (7,3600,i2) (7,7201,i4)
    assert ev.session.tolist() == [0, 0, 1, 1, 2]
    assert ev.session_ids.tolist() == [1, 2, 3]
    assert ev.item_ids[ev.item].tolist() == [5, 3, 1, 2, 4]
    assert ev.time.tolist() == [50, 100, 0, 3600, 7201]


def test_given_sessions_keep_their_ids_and_ties_go_by_item() -> None:
    ev = sessionise.sort_and_sessionise(raw([42, 42, 42, 9], [30, 20, 10, 5], [5, 5, 1, 0]), None)
    assert ev.session_ids[ev.session].tolist() == [9, 42, 42, 42]
    # equal times (5, 5) are ordered by item id: 20 before 30
    assert ev.item_ids[ev.item].tolist() == [5, 10, 20, 30]


def test_ties_follow_item_ids_not_the_raw_row_order() -> None:
    # codes 0, 1, 2 were handed out in row order to ids 30, 10, 20; equal times sort by id
    r = RawEvents(np.array([1, 1, 1]), np.array([0, 1, 2], np.int32), np.array([5, 5, 5]),
                  np.array([30, 10, 20]), ["x"])
    ev = sessionise.sort_and_sessionise(r, None)
    assert ev.item_ids[ev.item].tolist() == [10, 20, 30]
    # string ids too (coveo)
    r = RawEvents(np.array([1, 1]), np.array([0, 1], np.int32), np.array([5, 5]),
                  np.array(["b", "a"], dtype=object), ["x"])
    ev = sessionise.sort_and_sessionise(r, None)
    assert ev.item_ids[ev.item].tolist() == ["a", "b"]


def test_consecutive_repeats_only_within_a_session() -> None:
    ev = events([0, 0, 0, 0, 1, 1], [1, 1, 2, 1, 1, 1], [0, 1, 2, 3, 4, 5])
    kept = filters.drop_consecutive_repeats(ev)
    # (1, 1, 2, 1) -> (1, 2, 1); the next session's first 1 is no repeat; its second is
    assert kept.item.tolist() == [1, 2, 1, 1]
    assert kept.session.tolist() == [0, 0, 0, 1]


def brute_force_filter(rows, min_support, min_length):
    """Plain Python: remove short sessions and rare items until nothing changes."""
    rows = list(rows)
    while True:
        lengths = {}
        for s, _ in rows:
            lengths[s] = lengths.get(s, 0) + 1
        rows2 = [r for r in rows if lengths[r[0]] >= min_length]
        support = {}
        for _, i in rows2:
            support[i] = support.get(i, 0) + 1
        rows2 = [r for r in rows2 if support[r[1]] >= min_support]
        if len(rows2) == len(rows):
            return rows2
        rows = rows2


def test_iterative_filter_needs_several_passes() -> None:
    # support >= 2, length >= 2. Pass 1: item 9 (once) goes, session 2 = [8]; pass 2: session 2
    # goes, item 8 is left once and goes, session 3 = [1]; pass 3: session 3 goes; pass 4: stable.
    s = [0, 0, 1, 1, 2, 2, 3, 3]
    i = [1, 2, 1, 2, 8, 9, 8, 1]
    ev, passes = filters.iterative_filter(events(s, i, range(8)), 2, 2)
    assert passes == 4
    assert list(zip(ev.session.tolist(), ev.item.tolist())) == [(0, 1), (0, 2), (1, 1), (1, 2)]


@pytest.mark.parametrize("min_support,min_length", [(5, 2), (3, 3), (2, 2), (1, 2), (4, 1)])
def test_iterative_filter_matches_brute_force(min_support: int, min_length: int) -> None:
    rng = np.random.default_rng(min_support * 10 + min_length)
    n = 3000
    s = np.sort(rng.integers(0, 900, n))
    i = (rng.zipf(1.6, n) % 300).astype(np.int32)
    ev, _ = filters.iterative_filter(events(s, i, np.arange(n)), min_support, min_length)
    want = brute_force_filter(zip(s.tolist(), i.tolist()), min_support, min_length)
    assert list(zip(ev.session.tolist(), ev.item.tolist())) == want
    assert len(want) > 0


def test_time_split_boundary_and_truncation() -> None:
    # session 0: 1, 9 | session 1: 8, 10, 11 (starts before 10) | session 2: 10, 12 | 3: 9, 10
    ev = events([0, 0, 1, 1, 1, 2, 2, 3, 3], [1, 2, 1, 2, 3, 1, 2, 3, 1], [1, 9, 8, 10, 11, 10, 12, 9, 10])
    train, test = protocol.time_split(ev, 10, 2)
    assert ev.session[test].tolist() == [2, 2]  # only the session that starts at/after 10
    # train: events before 10; session 1 and 3 keep one event each and go
    assert list(zip(ev.session[train].tolist(), ev.time[train].tolist())) == [(0, 1), (0, 9)]
    # within a subset (as train_tr / train_valid within train_full): boundary 1 puts session 0
    # in valid; sessions 2 and 3 also start after 1 but are outside the subset
    train2, valid = protocol.time_split(ev, 1, 2, within=train)
    assert np.flatnonzero(valid).tolist() == [0, 1]
    assert not train2.any()


def test_last_event_split_removes_unknown_items() -> None:
    # session 0 ends at 5 (train); 1 ends at 12 >= 12 - 2 (test); 2 ends at 11 (test)
    ev = events([0, 0, 1, 1, 1, 2, 2], [1, 2, 1, 7, 2, 7, 1], [4, 5, 6, 11, 12, 10, 11])
    train, test = protocol.last_event_split(ev, 2, 2)
    assert ev.session[train].tolist() == [0, 0]
    # item 7 is unknown: session 1 -> (1, 2), session 2 -> (1) and goes
    assert list(zip(ev.session[test].tolist(), ev.item[test].tolist())) == [(1, 1), (1, 2)]
