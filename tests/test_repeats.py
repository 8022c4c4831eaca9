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


def test_gru4rec_info_data_prints_the_share_and_its_advice(tmp_path, capsys) -> None:
    import json

    from gru4rec.cli import main

    raw = {1: [5, 6, 5, 5], 2: [7], 3: [8, 99, 8, 9, 6, 9], 4: [99, 4], 5: [3, 3, 3], 6: [99]}
    rows = [(sid, item, t) for sid, items in raw.items() for t, item in enumerate(items)]
    pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"]).to_csv(tmp_path / "test.tsv", sep="\t", index=False)
    train = pd.DataFrame({"SessionId": [100] * 7, "ItemId": [3, 4, 5, 6, 7, 8, 9], "Time": range(7)})
    train.to_csv(tmp_path / "train.tsv", sep="\t", index=False)
    # On its own items (99 known), and as the evaluator counts with TRAIN's items (99 dropped).
    for extra, sessions in (([], list(raw.values())), (["--train", str(tmp_path / "train.tsv")],
                                                        [[i for i in s if i != 99] for s in raw.values()])):
        targets, repeats, immediate = brute_force(sessions)
        assert main(["info", str(tmp_path / "test.tsv"), *extra]) == 0
        out = capsys.readouterr().out
        assert f"prediction targets: {targets:,} (every event but a session's first)" in out
        assert f"repeated targets: {repeats / targets:.1%} (the item is already in the session); " \
               f"the previous item again: {immediate / targets:.1%}" in out
        assert repeats / targets >= 0.3 and "advice: repeat-heavy" in out
        assert "session-popularity baseline (gru4rec baseline spop TRAIN -t TEST) is the bar to clear" in out
        assert main(["info", str(tmp_path / "test.tsv"), *extra, "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["targets"], summary["repeat_share"]) == (targets, repeats / targets)
    assert summary["in_train_share"] == 0.0
    # The training file against itself: every target is in it.
    assert main(["info", str(tmp_path / "train.tsv"), "--train", str(tmp_path / "train.tsv")]) == 0
    out = capsys.readouterr().out
    assert "in the training data: 100.0% of the targets" in out and "advice: few repeats" in out
    # A file that is neither a model nor events: one error that says both.
    (tmp_path / "x.tsv").write_text("hello\n")
    assert main(["info", str(tmp_path / "x.tsv")]) == 1
    err = capsys.readouterr().err
    assert "is not a gru4rec model file (it is a text file); as an event file:" in err
