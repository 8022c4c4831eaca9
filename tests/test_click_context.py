"""Click context (gru4rec.items.context): hour of day and day of week as sin/cos, log(1 + seconds
since the session's previous click), against values computed by hand and by the datetime module."""
from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.errors import DataError
from gru4rec.items import CONTEXT_FEATURES, click_context, context_of


def by_hand(t: float, prev: float | None) -> list[float]:
    """The features from Python's datetime in UTC (an independent reading of the clock)."""
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    hour = d.hour + d.minute / 60 + (d.second + d.microsecond / 1e6) / 3600
    dow = d.weekday()  # Monday = 0
    gap = 0.0 if prev is None else math.log(1 + t - prev)
    return [math.sin(2 * math.pi * hour / 24), math.cos(2 * math.pi * hour / 24),
            math.sin(2 * math.pi * dow / 7), math.cos(2 * math.pi * dow / 7), gap]


def test_named_moments() -> None:
    assert CONTEXT_FEATURES == ("hour_sin", "hour_cos", "dow_sin", "dow_cos", "log_gap")
    # 1970-01-01 00:00 UTC, a Thursday (d = 3), first click.
    np.testing.assert_allclose(context_of(0.0)[0], [0, 1, math.sin(6 * math.pi / 7), math.cos(6 * math.pi / 7), 0],
                               atol=1e-7)
    # Monday 2026-11-30 18:00 UTC, 99 s after the previous click: hour angle 3π/2, d = 0, log 100.
    t = datetime(2026, 11, 30, 18, tzinfo=timezone.utc).timestamp()
    np.testing.assert_allclose(context_of(t, t - 99)[0], [-1, 0, 0, 1, math.log(100)], atol=1e-6)


def test_a_frame_against_datetime_and_the_one_click_form() -> None:
    rng = np.random.default_rng(0)
    n_sessions = 30
    lengths = rng.integers(1, 6, size=n_sessions)
    starts = rng.integers(1_500_000_000, 1_800_000_000, size=n_sessions)
    times = np.concatenate([s + np.cumsum(np.r_[0, rng.integers(0, 20_000, size=k - 1)]) for s, k in zip(starts, lengths,
                                                                                                       strict=True)])
    sessions = np.repeat(rng.permutation(1000)[:n_sessions], lengths)  # contiguous, not sorted by id
    df = pd.DataFrame({"SessionId": sessions, "ItemId": 1, "Time": times.astype(np.float64)})
    got = click_context(df)
    assert got.dtype == np.float32 and got.shape == (len(df), 5)
    want = []
    pos = 0
    for k in lengths:
        for j in range(k):
            want.append(by_hand(float(times[pos + j]), None if j == 0 else float(times[pos + j - 1])))
        pos += k
    np.testing.assert_allclose(got, np.array(want), atol=2e-6)
    # Serving: one click given the previous click's time gives the same row.
    for i in rng.choice(len(df), size=10, replace=False):
        first = i == 0 or sessions[i - 1] != sessions[i]
        one = context_of(times[i], None if first else times[i - 1])
        np.testing.assert_array_equal(one[0], got[i])


def test_milliseconds() -> None:
    df = pd.DataFrame({"SessionId": [1, 1], "Time": [86_400_000 * 4 + 3_600_000 * 6, 86_400_000 * 4 + 3_600_000 * 6 + 9_000]})
    got = click_context(df, seconds_per_tick=0.001)
    np.testing.assert_allclose(got, [by_hand(86_400 * 4 + 3_600 * 6, None), by_hand(86_400 * 4 + 3_600 * 6 + 9, 86_400 * 4 + 3_600 * 6)],
                               atol=1e-6)


@pytest.mark.parametrize(
    ("sessions", "times", "message"),
    [
        ([1, 2, 1], [0, 1, 2], "the rows of session 1 are not contiguous"),
        ([1, 1, 2], [5, 4, 6], "session 1 goes back in time at row 1"),
    ],
)
def test_unsorted_events_are_one_error(sessions: list[int], times: list[float], message: str) -> None:
    with pytest.raises(DataError, match=message):
        click_context(pd.DataFrame({"SessionId": sessions, "Time": times}))


def test_other_errors() -> None:
    with pytest.raises(DataError, match="no column 'Time'"):
        click_context(pd.DataFrame({"SessionId": [1]}))
    with pytest.raises(DataError, match="is after the click"):
        context_of(10.0, 11.0)
    with pytest.raises(DataError, match="non-finite time"):
        context_of(float("nan"))


RSC15 = Path(__file__).resolve().parents[2] / "shared" / "data" / "rsc15_100k" / "train_full.tsv"


@pytest.mark.skipif(not RSC15.exists(), reason=f"real rsc15 sample not found at {RSC15}")
def test_real_timestamps_of_rsc15() -> None:
    """rsc15_100k's real unix-second times, in the file's order (sorted by session and time, as
    click_context needs): the gaps against a pandas groupby, some rows against datetime."""
    from gru4rec.data import read_events

    df = read_events(RSC15)
    got = click_context(df)
    gap = df.groupby("SessionId", sort=False)["Time"].diff()
    np.testing.assert_allclose(got[:, 4], np.log1p(gap.fillna(0.0).to_numpy()), rtol=1e-6, atol=1e-6)
    assert int((got[:, 4] == 0).sum()) == df["SessionId"].nunique() + int((gap == 0).sum())
    rng = np.random.default_rng(1)
    for i in rng.choice(len(df), size=50, replace=False):
        first = i == 0 or df["SessionId"].iat[i - 1] != df["SessionId"].iat[i]
        want = by_hand(float(df["Time"].iat[i]), None if first else float(df["Time"].iat[i - 1]))
        np.testing.assert_allclose(got[i], want, atol=2e-6)
