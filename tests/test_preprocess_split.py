"""`split_events` / `gru4rec split`: the public data sets' time split for a user's own event log.

Hand-worked case (h = hour, times in seconds; D = 1 day, min support 2, min length 2):

  a  x@0h y@1h x@1.5h          train_tr
  b  y@2h y@2.1h z@2.2h        train_tr (the repeat y, y stays unless dedup=True)
  c  q@3h x@3.1h               pass 1: q (support 1) goes; pass 2: c = [x] goes
  d  x@23.5h z@24.5h           crosses B2 = 24h: train_tr part [x] -> dropped; train_full whole
  e  z@24h y@25h               starts exactly at B2: train_valid
  f  x@47h y@49h               crosses B1 = 48h: train part [x] -> dropped
  g  y@48h z@50h               starts exactly at B1: test
  h  w@51h x@72h               test (w is unknown to train: kept); T = 72h, the latest event
  i  w@52h y@53h               test
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.datasets import split_events
from gru4rec.errors import ConfigError, DataError

H = 3600
ROWS = [
    ("a", "x", 0), ("a", "y", 1 * H), ("a", "x", 5400),
    ("b", "y", 2 * H), ("b", "y", 7560), ("b", "z", 7920),
    ("c", "q", 3 * H), ("c", "x", 11160),
    ("d", "x", 84600), ("d", "z", 88200),
    ("e", "z", 24 * H), ("e", "y", 25 * H),
    ("f", "x", 47 * H), ("f", "y", 49 * H),
    ("g", "y", 48 * H), ("g", "z", 50 * H),
    ("h", "w", 51 * H), ("h", "x", 72 * H),
    ("i", "w", 52 * H), ("i", "y", 53 * H),
]
A, B, D, E, G, HH, II = (
    [r for r in ROWS if r[0] == s] for s in ("a", "b", "d", "e", "g", "h", "i")
)
EXPECTED = {
    "train_full": A + B + D + E,
    "test": G + HH + II,
    "train_tr": A + B,
    "train_valid": E,
}


def frame(rows=ROWS, scale=1) -> pd.DataFrame:
    # shuffled: the split must not depend on the input order
    df = pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])
    df["Time"] = df["Time"] * scale
    return df.sample(frac=1.0, random_state=3).reset_index(drop=True)


def read(out: Path, name: str) -> list[tuple]:
    df = pd.read_csv(out / f"{name}.tsv", sep="\t", dtype={"SessionId": str, "ItemId": str})
    return list(df.itertuples(index=False, name=None))


def assert_outputs(out: Path, expected: dict, scale=1) -> None:
    for name, rows in expected.items():
        assert read(out, name) == [(s, i, t * scale) for s, i, t in rows], name


def test_hand_worked_split(tmp_path: Path) -> None:
    stats = split_events(frame(), tmp_path, days=1, min_item_support=2)
    assert_outputs(tmp_path, EXPECTED)
    st = stats.set_index("file")
    assert st.loc["filtered", "events"] == 18  # 20 rows less c's two
    assert st.loc["test", "sessions"] == 3 and st.loc["test", "items"] == 4
    assert st.loc["train_full", "last_time"] == 25 * H  # e's last event


def test_dedup_option(tmp_path: Path) -> None:
    split_events(frame(), tmp_path, days=1, min_item_support=2, dedup=True)
    assert read(tmp_path, "train_tr") == A + [B[0], B[2]]


def test_milliseconds_and_a_wider_validation_window(tmp_path: Path) -> None:
    # valid_days 1.5: B2 = 48h - 36h = 12h -> d and e are validation sessions, train_tr = a, b
    split_events(frame(scale=1000), tmp_path, days=1, valid_days=1.5, time_unit="ms", min_item_support=2)
    assert_outputs(tmp_path, {"train_full": A + B + D + E, "test": G + HH + II, "train_tr": A + B,
                              "train_valid": D + E}, scale=1000)


def test_fixed_boundary(tmp_path: Path) -> None:
    # T = 73h: B1 = 49h -> g (starts 48h) is cut to [y@48h] and dropped; test = h, i
    split_events(frame(), tmp_path, days=1, valid_days=1.5, boundary=73 * H, min_item_support=2)
    assert read(tmp_path, "test") == HH + II
    assert read(tmp_path, "train_full") == A + B + D + E
    assert read(tmp_path, "train_valid") == D + E


def test_datetime_times_become_seconds(tmp_path: Path) -> None:
    df = frame()
    base = pd.Timestamp("2020-01-01")
    df["Time"] = base + pd.to_timedelta(df["Time"], unit="s")
    split_events(df, tmp_path, days=1, min_item_support=2)
    offset = int(base.value // 10**9)
    assert read(tmp_path, "test") == [(s, i, t + offset) for s, i, t in G + HH + II]


def test_equal_times_keep_the_input_order(tmp_path: Path) -> None:
    rows = [("s1", "n", 10), ("s1", "m", 10), ("s1", "k", 5)] + [
        (f"t{k}", "m", 160 * H + k) for k in range(2)
    ] + [("late", "m", 200 * H), ("late", "n", 200 * H)]
    df = pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])
    split_events(df, tmp_path, days=1, valid_days=1, min_item_support=1, min_session_length=1)
    assert read(tmp_path, "train_tr") == [("s1", "k", 5), ("s1", "n", 10), ("s1", "m", 10)]
    assert read(tmp_path, "test") == [("late", "m", 200 * H), ("late", "n", 200 * H)]


@pytest.mark.parametrize("kind", ["tsv", "csv", "parquet"])
def test_file_inputs_and_custom_columns(tmp_path: Path, kind: str) -> None:
    df = frame().rename(columns={"SessionId": "visit", "ItemId": "product", "Time": "ts"})
    src = tmp_path / f"events.{kind}"
    if kind == "parquet":
        pytest.importorskip("pyarrow")
        df.to_parquet(src)
    else:
        df.to_csv(src, sep="\t" if kind == "tsv" else ",", index=False)
    out = tmp_path / "out"
    split_events(src, out, days=1, min_item_support=2, session_key="visit", item_key="product", time_key="ts")
    assert_outputs(out, EXPECTED)


def test_parquet_output(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    split_events(frame(), tmp_path, days=1, min_item_support=2, fmt="parquet")
    got = pd.read_parquet(tmp_path / "test.parquet")
    assert list(got.itertuples(index=False, name=None)) == G + HH + II


# ------------------------------------------------------------------------------------------
# errors


def test_missing_column(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"input DataFrame: missing column\(s\) 'Time'"):
        split_events(frame().drop(columns="Time"), tmp_path / "o")
    src = tmp_path / "e.csv"
    frame().drop(columns="ItemId").to_csv(src, index=False)
    with pytest.raises(DataError, match=r"e\.csv: missing column\(s\) 'ItemId'"):
        split_events(src, tmp_path / "o")


def test_missing_ids_and_bad_times(tmp_path: Path) -> None:
    df = frame()
    df.loc[4, "ItemId"] = None
    with pytest.raises(DataError, match=r"column 'ItemId' has a missing id \(row 4\)"):
        split_events(df, tmp_path / "o")
    df = frame()
    df["Time"] = df["Time"].astype(str)
    df.loc[2, "Time"] = "noon"
    with pytest.raises(DataError, match=r"column 'Time' must be numeric time in s \(row 2: 'noon'\)"):
        split_events(df, tmp_path / "o")
    df = frame()
    df["Time"] = df["Time"].astype(float)
    df.loc[1, "Time"] = np.nan
    with pytest.raises(DataError, match=r"column 'Time' has a missing or infinite time \(row 1\)"):
        split_events(df, tmp_path / "o")


def test_empty_results(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="input DataFrame: no events"):
        split_events(frame().iloc[:0], tmp_path / "o")
    with pytest.raises(DataError, match="no events left after filtering"):
        split_events(frame(), tmp_path / "o", min_item_support=50)
    with pytest.raises(DataError, match=r"test is empty after the time split \(window 1 day"):
        split_events(frame(), tmp_path / "o", min_item_support=2, boundary=100 * H)
    with pytest.raises(DataError, match=r"train_full is empty"):
        split_events(frame(), tmp_path / "o", min_item_support=2, days=10)
    assert not (tmp_path / "o" / "test.tsv").exists()


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="time_unit must be one of"):
        split_events(frame(), tmp_path, time_unit="h")
    with pytest.raises(ConfigError, match=r"days must be > 0.*min_session_length must be an integer >= 1"):
        split_events(frame(), tmp_path, days=0, min_session_length=0)
    with pytest.raises(ConfigError, match="valid_days must be > 0"):
        split_events(frame(), tmp_path, valid_days=-1)
    with pytest.raises(ConfigError, match=r"days must be > 0, got '1'.*min_item_support must be an integer >= 1, "
                                          r"got 2\.5.*boundary must be a number"):
        split_events(frame(), tmp_path, days="1", min_item_support=2.5, boundary="noon")
    with pytest.raises(DataError, match=r"nope\.tsv: file not found"):
        split_events(tmp_path / "nope.tsv", tmp_path)
