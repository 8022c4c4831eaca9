"""Shared preprocessing steps, writing rules and every error of bad raw input (spec §11)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.datasets import common, preprocess
from gru4rec.datasets.common import Events, RawEvents
from gru4rec.errors import ConfigError, DataError

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
    ev = common.sort_and_sessionise(raw([7, 7, 5, 7, 5], [1, 2, 3, 4, 5], [0, 3600, 100, 7201, 50]), 3600)
    # sorted by user then time: (5,50,i5) (5,100,i3) (7,0,i1) (7,3600,i2) (7,7201,i4)
    assert ev.session.tolist() == [0, 0, 1, 1, 2]
    assert ev.session_ids.tolist() == [1, 2, 3]
    assert ev.item_ids[ev.item].tolist() == [5, 3, 1, 2, 4]
    assert ev.time.tolist() == [50, 100, 0, 3600, 7201]


def test_given_sessions_keep_their_ids_and_ties_go_by_item() -> None:
    ev = common.sort_and_sessionise(raw([42, 42, 42, 9], [30, 20, 10, 5], [5, 5, 1, 0]), None)
    assert ev.session_ids[ev.session].tolist() == [9, 42, 42, 42]
    # equal times (5, 5) are ordered by item id: 20 before 30
    assert ev.item_ids[ev.item].tolist() == [5, 10, 20, 30]


def test_ties_follow_item_ids_not_the_raw_row_order() -> None:
    # codes 0, 1, 2 were handed out in row order to ids 30, 10, 20; equal times sort by id
    r = RawEvents(np.array([1, 1, 1]), np.array([0, 1, 2], np.int32), np.array([5, 5, 5]),
                  np.array([30, 10, 20]), ["x"])
    ev = common.sort_and_sessionise(r, None)
    assert ev.item_ids[ev.item].tolist() == [10, 20, 30]
    # string ids too (coveo)
    r = RawEvents(np.array([1, 1]), np.array([0, 1], np.int32), np.array([5, 5]),
                  np.array(["b", "a"], dtype=object), ["x"])
    ev = common.sort_and_sessionise(r, None)
    assert ev.item_ids[ev.item].tolist() == ["a", "b"]


def test_consecutive_repeats_only_within_a_session() -> None:
    ev = events([0, 0, 0, 0, 1, 1], [1, 1, 2, 1, 1, 1], [0, 1, 2, 3, 4, 5])
    kept = common.drop_consecutive_repeats(ev)
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
    ev, passes = common.iterative_filter(events(s, i, range(8)), 2, 2)
    assert passes == 4
    assert list(zip(ev.session.tolist(), ev.item.tolist())) == [(0, 1), (0, 2), (1, 1), (1, 2)]


@pytest.mark.parametrize("min_support,min_length", [(5, 2), (3, 3), (2, 2), (1, 2), (4, 1)])
def test_iterative_filter_matches_brute_force(min_support: int, min_length: int) -> None:
    rng = np.random.default_rng(min_support * 10 + min_length)
    n = 3000
    s = np.sort(rng.integers(0, 900, n))
    i = (rng.zipf(1.6, n) % 300).astype(np.int32)
    ev, _ = common.iterative_filter(events(s, i, np.arange(n)), min_support, min_length)
    want = brute_force_filter(zip(s.tolist(), i.tolist()), min_support, min_length)
    assert list(zip(ev.session.tolist(), ev.item.tolist())) == want
    assert len(want) > 0


def test_time_split_boundary_and_truncation() -> None:
    # session 0: 1, 9 | session 1: 8, 10, 11 (starts before 10) | session 2: 10, 12 | 3: 9, 10
    ev = events([0, 0, 1, 1, 1, 2, 2, 3, 3], [1, 2, 1, 2, 3, 1, 2, 3, 1], [1, 9, 8, 10, 11, 10, 12, 9, 10])
    train, test = common.time_split(ev, 10, 2)
    assert ev.session[test].tolist() == [2, 2]  # only the session that starts at/after 10
    # train: events before 10; session 1 and 3 keep one event each and go
    assert list(zip(ev.session[train].tolist(), ev.time[train].tolist())) == [(0, 1), (0, 9)]
    # within a subset (as train_tr / train_valid within train_full): boundary 1 puts session 0
    # in valid; sessions 2 and 3 also start after 1 but are outside the subset
    train2, valid = common.time_split(ev, 1, 2, within=train)
    assert np.flatnonzero(valid).tolist() == [0, 1]
    assert not train2.any()


def test_last_event_split_removes_unknown_items() -> None:
    # session 0 ends at 5 (train); 1 ends at 12 >= 12 - 2 (test); 2 ends at 11 (test)
    ev = events([0, 0, 1, 1, 1, 2, 2], [1, 2, 1, 7, 2, 7, 1], [4, 5, 6, 11, 12, 10, 11])
    train, test = common.last_event_split(ev, 2, 2)
    assert ev.session[train].tolist() == [0, 0]
    # item 7 is unknown: session 1 -> (1, 2), session 2 -> (1) and goes
    assert list(zip(ev.session[test].tolist(), ev.item[test].tolist())) == [(1, 1), (1, 2)]


# ------------------------------------------------------------------------------------------
# outputs: refusal to overwrite, atomic writes, formats


DIGI = "sessionId;userId;itemId;timeframe;eventdate\n"


def digi_file(tmp_path: Path, n_sessions: int = 20) -> Path:
    """A valid DIGINETICA file: session s on day s (2016-05-01 + s), items 1..3 in order."""
    rows = []
    for s in range(n_sessions):
        day = (pd.Timestamp("2016-05-01") + pd.Timedelta(days=s)).strftime("%Y-%m-%d")
        rows += [f"{s};NA;{i};{i * 1000};{day}" for i in (1, 2, 3)]
    path = tmp_path / "train-item-views.csv"
    path.write_text(DIGI + "\n".join(rows) + "\n")
    return path


def test_refuses_to_overwrite_and_force_replaces(tmp_path: Path) -> None:
    src = digi_file(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "test.tsv").write_text("mine\n")
    with pytest.raises(DataError, match=r"test\.tsv: output file exists"):
        preprocess("diginetica", src, out, progress=False)
    assert (out / "test.tsv").read_text() == "mine\n"
    assert not (out / "train_full.tsv").exists()  # refused before anything was written
    stats = preprocess("diginetica", src, out, progress=False, force=True)
    assert (out / "test.tsv").read_text().startswith("SessionId\tItemId\tTime\n")
    # T = day 19 + 3 s; test = sessions starting at/after day 12 + 3 s: sessions 13..19
    assert stats.set_index("file").loc["test", "sessions"] == 7
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["train_full.tsv", "test.tsv", "train_tr.tsv", "train_valid.tsv", "stats.tsv"]
    )


def test_output_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    with pytest.raises(DataError, match="not a directory"):
        preprocess("diginetica", digi_file(tmp_path), tmp_path / "out", progress=False)


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "x.tsv"
    target.write_text("old\n")

    def broken(tmp: Path, names, columns) -> None:
        tmp.write_text("partial")
        raise OSError("disk full")

    monkeypatch.setattr(common, "_write_tsv", broken)
    with pytest.raises(OSError, match="disk full"):
        common.write_events(target, {"a": np.arange(3)})
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.tsv"]


def test_parquet_and_tsv_hold_the_same_rows(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    src = digi_file(tmp_path)
    preprocess("diginetica", src, tmp_path / "tsv", progress=False)
    preprocess("diginetica", src, tmp_path / "pq", progress=False, fmt="parquet")
    for name in common.OUTPUT_NAMES:
        a = pd.read_csv(tmp_path / "tsv" / f"{name}.tsv", sep="\t")
        b = pd.read_parquet(tmp_path / "pq" / f"{name}.parquet")
        pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_diginetica_time_and_key_across_chunks(tmp_path: Path) -> None:
    """The earliest date of a session anchors all its rows even when they lie in other chunks;
    keys and the written SessionId stay int64 although the ids fit in 32 bits."""
    pytest.importorskip("pyarrow")
    from gru4rec.datasets import diginetica

    path = tmp_path / "train-item-views.csv"
    # session 7: rows in chunks 1 and 3; its second row is dated a day later than the first
    path.write_text(DIGI + "7;NA;1;0;2016-05-02\n8;NA;2;5;2016-05-01\n"
                    "8;NA;3;9;2016-05-01\n7;NA;4;60;2016-05-03\n")
    raw = diginetica.read_raw([path], 2, common.Progress("t", False))
    day = 86_400_000
    may1 = pd.Timestamp("2016-05-01", tz="UTC").value // 1_000_000
    assert raw.key.dtype == np.int64 and raw.key.tolist() == [7, 8, 8, 7]
    assert raw.time.tolist() == [may1 + day, may1 + 5, may1 + 9, may1 + day + 60]
    assert raw.item_ids[raw.item].tolist() == [1, 2, 3, 4]
    assert raw.n_rows == 4 and raw.sources == [str(path)]
    src = digi_file(tmp_path)
    preprocess("diginetica", src, tmp_path / "pq", progress=False, fmt="parquet", chunksize=7)
    for name in common.OUTPUT_NAMES:
        assert pd.read_parquet(tmp_path / "pq" / f"{name}.parquet")["SessionId"].dtype == np.int64


def test_tsv_without_pyarrow_is_the_same(tmp_path: Path, monkeypatch) -> None:
    cols = {
        "SessionId": np.array([3, 3, 10]),
        "ItemId": np.array(["a b", 'q"x', "z"], dtype=object),  # quote: pyarrow refuses, pandas quotes
        "Time": np.array([1396437466.94, 1396437467.0, 0.001]),
    }
    common.write_events(tmp_path / "with.tsv", cols)
    monkeypatch.setattr(common, "_arrow_csv", lambda: None)  # as without pyarrow
    common.write_events(tmp_path / "without.tsv", cols)
    a = pd.read_csv(tmp_path / "with.tsv", sep="\t")
    b = pd.read_csv(tmp_path / "without.tsv", sep="\t")
    pd.testing.assert_frame_equal(a, b)
    assert b["ItemId"].tolist() == ["a b", 'q"x', "z"]
    assert b["Time"].tolist() == [1396437466.94, 1396437467.0, 0.001]


def test_compressed_input(tmp_path: Path) -> None:
    import gzip

    src = digi_file(tmp_path)
    gz = tmp_path / "train-item-views.csv.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    a = preprocess("diginetica", src, tmp_path / "a", progress=False)
    b = preprocess("diginetica", gz, tmp_path / "b", progress=False)
    pd.testing.assert_frame_equal(a, b)


def test_progress_lines_go_to_stderr(tmp_path: Path, capsys) -> None:
    preprocess("diginetica", digi_file(tmp_path), tmp_path / "o", progress=True, chunksize=10)
    err = capsys.readouterr().err
    assert "train-item-views.csv: 10 rows read" in err and "wrote" in err


# ------------------------------------------------------------------------------------------
# bad input: every error names the file and the problem


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


YOO_ROW = "1,2014-04-07T10:51:09.277Z,214536502,0\n"
REES_H = "event_time,event_type,product_id,category_id,category_code,brand,price,user_id,user_session\n"


@pytest.mark.parametrize(
    "dataset,name,text,pattern",
    [
        # wrong separator
        ("diginetica", "train-item-views.csv", "sessionId,userId,itemId,timeframe,eventdate\n1,NA,2,3,2016-05-09\n",
         r"train-item-views\.csv: wrong separator: the header is comma"),
        ("rees46", "2019-Oct.csv", REES_H.replace(",", ";"), r"2019-Oct\.csv: wrong separator: the header is semicolon"),
        ("retailrocket", "events.csv", "timestamp\tvisitorid\tevent\titemid\ttransactionid\n1\t2\tview\t3\t\n",
         r"events\.csv: wrong separator: the header is tab"),
        ("coveo", "browsing_train.csv", "session_id_hash|event_type|product_action|product_sku_hash|"
         "server_timestamp_epoch_ms|hashed_url\n", r"browsing_train\.csv: wrong separator: the header is pipe"),
        ("rsc15", "yoochoose-clicks.dat", YOO_ROW.replace(",", ";"),
         r"yoochoose-clicks\.dat: wrong separator: the first row has 4 semicolon"),
        # missing column
        ("retailrocket", "events.csv", "timestamp,visitorid,event,transactionid\n1,2,view,\n",
         r"events\.csv: missing column\(s\) 'itemid' for retailrocket"),
        ("coveo", "browsing_train.csv", "session_id_hash,event_type,product_sku_hash,server_timestamp_epoch_ms\n",
         r"browsing_train\.csv: missing column\(s\) 'product_action'"),
        ("rees46", "2019-Oct.csv", "event_time,event_type,product_id,price\n",
         r"2019-Oct\.csv: missing column\(s\) 'user_id'"),
        ("diginetica", "train-item-views.csv", "sessionId;userId;itemId;eventdate\n",
         r"missing column\(s\) 'timeframe'"),
        ("rsc15", "yoochoose-clicks.dat", "1,2014-04-07T10:51:09.277Z,214536502\n",
         r"yoochoose-clicks\.dat: expected 4 comma \(','\)-separated fields per row for rsc15, the first row has 3"),
        # unparsable timestamps (line numbers count the header)
        ("rsc15", "yoochoose-clicks.dat", YOO_ROW + "1,2014-04-07 garbage,214536502,0\n",
         r"yoochoose-clicks\.dat, line 2: cannot parse 'Timestamp' '2014-04-07 garbage' as a timestamp"),
        ("rees46", "2019-Oct.csv", REES_H + "2019-10-01 00:00:00 UTC,view,1,2,,,1.0,5,s\n"
         "01/10/2019 00:00,view,1,2,,,1.0,5,s\n",
         r"2019-Oct\.csv, line 3: cannot parse 'event_time' '01/10/2019 00:00' as a timestamp"),
        ("diginetica", "train-item-views.csv", DIGI + "1;NA;2;3;2016-05-09\n1;NA;2;3;yesterday\n",
         r"train-item-views\.csv, line 3: cannot parse 'eventdate' 'yesterday'"),
        ("retailrocket", "events.csv", "timestamp,visitorid,event,itemid,transactionid\n"
         "2015-06-02 05:02:12,2,view,3,\n", r"events\.csv, line 2: column 'timestamp' must be integer epoch milli"),
        ("coveo", "browsing_train.csv", "session_id_hash,event_type,product_action,product_sku_hash,"
         "server_timestamp_epoch_ms,hashed_url\nab,event_product,detail,cd,12.5,ef\n",
         r"browsing_train\.csv, line 2: column 'server_timestamp_epoch_ms' must be integer epoch milliseconds, got"),
        # bad ids, missing values, ragged rows
        ("rsc15", "yoochoose-clicks.dat", YOO_ROW + "1,2014-04-07T10:51:09.277Z,P-17,0\n",
         r"yoochoose-clicks\.dat, line 2: column 'ItemId' must be an integer item id, got 'P-17'"),
        ("diginetica", "train-item-views.csv", DIGI + "1;NA;;3;2016-05-09\n",
         r"line 2: column 'itemId' must be an integer item id, got an empty value"),
        ("retailrocket", "events.csv", 'timestamp,visitorid,event,itemid,transactionid\n1,2,view,3,\n"4,5,view,6,\n',
         r"events\.csv: cannot parse the file: .*EOF inside string"),
        ("coveo", "browsing_train.csv", "session_id_hash,event_type,product_action,product_sku_hash,"
         "server_timestamp_epoch_ms,hashed_url\n,event_product,detail,cd,12,ef\n",
         r"browsing_train\.csv, line 2: column 'session_id_hash' is empty"),
        # empty
        ("retailrocket", "events.csv", "", r"events\.csv: the file is empty"),
        ("retailrocket", "events.csv", "timestamp,visitorid,event,itemid,transactionid\n",
         r"events\.csv: no events of the kind retailrocket uses \(read 0 rows\)"),
        ("retailrocket", "events.csv", "timestamp,visitorid,event,itemid,transactionid\n1,2,addtocart,3,\n",
         r"events\.csv: no events of the kind retailrocket uses \(read 1 rows\)"),
    ],
)
def test_bad_raw_input(tmp_path: Path, dataset: str, name: str, text: str, pattern: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(DataError, match=pattern):
        preprocess(dataset, [path], tmp_path / "out", progress=False)


def test_empty_after_filtering(tmp_path: Path) -> None:
    # every item is seen in 3 events only: nothing survives the published support of 5
    src = digi_file(tmp_path, n_sessions=3)
    with pytest.raises(DataError, match=r"train-item-views\.csv: no events left after filtering \(sessions of >= 2 "
                                         r"events, items of >= 5 events\)"):
        preprocess("diginetica", src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "train_full.tsv").exists()


def test_empty_test_set(tmp_path: Path) -> None:
    # REES46 with October only: nothing starts in the last day before T = 2019-12-01
    header = REES_H
    rows = [f"2019-10-{d:02d} 10:0{k}:00 UTC,view,{k},1,,,1.0,{d},x" for d in range(1, 11) for k in range(1, 4)]
    path = write(tmp_path, "2019-Oct.csv", header + "\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"2019-Oct\.csv: test is empty after the time split \(window 1 day"):
        preprocess("rees46", path, tmp_path / "out", progress=False)


def test_empty_train_tr(tmp_path: Path) -> None:
    # sessions on days 0..7: T = day 7 + 3 s; train_full = session 0 (before day 0 + 3 s), and
    # nothing is earlier than T - 14 days for train_tr
    src = digi_file(tmp_path, n_sessions=8)
    with pytest.raises(DataError, match=r"train-item-views\.csv: train_tr is empty after the time split "
                                        r"\(window 7 day\(s\)\)"):
        preprocess("diginetica", src, tmp_path / "out", progress=False)


def test_missing_and_misnamed_inputs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv: file not found"):
        preprocess("retailrocket", tmp_path / "nope.csv", tmp_path / "out", progress=False)
    with pytest.raises(DataError, match=r"missing raw file\(s\) for yoochoose: .*yoochoose-clicks\.dat"):
        preprocess("yoochoose", tmp_path, tmp_path / "out", progress=False)
    one = write(tmp_path, "yoochoose-clicks.dat", YOO_ROW)
    with pytest.raises(DataError, match=r"yoochoose: expected 2 raw file\(s\) \(yoochoose-clicks\.dat, "
                                        r"yoochoose-test\.dat\), got 1"):
        preprocess("yoochoose", [one], tmp_path / "out", progress=False)


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="unknown data set 'movielens'"):
        preprocess("movielens", "x", "y")
    with pytest.raises(ConfigError, match="format must be one of"):
        preprocess("rsc15", "x", "y", fmt="csv")
    with pytest.raises(ConfigError, match="min_item_support must be an integer >= 1"):
        preprocess("rsc15", "x", "y", min_item_support=0)
    with pytest.raises(ConfigError, match="chunksize must be a positive integer"):
        preprocess("rsc15", "x", "y", chunksize=0)
