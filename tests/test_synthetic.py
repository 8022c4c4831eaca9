"""Tests of the synthetic data set: shape, determinism, popularity skew, sequential structure,
time split and safe writing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.data.events import read_events
from gru4rec.datasets.synthetic import SPLIT_FILES, generate, time_split, write_synthetic
from gru4rec.errors import ConfigError, DataError

DAY = 86_400


@pytest.fixture(scope="module")
def small() -> pd.DataFrame:
    return generate(n_sessions=6_000, n_items=1_000, seed=3)


def test_columns_and_basic_shape(small: pd.DataFrame) -> None:
    assert list(small.columns) == ["SessionId", "ItemId", "Time"]
    assert all(small[c].dtype == np.int64 for c in small.columns)
    sid = small["SessionId"].to_numpy()
    assert np.all(np.diff(sid) >= 0)  # rows grouped by session
    assert small["SessionId"].nunique() == 6_000
    lengths = small.groupby("SessionId").size()
    assert lengths.min() >= 2
    assert 4.0 < lengths.mean() < 6.0  # mean_length=5
    assert lengths.max() > 15  # a real tail, not a constant length
    # Item ids are big random integers, not indices.
    assert small["ItemId"].min() >= 100_000_000


def test_times_increase_within_and_across_sessions(small: pd.DataFrame) -> None:
    sid = small["SessionId"].to_numpy()
    t = small["Time"].to_numpy()
    same = sid[1:] == sid[:-1]
    assert np.all(np.diff(t)[same] > 0)  # strictly increasing inside a session
    starts = small.groupby("SessionId")["Time"].min().sort_index().to_numpy()
    assert np.all(np.diff(starts) >= 0)  # session ids follow start time
    assert starts[-1] - starts[0] > 29 * DAY  # spread over the 30 days


def test_deterministic_by_seed() -> None:
    a = generate(n_sessions=500, n_items=200, seed=11)
    b = generate(n_sessions=500, n_items=200, seed=11)
    c = generate(n_sessions=500, n_items=200, seed=12)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_zipf_like_head(small: pd.DataFrame) -> None:
    counts = small["ItemId"].value_counts().to_numpy()
    n_items = 1_000
    top = counts[: n_items // 100].sum() / counts.sum()
    # Uniform popularity would give the top 1 % of items about 1 % of events.
    assert top > 0.1
    # ... and the tail is populated: most items occur.
    assert len(counts) > 0.8 * n_items


def test_markov_structure_beats_popularity(small: pd.DataFrame) -> None:
    train, test = time_split(small, 5 * DAY)

    def transitions(df: pd.DataFrame) -> pd.DataFrame:
        s = df["SessionId"].to_numpy()
        i = df["ItemId"].to_numpy()
        keep = s[1:] == s[:-1]
        return pd.DataFrame({"prev": i[:-1][keep], "next": i[1:][keep]})

    k = 20
    tr = transitions(train)
    counts = tr.groupby(["prev", "next"]).size().rename("n").reset_index()
    counts = counts.sort_values(["prev", "n", "next"], ascending=[True, False, True])
    markov_top = counts.groupby("prev").head(k)[["prev", "next"]]
    te = transitions(test)
    hits = te.merge(markov_top.assign(hit=1), on=["prev", "next"], how="left")["hit"].fillna(0)
    markov_hit = hits.mean()
    pop_top = set(train["ItemId"].value_counts().index[:k].tolist())
    pop_hit = te["next"].isin(pop_top).mean()
    assert len(te) > 2_000
    assert pop_hit > 0.1  # popularity is a real baseline here ...
    assert markov_hit > pop_hit + 0.2  # ... but the sequence carries much more


def brute_split(df: pd.DataFrame, seconds: float) -> tuple[set, set]:
    """Event keys (session, time) of train and test, by a direct loop over sessions."""
    boundary = df["Time"].max() - seconds
    train, test = {}, {}
    for sid, g in df.groupby("SessionId"):
        if g["Time"].min() >= boundary:
            test[sid] = g
        else:
            kept = g[g["Time"] < boundary]
            if len(kept) >= 2:
                train[sid] = kept
    train_items = set(pd.concat(train.values())["ItemId"])
    test_keys = set()
    for sid, g in test.items():
        g = g[g["ItemId"].isin(train_items)]
        if len(g) >= 2:
            test_keys |= {(sid, t) for t in g["Time"]}
    train_keys = {(sid, t) for sid, g in train.items() for t in g["Time"]}
    return train_keys, test_keys


def keys(df: pd.DataFrame) -> set:
    return set(zip(df["SessionId"].tolist(), df["Time"].tolist()))


def test_time_split_matches_brute_force() -> None:
    df = generate(n_sessions=800, n_items=300, seed=5, n_days=10)
    train, test = time_split(df, 2 * DAY)
    exp_train, exp_test = brute_split(df, 2 * DAY)
    assert keys(train) == exp_train
    assert keys(test) == exp_test
    assert len(test) > 0 and len(train) > 0


def test_time_split_is_the_pipeline_rule_plus_unknown_item_removal(tmp_path: Path) -> None:
    """`time_split` applies, to a DataFrame, the rule of docs/datasets.md that `gru4rec split`
    (split_events, via datasets.protocol.time_split) applies to event codes. The two must agree: the same train and
    test as split_events without filtering, except that time_split also removes test events
    whose item is not in train and then test sessions left shorter than 2."""
    from gru4rec.datasets.split import split_events

    df = generate(n_sessions=800, n_items=3_000, seed=5, n_days=10)
    # boundary on the 2nd event of a 2-event session: its 1st event alone is dropped from train,
    # and it starts before the boundary, so it is in neither set
    T = int(df["Time"].max())
    lengths = df.groupby("SessionId")["Time"].transform("size")
    cut = df[(lengths == 2) & (df["Time"] < T - 2 * DAY)].iloc[-1]
    seconds = T - int(cut["Time"])
    df = df.sample(frac=1.0, random_state=0)  # the row order must not matter
    train, test = time_split(df, seconds)
    split_events(df, tmp_path, days=seconds / DAY, min_item_support=1, min_session_length=2)
    pipe_train = pd.read_csv(tmp_path / "train_full.tsv", sep="\t")
    pipe_test = pd.read_csv(tmp_path / "test.tsv", sep="\t")

    def rows(frame: pd.DataFrame) -> pd.DataFrame:
        cols = ["SessionId", "ItemId", "Time"]
        return frame[cols].sort_values(cols).reset_index(drop=True).astype("int64")

    assert cut["SessionId"] not in set(train["SessionId"]) | set(test["SessionId"])
    pd.testing.assert_frame_equal(rows(train), rows(pipe_train))
    known = pipe_test[pipe_test["ItemId"].isin(pipe_train["ItemId"])]
    known = known[known.groupby("SessionId")["ItemId"].transform("size") >= 2]
    pd.testing.assert_frame_equal(rows(test), rows(known))
    # the difference is exercised: unknown items removed, and sessions left too short dropped
    assert len(known) < len(pipe_test)
    assert known["SessionId"].nunique() < pipe_test["SessionId"].nunique()
    assert len(test) > 0


def test_write_synthetic_files(tmp_path: Path) -> None:
    paths = write_synthetic(tmp_path / "synth", n_sessions=1_500, n_items=300, seed=2)
    assert sorted(p.name for p in paths.values()) == sorted(SPLIT_FILES)
    assert set(paths) == {"train_full", "test", "train_tr", "train_valid"}
    assert sorted(p.name for p in (tmp_path / "synth").iterdir()) == sorted(SPLIT_FILES)  # no temp files
    frames = {k: read_events(p) for k, p in paths.items()}
    full = generate(1_500, 300, 2)
    exp_train, exp_test = brute_split(full, DAY)
    assert keys(frames["train_full"]) == exp_train
    assert keys(frames["test"]) == exp_test
    exp_tr, exp_valid = brute_split(frames["train_full"], DAY)
    assert keys(frames["train_tr"]) == exp_tr
    assert keys(frames["train_valid"]) == exp_valid
    # test = sessions starting within the last day; train_full ends before it.
    boundary = full["Time"].max() - DAY
    assert frames["test"].groupby("SessionId")["Time"].min().min() >= boundary
    assert frames["train_full"]["Time"].max() < boundary
    assert frames["test"]["SessionId"].nunique() > 20


def test_write_synthetic_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "test.tsv").write_text("precious")
    with pytest.raises(DataError, match=r"test.tsv already exists; pass force=True to replace it"):
        write_synthetic(tmp_path, n_sessions=1_500, n_items=300)
    # Nothing was written, the user's file is intact.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.tsv"]
    assert (tmp_path / "test.tsv").read_text() == "precious"
    write_synthetic(tmp_path, n_sessions=1_500, n_items=300, force=True)
    assert read_events(tmp_path / "test.tsv")["SessionId"].nunique() > 20


def test_write_synthetic_empty_split(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"split would be empty"):
        write_synthetic(tmp_path, n_sessions=200, n_items=100, test_days=40)
    assert list(tmp_path.iterdir()) == []


def test_write_synthetic_bad_test_days(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"test_days=0"):
        write_synthetic(tmp_path, test_days=0)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"n_sessions": 0}, "n_sessions"),
        ({"n_items": 1}, "n_items"),
        ({"mean_length": 1.5}, "mean_length"),
        ({"p_successor": 1.5}, "p_successor"),
        ({"p_successor": 0.8, "p_topic": 0.3}, "p_topic"),
        ({"n_topics": 0}, "n_topics"),
        ({"n_days": 0}, "n_days"),
    ],
)
def test_generate_rejects_bad_parameters(kw: dict, name: str) -> None:
    with pytest.raises(ConfigError, match=rf"synthetic data: {name}="):
        generate(**{"n_sessions": 10, "n_items": 10, **kw})
