"""Raw input and output files of the preprocessing pipelines: writing rules, formats, progress
lines, and every error of bad raw input (docs/datasets.md)."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec import log
from gru4rec.datasets import outputs, preprocess
from gru4rec.datasets.progress import Progress
from gru4rec.datasets.protocol import OUTPUT_NAMES
from gru4rec.errors import ConfigError, DataError

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
    with pytest.raises(DataError, match=r"test\.tsv already exists; pass force=True to replace it"):
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

    monkeypatch.setattr(outputs, "_write_tsv", broken)
    with pytest.raises(OSError, match="disk full"):
        outputs.write_events(target, {"a": np.arange(3)})
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.tsv"]


def test_parquet_and_tsv_hold_the_same_rows(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    src = digi_file(tmp_path)
    preprocess("diginetica", src, tmp_path / "tsv", progress=False)
    preprocess("diginetica", src, tmp_path / "pq", progress=False, fmt="parquet")
    for name in OUTPUT_NAMES:
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
    raw = diginetica.read_raw([path], 2, Progress("t", False))
    day = 86_400_000
    may1 = pd.Timestamp("2016-05-01", tz="UTC").value // 1_000_000
    assert raw.key.dtype == np.int64 and raw.key.tolist() == [7, 8, 8, 7]
    assert raw.time.tolist() == [may1 + day, may1 + 5, may1 + 9, may1 + day + 60]
    assert raw.item_ids[raw.item].tolist() == [1, 2, 3, 4]
    assert raw.n_rows == 4 and raw.sources == [str(path)]
    src = digi_file(tmp_path)
    preprocess("diginetica", src, tmp_path / "pq", progress=False, fmt="parquet", chunksize=7)
    for name in OUTPUT_NAMES:
        assert pd.read_parquet(tmp_path / "pq" / f"{name}.parquet")["SessionId"].dtype == np.int64


def test_tsv_without_pyarrow_is_the_same(tmp_path: Path, monkeypatch) -> None:
    cols = {
        "SessionId": np.array([3, 3, 10]),
        "ItemId": np.array(["a b", 'q"x', "z"], dtype=object),  # quote: pyarrow refuses, pandas quotes
        "Time": np.array([1396437466.94, 1396437467.0, 0.001]),
    }
    outputs.write_events(tmp_path / "with.tsv", cols)
    monkeypatch.setattr(outputs, "_arrow_csv", lambda: None)  # as without pyarrow
    outputs.write_events(tmp_path / "without.tsv", cols)
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


@pytest.fixture
def default_logging():
    """The `gru4rec` logger as a user gets it (INFO, default handler), whatever ran before."""
    root = logging.getLogger(log.LOGGER_NAME)
    level = root.level
    log.set_verbosity(logging.INFO)
    log.enable_default_handler()
    yield
    log.set_verbosity(level)


def test_progress_lines_are_log_records(tmp_path: Path, capsys, default_logging) -> None:
    """Progress lines are INFO records of the `gru4rec` logger, which the default handler
    writes to stdout (gru4rec.log); progress=False silences them."""
    preprocess("diginetica", digi_file(tmp_path), tmp_path / "o", progress=True, chunksize=10)
    out, err = capsys.readouterr()
    assert "train-item-views.csv: 10 rows read" in out and "wrote" in out
    assert out.startswith("[diginetica ") and "MB] " in out  # name, elapsed seconds, peak memory
    assert err == ""
    preprocess("diginetica", digi_file(tmp_path), tmp_path / "o", progress=False, force=True)
    assert capsys.readouterr() == ("", "")


def test_progress_records_name_step_time_and_memory(default_logging) -> None:
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    collect = Collect()
    logger = logging.getLogger("gru4rec.datasets.progress")
    logger.addHandler(collect)
    try:
        Progress("rsc15")("sorted; 3 sessions")
        Progress("rsc15", enabled=False)("not shown")
        log.set_verbosity(logging.WARNING)
        Progress("rsc15")("not shown either")
    finally:
        logger.removeHandler(collect)
    assert [r.levelno for r in records] == [logging.INFO]
    assert re.fullmatch(r"\[rsc15 +\d+\.\ds +\d+MB\] sorted; 3 sessions", records[0].getMessage())


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
