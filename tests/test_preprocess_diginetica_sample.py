"""Real raw DIGINETICA rows (../shared/data/raw_samples) through the diginetica pipeline.

The four files must equal an independent, plain-pandas reading of docs/datasets.md (groupby based,
not sharing any code with the pipeline), and be internally consistent: stats agree with the
files, every test session starts at or after T - 7 days, train events are before it, no
session has fewer than 2 events, every item of the filtered data has support >= 5.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gru4rec.datasets import preprocess

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "raw_samples" / "diginetica_train-item-views_sample.csv"
DAY_MS = 86_400_000
pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason=f"real DIGINETICA sample not found at {SAMPLE}")


def reference(path: Path) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The DIGINETICA pipeline of docs/datasets.md, written as directly as possible with pandas groupby."""
    raw = pd.read_csv(path, sep=";")
    raw.columns = [c.lower().replace("_", "") for c in raw.columns]
    date_ms = (pd.to_datetime(raw["eventdate"]) - pd.Timestamp("1970-01-01")) // pd.Timedelta(milliseconds=1)
    session_date = date_ms.groupby(raw["sessionid"]).transform("min")
    df = pd.DataFrame({"SessionId": raw["sessionid"], "ItemId": raw["itemid"],
                       "Time": session_date + raw["timeframe"]})
    df = df.sort_values(["SessionId", "Time", "ItemId"]).reset_index(drop=True)
    repeat = (df["SessionId"] == df["SessionId"].shift()) & (df["ItemId"] == df["ItemId"].shift())
    df = df[~repeat]
    while True:
        n = len(df)
        df = df[df.groupby("SessionId")["ItemId"].transform("size") >= 2]
        df = df[df.groupby("ItemId")["SessionId"].transform("size") >= 5]
        if len(df) == n:
            break

    def split(data: pd.DataFrame, boundary: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        start = data.groupby("SessionId")["Time"].transform("min")
        test = data[start >= boundary]
        train = data[data["Time"] < boundary]
        train = train[train.groupby("SessionId")["ItemId"].transform("size") >= 2]
        return train, test

    T = df["Time"].max()
    train_full, test = split(df, T - 7 * DAY_MS)
    train_tr, valid = split(train_full, T - 14 * DAY_MS)
    sets = {"train_full": train_full, "test": test, "train_tr": train_tr, "train_valid": valid}
    return df, {k: v.reset_index(drop=True) for k, v in sets.items()}


def test_real_sample_matches_reference_and_is_consistent(tmp_path: Path) -> None:
    stats = preprocess("diginetica", SAMPLE, tmp_path, progress=False).set_index("file")
    filtered, want = reference(SAMPLE)
    got = {name: pd.read_csv(tmp_path / f"{name}.tsv", sep="\t") for name in want}
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_dtype=False, obj=name)
        assert len(got[name]) > 0, name

    # stats agree with the files written
    for name, df in got.items():
        assert stats.loc[name, "events"] == len(df)
        assert stats.loc[name, "sessions"] == df["SessionId"].nunique()
        assert stats.loc[name, "items"] == df["ItemId"].nunique()
        assert stats.loc[name, "first_time"] == df["Time"].min()
        assert stats.loc[name, "last_time"] == df["Time"].max()
    assert stats.loc["filtered", "events"] == len(filtered)
    assert pd.read_csv(tmp_path / "stats.tsv", sep="\t").set_index("file")["events"].equals(stats["events"])

    # the split rules, checked on the files
    T = filtered["Time"].max()
    B1, B2 = T - 7 * DAY_MS, T - 14 * DAY_MS
    assert got["test"].groupby("SessionId")["Time"].min().min() >= B1
    assert got["train_full"]["Time"].max() < B1
    assert got["train_valid"].groupby("SessionId")["Time"].min().min() >= B2
    assert got["train_tr"]["Time"].max() < B2
    assert set(got["train_valid"]["SessionId"]) <= set(got["train_full"]["SessionId"])
    assert not set(got["test"]["SessionId"]) & set(got["train_full"]["SessionId"])
    for name, df in got.items():
        assert df.groupby("SessionId").size().min() >= 2, name
        # sessions are contiguous and time-ordered in the files
        assert df["SessionId"].is_monotonic_increasing, name
        assert (df.groupby("SessionId")["Time"].diff().dropna() >= 0).all(), name
    # every item of the filtered data has support >= 5; test may hold items train lacks
    assert filtered.groupby("ItemId").size().min() >= 5
    # real data: the sample's 12,390 rows shrink to a few hundred events (measured 779)
    assert stats.loc["filtered", "events"] == 779
