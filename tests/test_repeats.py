"""gru4rec.evaluation.repeats against a brute-force count on hand-made sessions, with unknown
items dropped as the evaluator drops them."""
from __future__ import annotations

import numpy as np
import pandas as pd

from gru4rec.data import ItemMap, sessions_from_events
from gru4rec.evaluation.repeats import repeat_shares


def brute_force(sessions: list[list[int]]) -> tuple[int, int, int]:
    targets = repeats = immediate = 0
    for s in sessions:
        for p in range(1, len(s)):
            targets += 1
            repeats += s[p] in s[:p]
            immediate += s[p] == s[p - 1]
    return targets, repeats, immediate


def test_counts_match_a_brute_force_count_after_unknown_items_are_dropped() -> None:
    # Session ids, items in time order; item 99 is unknown to the training split.
    raw = {1: [5, 6, 5, 5], 2: [7], 3: [8, 99, 8, 9, 6, 9], 4: [99, 4], 5: [3, 3, 3], 6: [99]}
    rows = [(sid, item, t) for sid, items in raw.items() for t, item in enumerate(items)]
    events = pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])
    item_map = ItemMap.from_ids(pd.Series([3, 4, 5, 6, 7, 8, 9]))
    sessions, dropped = sessions_from_events(events, item_map, order="id", drop_unknown=True)
    assert dropped == 3
    known = [[i for i in items if i != 99] for items in raw.values()]
    expected = brute_force(known)
    # By hand: 1: 6,5(r),5(r,i) | 3 (8,8,9,6,9): 8(r,i),9,6,9(r) | 4: none | 5: 3(r,i),3(r,i) -> 9 targets, 6 repeats, 4 immediate.
    assert expected == (9, 6, 4)
    got = repeat_shares(sessions)
    assert (got.n_targets, got.n_repeats, got.n_immediate) == expected
    assert got.share == 6 / 9 and got.immediate_share == 4 / 9


def test_random_sessions_match_the_brute_force_count() -> None:
    rng = np.random.default_rng(0)
    raw = [list(rng.integers(0, 12, size=int(rng.integers(1, 9)))) for _ in range(300)]
    rows = [(sid, item, t) for sid, items in enumerate(raw) for t, item in enumerate(items)]
    events = pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])
    sessions, _ = sessions_from_events(events, ItemMap.from_ids(events["ItemId"]), order="id")
    got = repeat_shares(sessions)
    # Items are dense indices in the sessions, ids in raw: the map is one to one, so counts agree.
    assert (got.n_targets, got.n_repeats, got.n_immediate) == brute_force(raw)
