"""Each public data set's pipeline on a small hand-made raw file in its real format.

One scenario, worked out by hand, is written in every data set's raw format (columns,
separator, timestamp format, event types, session ids or user histories). min_item_support is
lowered to 2 so that the cases stay small; the published default (5) is exercised by the
real DIGINETICA sample (test_preprocess_diginetica_sample.py) and the unit tests.

The scenario, with B1 = T - D (test boundary), B2 = B1 - D (validation boundary), m = minute:

  s1  10@B2-300m 11@B2-290m                 train_tr
  s2  10@B2-280m 10@-279m 11@-219m 12@-218m  consecutive repeat dropped; the 60 min gap
                                            (exactly 1 h) does not cut the session
  s3  90@B2-270m 91@B2-269m                 pass 1: 90 (support 1) goes; pass 2: s3 = [91] goes
  s4  91@B2-260m 12@B2-259m                 pass 2: 91 is left with support 1 and goes;
                                            pass 3: s4 = [12] goes  (4 passes in all)
  s5  12@B2-250m                            length 1: goes in pass 1
  s6  10@B2-20m 11@B2-10m 12@B2+10m         crosses B2: train_tr keeps 10, 11
  s7  11@B2-5m 12@B2+5m                     crosses B2: train_tr part has length 1 -> dropped
  s8  12@B2 10@B2+30m                       starts exactly at B2: train_valid
  s9  11@B2+91m 12@B2+100m                  train_valid; for per-user data sets s8 and s9 are
                                            the same user, 61 min apart (two sessions), with a
                                            non-view event in the gap that must not bridge it
  s10 10@B1-20m 12@B1-10m 11@B1+10m         crosses B1: train_full keeps 10, 12, and so
                                            does train_valid (it starts after B2)
  s11 12@B1-5m 10@B1+5m                     crosses B1: train part has length 1 -> dropped
  s12 11@B1 10@B1+30m                       starts exactly at B1: test
  s13 20@B1+60m 21@B1+70m                   test; items 20, 21 are unknown to train: kept
  s14 20@LAST-10m 21@LAST                   test; LAST = T when T is the latest event
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.datasets import PIPELINES, preprocess

MIN_SUPPORT = 2


def scenario(B1: int, B2: int, last: int, m: int) -> list[tuple[int, int, int]]:
    """(scenario session, item, time) of the raw view events."""
    return [
        (1, 10, B2 - 300 * m), (1, 11, B2 - 290 * m),
        (2, 10, B2 - 280 * m), (2, 10, B2 - 279 * m), (2, 11, B2 - 219 * m), (2, 12, B2 - 218 * m),
        (3, 90, B2 - 270 * m), (3, 91, B2 - 269 * m),
        (4, 91, B2 - 260 * m), (4, 12, B2 - 259 * m),
        (5, 12, B2 - 250 * m),
        (6, 10, B2 - 20 * m), (6, 11, B2 - 10 * m), (6, 12, B2 + 10 * m),
        (7, 11, B2 - 5 * m), (7, 12, B2 + 5 * m),
        (8, 12, B2), (8, 10, B2 + 30 * m),
        (9, 11, B2 + 91 * m), (9, 12, B2 + 100 * m),
        (10, 10, B1 - 20 * m), (10, 12, B1 - 10 * m), (10, 11, B1 + 10 * m),
        (11, 12, B1 - 5 * m), (11, 10, B1 + 5 * m),
        (12, 11, B1), (12, 10, B1 + 30 * m),
        (13, 20, B1 + 60 * m), (13, 21, B1 + 70 * m),
        (14, 20, last - 10 * m), (14, 21, last),
    ]


def expected(B1: int, B2: int, last: int, m: int) -> dict[str, list[tuple[int, int, int]]]:
    """The four outputs, worked out by hand from the table in the module docstring."""
    return {
        "train_full": [
            (1, 10, B2 - 300 * m), (1, 11, B2 - 290 * m),
            (2, 10, B2 - 280 * m), (2, 11, B2 - 219 * m), (2, 12, B2 - 218 * m),
            (6, 10, B2 - 20 * m), (6, 11, B2 - 10 * m), (6, 12, B2 + 10 * m),
            (7, 11, B2 - 5 * m), (7, 12, B2 + 5 * m),
            (8, 12, B2), (8, 10, B2 + 30 * m),
            (9, 11, B2 + 91 * m), (9, 12, B2 + 100 * m),
            (10, 10, B1 - 20 * m), (10, 12, B1 - 10 * m),
        ],
        "test": [
            (12, 11, B1), (12, 10, B1 + 30 * m),
            (13, 20, B1 + 60 * m), (13, 21, B1 + 70 * m),
            (14, 20, last - 10 * m), (14, 21, last),
        ],
        "train_tr": [
            (1, 10, B2 - 300 * m), (1, 11, B2 - 290 * m),
            (2, 10, B2 - 280 * m), (2, 11, B2 - 219 * m), (2, 12, B2 - 218 * m),
            (6, 10, B2 - 20 * m), (6, 11, B2 - 10 * m),
        ],
        "train_valid": [
            (8, 12, B2), (8, 10, B2 + 30 * m),
            (9, 11, B2 + 91 * m), (9, 12, B2 + 100 * m),
            (10, 10, B1 - 20 * m), (10, 12, B1 - 10 * m),
        ],
    }


NAMES = ("train_full", "test", "train_tr", "train_valid")


def read_out(out: Path, name: str, item_dtype: type = int) -> pd.DataFrame:
    df = pd.read_csv(out / f"{name}.tsv", sep="\t", dtype={"ItemId": str})
    assert list(df.columns) == ["SessionId", "ItemId", "Time"]
    df["ItemId"] = df["ItemId"].astype(item_dtype)
    return df


def assert_written(out: Path, exp: dict, *, sid=lambda s: s, iid=lambda i: i, scale: float = 1.0,
                   item_dtype: type = int) -> None:
    """Every file equals the expected rows (ids mapped, time divided by scale), in file order."""
    for name in NAMES:
        got = read_out(out, name, item_dtype)
        want = pd.DataFrame(
            [(sid(s), iid(i), t / scale) for s, i, t in exp[name]], columns=["SessionId", "ItemId", "Time"]
        )
        assert got["SessionId"].tolist() == want["SessionId"].tolist(), name
        assert got["ItemId"].tolist() == want["ItemId"].tolist(), name
        np.testing.assert_allclose(got["Time"].to_numpy(float), want["Time"].to_numpy(float), rtol=0, atol=1e-6,
                                   err_msg=name)


def assert_stats(stats: pd.DataFrame, exp: dict, scale: float = 1.0, n_filtered: int = 11) -> None:
    """The returned stats table matches the expected sets."""
    st = stats.set_index("file")
    for name in NAMES:
        rows = exp[name]
        assert st.loc[name, "events"] == len(rows)
        assert st.loc[name, "sessions"] == len({r[0] for r in rows})
        assert st.loc[name, "items"] == len({r[1] for r in rows})
        assert st.loc[name, "first_time"] == pytest.approx(min(r[2] for r in rows) / scale)
        assert st.loc[name, "last_time"] == pytest.approx(max(r[2] for r in rows) / scale)
    # s1, s2, s6..s14 survive the filters
    assert st.loc["filtered", "sessions"] == n_filtered


def canonical(out: Path, name: str) -> list[tuple]:
    """Sessions as item/time sequences, ordered by their first time (ids ignored)."""
    df = read_out(out, name, str)
    seqs = [tuple(zip(g["ItemId"], g["Time"].astype(np.int64))) for _, g in df.groupby("SessionId", sort=False)]
    return sorted(seqs, key=lambda s: (s[0][1], s))


def canonical_expected(exp: dict, name: str, iid) -> list[tuple]:
    sessions: dict[int, list] = {}
    for s, i, t in exp[name]:
        sessions.setdefault(s, []).append((iid(i), t))
    return sorted((tuple(v) for v in sessions.values()), key=lambda s: (s[0][1], s))


def run(name: str, raw, out: Path, **kw) -> pd.DataFrame:
    return preprocess(name, raw, out, progress=False, min_item_support=MIN_SUPPORT, **kw)


def ms(ts: str) -> int:
    return int(pd.Timestamp(ts, tz="UTC").value // 1_000_000)


# ------------------------------------------------------------------------------------------
# yoochoose: given sessions, clicks + test files, ISO timestamps with ms, float seconds out


def iso(t_ms: int) -> str:
    return pd.Timestamp(t_ms, unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_yoochoose(tmp_path: Path) -> None:
    m, D = 60_000, 86_400_000
    T = ms("2014-09-30 20:00:00.123")
    B1, B2 = T - D, T - 2 * D
    events = scenario(B1, B2, T, m)
    clicks = [f"{1000 + s},{iso(t)},{214500000 + i},0" for s, i, t in events if s < 12]
    test = [f"{1000 + s},{iso(t)},{214500000 + i},S" for s, i, t in events if s >= 12]
    assert clicks[0] == "1001,2014-09-28T15:00:00.123Z,214500010,0"  # the real format
    (tmp_path / "yoochoose-clicks.dat").write_text("\n".join(clicks) + "\n")
    (tmp_path / "yoochoose-test.dat").write_text("\n".join(test) + "\n")
    out = tmp_path / "out"
    # a folder resolves to the two expected file names; chunks of 4 rows split sessions
    stats = run("yoochoose", tmp_path, out, chunksize=4)
    exp = expected(B1, B2, T, m)
    assert_written(out, exp, sid=lambda s: 1000 + s, iid=lambda i: 214500000 + i, scale=1000)
    assert_stats(stats, exp, scale=1000)
    # the stats file is written too
    assert pd.read_csv(out / "stats.tsv", sep="\t")["events"].tolist() == stats["events"].tolist()


# ------------------------------------------------------------------------------------------
# rees46: per-user 1 h sessions of view events, "YYYY-MM-DD HH:MM:SS UTC", fixed T


REES_HEADER = "event_time,event_type,product_id,category_id,category_code,brand,price,user_id,user_session"


def rees_row(t_s: int, kind: str, item: int, user: int) -> str:
    when = pd.Timestamp(t_s, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{when},{kind},{item},2053013555631882655,electronics.smartphone,apple,{item * 1.5:.2f},{user},s-{user}"


def user_of(s: int) -> int:
    """s8 and s9 belong to the same user; every other scenario session to its own user."""
    return 100 + (8 if s == 9 else s)


def test_rees46(tmp_path: Path) -> None:
    m, D = 60, 86_400
    T = 1_575_158_400  # the fixed boundary 2019-12-01 00:00:00 UTC
    B1, B2 = T - D, T - 2 * D
    last = T - m  # T is fixed: the latest event is not T
    events = scenario(B1, B2, last, m)
    nov = [REES_HEADER] + [rees_row(t, "view", i, user_of(s)) for s, i, t in events]
    # non-view events: a cart between s8 and s9 would bridge the 61 min gap if it counted
    nov.append(rees_row(B2 + 61 * m, "cart", 12, 108))
    nov.append(rees_row(B2 + 62 * m, "purchase", 12, 108))
    # October: one more user (115) with an early session, and a purchase of an unseen product
    oct_ = [REES_HEADER, rees_row(ms("2019-10-15 10:00:00") // 1000, "view", 10, 115),
            rees_row(ms("2019-10-15 10:05:00") // 1000, "view", 11, 115),
            rees_row(ms("2019-10-15 10:06:00") // 1000, "purchase", 77, 115)]
    assert nov[1].startswith("2019-11-28 19:00:00 UTC,view,10,")
    (tmp_path / "2019-Oct.csv").write_text("\n".join(oct_) + "\n")
    (tmp_path / "2019-Nov.csv").write_text("\n".join(nov) + "\n")
    out = tmp_path / "out"
    stats = run("rees46", [tmp_path / "2019-Oct.csv", tmp_path / "2019-Nov.csv"], out, chunksize=5)
    exp = expected(B1, B2, last, m)
    # new session ids follow (user, time): users 101..114 -> sessions 1..14 (s8, s9 of user
    # 108 -> 8, 9); user 115's October session is session 15, in train_full and train_tr
    early = [(15, 10, ms("2019-10-15 10:00:00") // 1000), (15, 11, ms("2019-10-15 10:05:00") // 1000)]
    for name in ("train_full", "train_tr"):
        exp[name] = exp[name] + early
    assert_written(out, exp)
    assert_stats(stats, exp, n_filtered=12)


# ------------------------------------------------------------------------------------------
# retailrocket: per-visitor 1 h sessions of view events, epoch ms, D = 7 days, fixed T


def test_retailrocket(tmp_path: Path) -> None:
    m, D = 60_000, 7 * 86_400_000
    T = 1_442_545_200_000
    B1, B2 = T - D, T - 2 * D
    last = T - m
    events = scenario(B1, B2, last, m)
    rows = ["timestamp,visitorid,event,itemid,transactionid"]
    rows += [f"{t},{user_of(s)},view,{i}," for s, i, t in events]
    rows.append(f"{B2 + 61 * m},108,addtocart,12,")  # must not bridge s8 -> s9
    rows.append(f"{B2 + 62 * m},108,transaction,12,4000")
    # the raw file is not sorted
    rows = [rows[0]] + rows[1:][::-1]
    (tmp_path / "events.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    stats = run("retailrocket", tmp_path / "events.csv", out)
    exp = expected(B1, B2, last, m)
    assert_written(out, exp)
    assert_stats(stats, exp)


# ------------------------------------------------------------------------------------------
# coveo: session hashes cut again by a 1 h gap, product_action == detail, epoch ms


def sku(i: int) -> str:
    return hashlib.sha256(f"sku{i}".encode()).hexdigest()


def session_hash(s: int) -> str:
    return hashlib.sha256(f"session{8 if s == 9 else s}".encode()).hexdigest()


def test_coveo(tmp_path: Path) -> None:
    m, D = 60_000, 86_400_000
    T = 1_550_000_000_123
    B1, B2 = T - D, T - 2 * D
    events = scenario(B1, B2, T, m)
    rows = ["session_id_hash,event_type,product_action,product_sku_hash,server_timestamp_epoch_ms,hashed_url"]
    rows += [f"{session_hash(s)},event_product,detail,{sku(i)},{t},{sku(1000 + i)}" for s, i, t in events]
    # non-detail events: a plain page view (no action, no product) in the s8/s9 gap, an add
    rows.append(f"{session_hash(8)},pageview,,,{B2 + 61 * m},{sku(5000)}")
    rows.append(f"{session_hash(8)},event_product,add,{sku(12)},{B2 + 62 * m},{sku(5001)}")
    (tmp_path / "browsing_train.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    stats = run("coveo", tmp_path / "browsing_train.csv", out, chunksize=7)
    exp = expected(B1, B2, T, m)
    # the written session ids are new integers: compare sessions as item/time sequences
    for name in NAMES:
        assert canonical(out, name) == canonical_expected(exp, name, sku), name
    assert_stats(stats, exp)
    # the session hash shared by s8 and s9 became two sessions (s8, s9, s10 in train_valid)
    valid = read_out(out, "train_valid", str)
    assert valid["SessionId"].nunique() == 3


# ------------------------------------------------------------------------------------------
# diginetica: given sessions, ';' separated, time = session date (ms) + timeframe, D = 7 days


def test_diginetica(tmp_path: Path) -> None:
    m, D = 60_000, 7 * 86_400_000
    T = ms("2016-05-31 14:00:00")
    B1, B2 = T - D, T - 2 * D
    events = scenario(B1, B2, T, m)
    first = {}
    for s, _, t in events:
        first.setdefault(s, t)
    rows = ["sessionId;userId;itemId;timeframe;eventdate"]
    for s, i, t in events:
        day = first[s] - first[s] % 86_400_000  # the session's date
        date = pd.Timestamp(day, unit="ms").strftime("%Y-%m-%d")
        if s == 6 and t == B2 + 10 * m:
            # a row dated one day later: the session's earliest date still anchors its time
            date = pd.Timestamp(day + 86_400_000, unit="ms").strftime("%Y-%m-%d")
        user = "NA" if s % 2 else str(5000 + s)
        rows.append(f"{s};{user};{i};{t - day};{date}")
    assert rows[1] == "1;NA;10;32400000;2016-05-17"
    (tmp_path / "train-item-views.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    stats = run("diginetica", tmp_path / "train-item-views.csv", out, chunksize=6)
    exp = expected(B1, B2, T, m)
    assert_written(out, exp)
    assert_stats(stats, exp)


# ------------------------------------------------------------------------------------------
# rsc15: the papers' protocol on yoochoose-clicks.dat


def test_rsc15(tmp_path: Path) -> None:
    """No de-duplication, one filtering pass, test = sessions whose LAST event is in the final
    day, unknown test items removed, then short test sessions; the same on train with train's
    own latest event (T2) as the end.

      r1  10@A-300m 10@A-299m 11@A-298m   repeat kept (no de-duplication)          train_tr
      r2  11@A-290m 12@A-289m                                                       train_tr
      r3  12@A-280m                       length 1: dropped first
      r4  90@A-270m 10@A-269m             90 (support 1) goes, then r4 = [10] goes
      r6  93@A-260m 12@A-259m             93 keeps support 1 after r7 goes: one pass only  train_tr
      r7  93@A-250m 94@A-249m             94 (support 1) goes, then r7 = [93] goes
      r12 10@A-10m 11@A+10m               ends after A: train_valid
      r13 12@A-20m 10@A                   ends exactly at A: train_valid
      r14 96@A+30m 10@A+40m               96 unknown to train_tr: removed, then [10] goes
      r15 96@A+50m 11@A+60m               same; both stay in train_full
      r9  11@B1-60m 12@B1-50m = T2        latest train event: train_valid
      r8  10@B1-30m 11@B1+10m             ends after B1: test, with its event before B1
      r16 10@B1-5m 12@B1                  ends exactly at B1: test
      r10 10@B1+20m 95@B1+30m 11@B1+40m   95 unknown to train: removed -> [10, 11]  test
      r11 95@B1+50m 12@T                  -> [12]: dropped
    with T the latest click, B1 = T - 1 day, T2 = B1 - 50 min, A = T2 - 1 day.
    """
    m, D = 60_000, 86_400_000
    T = ms("2014-09-30 20:00:00.456")
    B1 = T - D
    T2 = B1 - 50 * m
    A = T2 - D
    events = [
        (1, 10, A - 300 * m), (1, 10, A - 299 * m), (1, 11, A - 298 * m),
        (2, 11, A - 290 * m), (2, 12, A - 289 * m),
        (3, 12, A - 280 * m),
        (4, 90, A - 270 * m), (4, 10, A - 269 * m),
        (6, 93, A - 260 * m), (6, 12, A - 259 * m),
        (7, 93, A - 250 * m), (7, 94, A - 249 * m),
        (12, 10, A - 10 * m), (12, 11, A + 10 * m),
        (13, 12, A - 20 * m), (13, 10, A),
        (14, 96, A + 30 * m), (14, 10, A + 40 * m),
        (15, 96, A + 50 * m), (15, 11, A + 60 * m),
        (9, 11, B1 - 60 * m), (9, 12, T2),
        (8, 10, B1 - 30 * m), (8, 11, B1 + 10 * m),
        (16, 10, B1 - 5 * m), (16, 12, B1),
        (10, 10, B1 + 20 * m), (10, 95, B1 + 30 * m), (10, 11, B1 + 40 * m),
        (11, 95, B1 + 50 * m), (11, 12, T),
    ]
    events.sort()  # the real file is ordered by session, then time
    lines = [f"{s},{iso(t)},{214500000 + i},0" for s, i, t in events]
    (tmp_path / "yoochoose-clicks.dat").write_text("\n".join(lines) + "\n")
    exp = {
        "train_full": [
            (1, 10, A - 300 * m), (1, 10, A - 299 * m), (1, 11, A - 298 * m),
            (2, 11, A - 290 * m), (2, 12, A - 289 * m),
            (6, 93, A - 260 * m), (6, 12, A - 259 * m),
            (9, 11, B1 - 60 * m), (9, 12, T2),
            (12, 10, A - 10 * m), (12, 11, A + 10 * m),
            (13, 12, A - 20 * m), (13, 10, A),
            (14, 96, A + 30 * m), (14, 10, A + 40 * m),
            (15, 96, A + 50 * m), (15, 11, A + 60 * m),
        ],
        "test": [
            (8, 10, B1 - 30 * m), (8, 11, B1 + 10 * m),
            (10, 10, B1 + 20 * m), (10, 11, B1 + 40 * m),
            (16, 10, B1 - 5 * m), (16, 12, B1),
        ],
        "train_tr": [
            (1, 10, A - 300 * m), (1, 10, A - 299 * m), (1, 11, A - 298 * m),
            (2, 11, A - 290 * m), (2, 12, A - 289 * m),
            (6, 93, A - 260 * m), (6, 12, A - 259 * m),
        ],
        "train_valid": [
            (9, 11, B1 - 60 * m), (9, 12, T2),
            (12, 10, A - 10 * m), (12, 11, A + 10 * m),
            (13, 12, A - 20 * m), (13, 10, A),
        ],
    }
    out = tmp_path / "out"
    stats = run("rsc15", tmp_path / "yoochoose-clicks.dat", out, chunksize=10)
    assert_written(out, exp, iid=lambda i: 214500000 + i, scale=1000)
    st = stats.set_index("file")
    for name in NAMES:
        assert st.loc[name, "events"] == len(exp[name])
        assert st.loc[name, "sessions"] == len({r[0] for r in exp[name]})


def test_registry_lists_the_six_data_sets() -> None:
    assert sorted(PIPELINES) == ["coveo", "diginetica", "rees46", "retailrocket", "rsc15", "yoochoose"]
    for name, module in PIPELINES.items():
        assert module.INFO.name == name and module.INFO.raw_files and module.INFO.download


def test_published_min_support_five(tmp_path: Path) -> None:
    """With the default min support 5 the same retailrocket file loses items 90, 91 (as
    before) and also 20, 21 (support 2): s13 and s14 vanish and the test set is s12 alone."""
    m, D = 60_000, 7 * 86_400_000
    T = 1_442_545_200_000
    B1, B2 = T - D, T - 2 * D
    rows = ["timestamp,visitorid,event,itemid,transactionid"]
    rows += [f"{t},{user_of(s)},view,{i}," for s, i, t in scenario(B1, B2, T - m, m)]
    (tmp_path / "events.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    stats = preprocess("retailrocket", tmp_path / "events.csv", out, progress=False)
    exp = expected(B1, B2, T - m, m)
    exp["test"] = [r for r in exp["test"] if r[0] == 12]
    assert_written(out, exp)
    assert stats.set_index("file").loc["filtered", "items"] == 3
