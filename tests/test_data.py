"""Tests of gru4rec.data: readers and validation (events), ItemMap (items), sessions as arrays and
item support (sessions)."""
from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.data import (
    ItemMap,
    Sessions,
    item_support,
    read_events,
    sessions_from_events,
    validate_events,
    write_events,
)
from gru4rec.errors import DataError, Gru4RecError

KEYS = ["SessionId", "ItemId", "Time"]


def frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=KEYS)


def session_lists(s: Sessions) -> list[list[int]]:
    return [s.items[a:b].tolist() for a, b in zip(s.offsets[:-1], s.offsets[1:])]


# ---------------------------------------------------------------------------------------------
# ItemMap
# ---------------------------------------------------------------------------------------------


def test_item_map_first_appearance_order_and_lookup() -> None:
    m = ItemMap.from_ids([30, 10, 30, 20, 10, 214821371])
    assert len(m) == 4
    assert m.ids.tolist() == [30, 10, 20, 214821371]
    assert m.ids.dtype == np.int64
    idx = m.index_of([10, 99, 20, 214821371, 30])
    assert idx.dtype == np.int64
    assert idx.tolist() == [1, -1, 2, 3, 0]
    assert m.index_of(20).tolist() == [2]
    assert 10 in m and 11 not in m


def test_item_map_string_ids_and_json_round_trip() -> None:
    m = ItemMap.from_ids(pd.Series(["b", "a", "b", "c"]))
    assert m.ids.tolist() == ["b", "a", "c"]
    assert m.index_of(np.array(["c", "zz", "b"], dtype=object)).tolist() == [2, -1, 0]
    lst = json.loads(json.dumps(m.to_list()))
    assert ItemMap.from_list(lst) == m


def test_item_map_to_list_gives_python_scalars() -> None:
    m = ItemMap.from_ids(np.array([5, 7, 5], dtype=np.int64))
    lst = m.to_list()
    assert lst == [5, 7] and all(type(x) is int for x in lst)
    assert ItemMap.from_list(lst) == m
    # Same values but another id type, or another order: a different map.
    assert ItemMap.from_list(["5", "7"]) != m
    assert ItemMap.from_list([7, 5]) != m


def test_item_map_from_list_duplicates() -> None:
    with pytest.raises(DataError, match=r"duplicate item id 3"):
        ItemMap.from_list([1, 3, 2, 3])


def test_item_map_from_list_needs_list() -> None:
    with pytest.raises(DataError, match="expected a list"):
        ItemMap.from_list("abc")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# sessions_from_events
# ---------------------------------------------------------------------------------------------


def reference_sessions(df: pd.DataFrame, ids: list, order: str) -> tuple[list[list[int]], list]:
    """Brute force: group rows by session, sort each by (time, row), arrange sessions."""
    index = {x: i for i, x in enumerate(ids)}
    groups: dict = {}
    for pos, (sid, iid, t) in enumerate(df[KEYS].itertuples(index=False)):
        groups.setdefault(sid, []).append((t, pos, index[iid]))
    if order == "time":
        keys = sorted(groups, key=lambda s: (min(e[0] for e in groups[s]), s))
    else:
        keys = sorted(groups)
    return [[e[2] for e in sorted(groups[s])] for s in keys], keys


def test_sessions_hand_made_order_by_time() -> None:
    # Unsorted input, a session interleaved with others, a time tie inside session 'b'
    # (file order kept) and a tie of first times between 'c' and 'a' (broken by id).
    df = frame(
        [
            ("b", 5, 3.0),
            ("c", 6, 1.0),
            ("b", 7, 2.0),
            ("a", 8, 1.0),
            ("b", 9, 3.0),
            ("a", 5, 0.5),
            ("d", 6, 9.0),
        ]
    )
    m = ItemMap.from_ids([5, 6, 7, 8, 9])  # 5->0, 6->1, 7->2, 8->3, 9->4
    s, n_dropped = sessions_from_events(df, m)
    assert n_dropped == 0
    # First times: a 0.5, c 1.0, b 2.0, d 9.0.
    assert s.session_ids.tolist() == ["a", "c", "b", "d"]
    assert s.offsets.tolist() == [0, 2, 3, 6, 7]
    assert s.offsets.dtype == np.int64 and s.items.dtype == np.int64
    assert session_lists(s) == [[0, 3], [1], [2, 0, 4], [1]]
    assert s.n_sessions == 4 and s.n_events == 7
    assert s.lengths.tolist() == [2, 1, 3, 1]  # length-1 sessions are kept


def test_sessions_tie_of_first_time_broken_by_id() -> None:
    df = frame([(3, 1, 10), (3, 2, 11), (1, 2, 10), (1, 1, 12), (2, 1, 10), (2, 3, 13)])
    m = ItemMap.from_ids([1, 2, 3])
    s, _ = sessions_from_events(df, m, order="time")
    assert s.session_ids.tolist() == [1, 2, 3]
    assert session_lists(s) == [[1, 0], [0, 2], [0, 1]]


def test_sessions_order_by_id() -> None:
    df = frame([(20, 1, 1), (3, 2, 5), (20, 2, 2), (100, 3, 0), (3, 1, 4)])
    m = ItemMap.from_ids(df["ItemId"])  # 1->0, 2->1, 3->2
    s, _ = sessions_from_events(df, m, order="id")
    assert s.session_ids.tolist() == [3, 20, 100]  # numeric, not string, order
    assert session_lists(s) == [[0, 1], [0, 1], [2]]
    s, _ = sessions_from_events(df, m, order="time")
    assert s.session_ids.tolist() == [100, 20, 3]


def test_sessions_string_ids_order_by_id_is_lexicographic() -> None:
    df = frame([("s10", 1, 1), ("s9", 2, 2), ("s10", 2, 3), ("s9", 1, 4)])
    s, _ = sessions_from_events(df, ItemMap.from_ids([1, 2]), order="id")
    assert s.session_ids.tolist() == ["s10", "s9"]
    assert session_lists(s) == [[0, 1], [1, 0]]


def test_sessions_already_sorted_input_is_unchanged() -> None:
    df = frame([(1, 1, 1), (1, 2, 2), (2, 2, 3), (2, 3, 4), (2, 1, 5)])
    s, _ = sessions_from_events(df, ItemMap.from_ids(df["ItemId"]))
    assert s.items.tolist() == [0, 1, 1, 2, 0]
    assert s.offsets.tolist() == [0, 2, 5]


@pytest.mark.parametrize("order", ["time", "id"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sessions_match_brute_force(order: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 400
    # Few distinct times so that ties (inside sessions and between starts) are common.
    df = frame(
        list(
            zip(
                rng.integers(0, 60, n).tolist(),
                (rng.integers(0, 30, n) * 1000 + 7).tolist(),
                rng.integers(0, 40, n).astype(float).tolist(),
            )
        )
    )
    if seed == 2:
        df = df.sort_values(["SessionId", "Time"], kind="stable").reset_index(drop=True)
    m = ItemMap.from_ids(df["ItemId"])
    s, _ = sessions_from_events(df, m, order=order)  # type: ignore[arg-type]
    expected, keys = reference_sessions(df, m.ids.tolist(), order)
    assert session_lists(s) == expected
    assert s.session_ids.tolist() == keys
    assert s.offsets[0] == 0 and s.offsets[-1] == n


def test_sessions_time_sorted_input_shortcut_matches_brute_force() -> None:
    # Globally time-sorted but interleaved sessions (a raw click log).
    rng = np.random.default_rng(5)
    n = 300
    df = frame(
        list(zip(rng.integers(0, 50, n).tolist(), rng.integers(0, 20, n).tolist(), np.sort(rng.integers(0, 100, n)).tolist()))
    )
    m = ItemMap.from_ids(df["ItemId"])
    s, _ = sessions_from_events(df, m)
    expected, keys = reference_sessions(df, m.ids.tolist(), "time")
    assert session_lists(s) == expected and s.session_ids.tolist() == keys


def test_sessions_drop_unknown() -> None:
    df = frame([(1, "A", 1), (1, "X", 2), (1, "B", 3), (2, "Y", 1), (2, "A", 2), (3, "Z", 5)])
    m = ItemMap.from_ids(["A", "B"])
    s, n_dropped = sessions_from_events(df, m, drop_unknown=True)
    assert n_dropped == 3
    # A, X, B -> A, B; session 3 vanishes entirely.
    assert s.session_ids.tolist() == [1, 2]
    assert session_lists(s) == [[0, 1], [0]]


def test_sessions_drop_unknown_everything() -> None:
    df = frame([(1, "X", 1), (1, "Y", 2)])
    s, n_dropped = sessions_from_events(df, ItemMap.from_ids(["A"]), drop_unknown=True)
    assert n_dropped == 2 and s.n_sessions == 0 and s.offsets.tolist() == [0] and s.n_events == 0


def test_sessions_unknown_item_is_an_error() -> None:
    df = frame([(1, "A", 1), (1, "X", 2), (1, "W", 3)])
    with pytest.raises(DataError, match=r"'ItemId' has 2 item id\(s\) not in the item map, first 'X' at row 1"):
        sessions_from_events(df, ItemMap.from_ids(["A"]))


def test_sessions_missing_column() -> None:
    df = pd.DataFrame({"SessionId": [1], "Item": [1], "Time": [1]})
    with pytest.raises(DataError, match=r"missing column 'ItemId'.*'Item'"):
        sessions_from_events(df, ItemMap.from_ids([1]))


def test_sessions_bad_order() -> None:
    df = frame([(1, 1, 1)])
    with pytest.raises(ValueError, match="order must be"):
        sessions_from_events(df, ItemMap.from_ids([1]), order="random")  # type: ignore[arg-type]


def test_sessions_custom_column_names() -> None:
    df = pd.DataFrame({"sess": [2, 1, 2], "item": ["x", "y", "y"], "ts": [5, 9, 6]})
    s, _ = sessions_from_events(df, ItemMap.from_ids(df["item"]), session_key="sess", item_key="item", time_key="ts")
    assert s.session_ids.tolist() == [2, 1] and session_lists(s) == [[0, 1], [1]]


# ---------------------------------------------------------------------------------------------
# item_support
# ---------------------------------------------------------------------------------------------


def test_item_support_matches_counter() -> None:
    rng = np.random.default_rng(0)
    items = rng.integers(0, 17, 500)
    sup = item_support(items, 20)
    counts = Counter(items.tolist())
    assert sup.dtype == np.int64 and sup.shape == (20,)
    assert sup.tolist() == [counts.get(i, 0) for i in range(20)]


def test_item_support_of_sessions() -> None:
    df = frame([(1, "a", 1), (1, "b", 2), (2, "a", 1)])
    s, _ = sessions_from_events(df, ItemMap.from_ids(["a", "b", "c"]))
    assert item_support(s, 3).tolist() == [2, 1, 0]


def test_item_support_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        item_support(np.array([0, 3]), 3)


# ---------------------------------------------------------------------------------------------
# validate_events
# ---------------------------------------------------------------------------------------------


def test_validate_returns_exactly_the_key_columns() -> None:
    df = pd.DataFrame({"x": [0, 0], "Time": [2, 1], "ItemId": [9, 8], "SessionId": [1, 1]})
    out = validate_events(df)
    assert list(out.columns) == KEYS
    assert out["Time"].dtype == np.int64 and out["ItemId"].tolist() == [9, 8]
    assert list(df.columns) == ["x", "Time", "ItemId", "SessionId"]  # input untouched


def test_validate_missing_column_lists_existing() -> None:
    df = pd.DataFrame({"SessionId": [1], "ItemId": [1], "Timestamp": [1]})
    with pytest.raises(
        DataError, match=r"<DataFrame>: missing column 'Time'; the columns found are \['SessionId', 'ItemId', 'Timestamp'\]"
    ):
        validate_events(df)


def test_validate_nan_session_id() -> None:
    df = frame([(1, 1, 1), (None, 1, 2), (np.nan, 2, 3)])
    with pytest.raises(DataError, match=r"my.tsv: column 'SessionId' has 2 missing value.*first at row 1"):
        validate_events(df, source="my.tsv")


def test_validate_nan_item_id() -> None:
    df = frame([(1, 214821371, 1), (1, np.nan, 2)])
    with pytest.raises(DataError, match=r"column 'ItemId' has 1 missing value.*first at row 1"):
        validate_events(df)


def test_validate_empty_string_item_id() -> None:
    df = frame([(1, "a", 1), (1, "b", 2), (2, "", 3)])
    with pytest.raises(DataError, match=r"column 'ItemId' has 1 missing value.*empty.*first at row 2"):
        validate_events(df)


def test_validate_unparsable_time_names_value() -> None:
    df = frame([(1, 1, "2014-04-07 10:00:00"), (1, 2, "yesterday")])
    with pytest.raises(DataError, match=r"column 'Time' has 1 unparsable time.*first 'yesterday' at row 1"):
        validate_events(df)


def test_validate_nan_time() -> None:
    df = frame([(1, 1, 1.0), (1, 2, np.nan)])
    with pytest.raises(DataError, match=r"column 'Time' has 1 missing or non-finite time.*row 1"):
        validate_events(df)


def test_validate_missing_time_string() -> None:
    df = frame([(1, 1, "2014-04-07"), (1, 2, None)])
    with pytest.raises(DataError, match=r"column 'Time' has 1 missing time.*row 1"):
        validate_events(df)


def test_validate_bool_time() -> None:
    with pytest.raises(DataError, match=r"column 'Time' holds booleans"):
        validate_events(frame([(1, 1, True)]))


def test_validate_empty_frame() -> None:
    with pytest.raises(DataError, match=r"<DataFrame>: no events \(0 rows\)"):
        validate_events(pd.DataFrame({k: [] for k in KEYS}))


def test_validate_same_key_twice() -> None:
    with pytest.raises(DataError, match="three different columns"):
        validate_events(frame([(1, 1, 1)]), item_key="SessionId")


def test_validate_not_a_frame() -> None:
    with pytest.raises(DataError, match="expected a pandas DataFrame"):
        validate_events([(1, 1, 1)])  # type: ignore[arg-type]


def test_validate_datetimes_become_unix_seconds() -> None:
    df = frame([(1, 1, "2014-04-07T10:51:09.5Z"), (1, 2, "2014-04-07 10:52:09")])
    out = validate_events(df)
    t0 = (pd.Timestamp("2014-04-07 10:51:09.5", tz="UTC") - pd.Timestamp(0, tz="UTC")).total_seconds()
    assert out["Time"].dtype == np.float64
    assert out["Time"].tolist() == [t0, t0 + 59.5]
    dt = pd.DataFrame({"SessionId": [1], "ItemId": [1], "Time": pd.to_datetime(["1970-01-02"])})
    assert validate_events(dt)["Time"].tolist() == [86400.0]


def test_validate_numeric_strings_are_numeric_times() -> None:
    out = validate_events(frame([(1, 1, "1396437466.94"), (1, 2, "1396437467")]))
    assert out["Time"].tolist() == [1396437466.94, 1396437467.0]


def test_validate_integral_float_ids_become_int() -> None:
    df = frame([(1.0, 214821371.0, 1), (2.0, 5.0, 2)])
    out = validate_events(df)
    assert out["ItemId"].dtype == np.int64 and out["ItemId"].tolist() == [214821371, 5]
    assert out["SessionId"].dtype == np.int64
    # Non-integral floats stay floats.
    assert validate_events(frame([(1, 1.5, 1)]))["ItemId"].dtype == np.float64


def test_validate_duplicate_column() -> None:
    df = pd.DataFrame([[1, 2, 3, 4]], columns=["SessionId", "ItemId", "Time", "ItemId"])
    with pytest.raises(DataError, match=r"column 'ItemId' appears more than once"):
        validate_events(df)


def test_validate_nullable_arrow_and_categorical_columns() -> None:
    df = pd.DataFrame(
        {
            "SessionId": pd.array([7, 7], dtype="Int64"),
            "ItemId": pd.array([214821371, 5], dtype="int64[pyarrow]"),
            "Time": pd.array([1.5, 2.0], dtype="Float64"),
        }
    )
    out = validate_events(df)
    assert [out[k].dtype for k in KEYS] == [np.int64, np.int64, np.float64]
    assert out["ItemId"].tolist() == [214821371, 5]
    cat = validate_events(frame([(1, "a", 1), (1, "b", 2)]).astype({"ItemId": "category"}))
    assert pd.api.types.is_string_dtype(cat["ItemId"].dtype) and cat["ItemId"].tolist() == ["a", "b"]
    with pytest.raises(DataError, match=r"column 'SessionId' has 1 missing value.*row 1"):
        validate_events(df.assign(SessionId=pd.array([7, None], dtype="Int64")))
    with pytest.raises(DataError, match=r"column 'Time' has 1 missing or non-finite.*row 0"):
        validate_events(df.assign(Time=pd.array([None, 2], dtype="int64[pyarrow]")))


def test_sessions_accept_datetime_and_nullable_times() -> None:
    df = pd.DataFrame(
        {"SessionId": [1, 1, 2], "ItemId": [1, 2, 1], "Time": pd.to_datetime(["2020-01-02 00:00", "2020-01-01 00:00", "2020-01-01 12:00"])}
    )
    s, _ = sessions_from_events(df, ItemMap.from_ids([1, 2]))
    assert session_lists(s) == [[1, 0], [0]]
    s2, _ = sessions_from_events(df.assign(Time=pd.array([3, 1, 2], dtype="Int64")), ItemMap.from_ids([1, 2]))
    assert session_lists(s2) == [[1, 0], [0]]


# ---------------------------------------------------------------------------------------------
# read_events / write_events
# ---------------------------------------------------------------------------------------------

INT_FRAME = pd.DataFrame(
    {
        "SessionId": [3, 3, 7, 7],
        "ItemId": [214821371, 214716935, 214821371, 5],
        "Time": [1396437466.94, 1396437470.5, 1396437500.0, 1396437501.0],
    }
)
STR_FRAME = pd.DataFrame(
    {"SessionId": ["u1", "u1", "u2", "u2"], "ItemId": ["a:1", "b 2", "a:1", "c"], "Time": [1, 2, 3, 4]}
)


@pytest.mark.parametrize("name", ["e.tsv", "e.tsv.gz", "e.csv", "e.csv.gz", "e.txt", "e.parquet", "e.parquet.gz"])
@pytest.mark.parametrize("which", ["int", "str"])
def test_round_trip(tmp_path: Path, name: str, which: str) -> None:
    df = INT_FRAME if which == "int" else STR_FRAME
    path = write_events(df, tmp_path / name)
    if name.endswith(".gz"):
        with gzip.open(path, "rb") as f:  # really gzipped
            f.read(1)
    out = read_events(path)
    assert list(out.columns) == KEYS
    for k in KEYS:
        assert out[k].tolist() == df[k].tolist(), k
    if which == "int":
        assert out["ItemId"].dtype == np.int64 and out["SessionId"].dtype == np.int64
    else:
        assert pd.api.types.is_string_dtype(out["ItemId"].dtype)
        assert all(type(x) is str for x in out["ItemId"].tolist())
    assert list(tmp_path.iterdir()) == [path]  # no temp files left behind


def test_read_extra_columns_ignored_and_custom_keys(tmp_path: Path) -> None:
    p = tmp_path / "e.tsv"
    p.write_text("ts\tjunk\tsess\titem\n5\tx\t1\t10\n6\ty\t1\t11\n")
    out = read_events(p, session_key="sess", item_key="item", time_key="ts")
    assert list(out.columns) == ["sess", "item", "ts"]
    assert out.values.tolist() == [[1, 10, 5], [1, 11, 6]]


def test_read_sniffs_separator(tmp_path: Path) -> None:
    p = tmp_path / "comma.tsv"  # says tab, is comma
    p.write_text("SessionId,ItemId,Time\n1,10,5\n")
    assert read_events(p).values.tolist() == [[1, 10, 5]]
    q = tmp_path / "pipe.foo"  # unknown suffix
    q.write_text("SessionId|ItemId|Time\n1|x|5\n")
    assert read_events(q).values.tolist() == [[1, "x", 5]]
    r = tmp_path / "semi.csv.gz"
    with gzip.open(r, "wt") as f:
        f.write("SessionId;ItemId;Time\n2;y;6\n")
    assert read_events(r).values.tolist() == [[2, "y", 6]]


def test_read_sniff_space_and_no_match(tmp_path: Path) -> None:
    p = tmp_path / "space.dat"
    p.write_text("SessionId ItemId Time\n1 10 5\n")
    assert read_events(p).values.tolist() == [[1, 10, 5]]
    q = tmp_path / "bad.foo"
    q.write_text("SessionId,Item,Time\n1,10,5\n")
    with pytest.raises(DataError, match=r"bad.foo: missing column 'ItemId'"):
        read_events(q)


def test_read_explicit_sep(tmp_path: Path) -> None:
    p = tmp_path / "e.csv"
    p.write_text("SessionId;ItemId;Time\n1;10;5\n")
    assert read_events(p, sep=";").values.tolist() == [[1, 10, 5]]
    with pytest.raises(DataError, match=r"e.csv: missing columns 'SessionId', 'ItemId', 'Time'.*separator '\\t'"):
        read_events(p, sep="\t")


def test_read_date_strings(tmp_path: Path) -> None:
    p = tmp_path / "e.csv"
    p.write_text("SessionId,ItemId,Time\n1,10,1970-01-01 00:01:00\n1,11,1970-01-01T00:02:00Z\n")
    assert read_events(p)["Time"].tolist() == [60.0, 120.0]


def test_read_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope.tsv: file not found"):
        read_events(tmp_path / "nope.tsv")


def test_read_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a directory"):
        read_events(tmp_path)


# Bad event files: one clear DataError naming the file and, where there is one, the line.
BAD_FILES = [
    pytest.param("e.tsv", "", r"e.tsv: empty file", id="empty_file"),
    pytest.param("e.tsv", "SessionId\tItemId\tTime\n", r"e.tsv: no events \(0 rows\)", id="header_only"),
    pytest.param(
        "e.tsv",
        "SessionId\tItem\tTime\n1\t2\t3\n",
        r"e.tsv: missing column 'ItemId'; the columns found are \['SessionId', 'Item', 'Time'\] \(separator '\\t'\); "
        r"name the columns with -sk/-ik/-tk \(in Python: session_key=, item_key=, time_key=\)$",
        id="missing_column_lists_header",
    ),
    pytest.param(
        "e.tsv",
        "SessionID\tItemId\tTime\n1\t2\t3\n",
        r"missing column 'SessionId'; the columns found are \['SessionID', 'ItemId', 'Time'\] "
        r"\(differing only in case: 'SessionID' for 'SessionId'\)",
        id="missing_column_differing_in_case",
    ),
    pytest.param(
        "e.tsv",
        "SessionId\tItemId\tTime\n1\t214821371\t1\n1\t\t2\n2\t\t3\n",
        r"e.tsv: column 'ItemId' has 2 missing value.*first at line 3",
        id="nan_item_id_gives_line",
    ),
    pytest.param(
        "e.csv", 'SessionId,ItemId,Time\n"",a,1\n', r"e.csv: column 'SessionId' has 1 missing.*line 2", id="empty_quoted_session_id"
    ),
    pytest.param(
        "e.tsv",
        "SessionId\tItemId\tTime\n1\t1\t2014-04-07\n1\t2\tnot-a-date\n",
        r"e.tsv: column 'Time' has 1 unparsable.*'not-a-date' at line 3",
        id="unparsable_time_gives_value_and_line",
    ),
    pytest.param("e.tsv.gz", "SessionId\tItemId\tTime\n1\t1\t1\n", r"e.tsv.gz: cannot read the file", id="not_gzipped"),
    pytest.param(
        "e.tsv",
        "SessionId\tItemId\tTime\n1\t1\t1\n1\t2\n",
        r"e.tsv: column 'Time' has 1 missing or non-finite time.*line 3",
        id="short_row",
    ),
    pytest.param("e.csv", 'SessionId,ItemId,Time\n1,"abc,1\n2,x,3\n', r"e.csv: cannot parse the file", id="unterminated_quote"),
]


@pytest.mark.parametrize("name,text,message", BAD_FILES)
def test_read_bad_file_names_the_problem(tmp_path: Path, name: str, text: str, message: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(DataError, match=message):
        read_events(p)







def test_read_parquet_null_item_id(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "e.parquet"
    pq.write_table(pa.table({"SessionId": [1, 1, 2], "ItemId": pa.array([214821371, None, 3], pa.int64()), "Time": [1, 2, 3]}), p)
    with pytest.raises(DataError, match=r"e.parquet: column 'ItemId' has 1 missing value.*row 1"):
        read_events(p)


def test_read_parquet_missing_column(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    p = tmp_path / "e.parquet"
    pd.DataFrame({"SessionId": [1], "ItemId": [2]}).to_parquet(p)
    with pytest.raises(DataError, match=r"e.parquet: missing column 'Time'.*'SessionId', 'ItemId'"):
        read_events(p)


def test_read_parquet_timestamps(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    p = tmp_path / "e.parquet"
    pd.DataFrame({"SessionId": [1], "ItemId": [2], "Time": pd.to_datetime(["1970-01-01 00:00:10"])}).to_parquet(p)
    assert read_events(p)["Time"].tolist() == [10.0]


def test_read_corrupt_parquet(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    p = tmp_path / "e.parquet"
    p.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"e.parquet: cannot read the Parquet file"):
        read_events(p)


def test_read_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "e.parquet"
    p.write_bytes(b"whatever")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # makes the import fail
    with pytest.raises(Gru4RecError, match=r"e.parquet: .*pip install"):
        read_events(p)





def test_unknown_item_message_shows_plain_value() -> None:
    with pytest.raises(DataError, match=r"first 99 at row 0"):
        sessions_from_events(frame([(1, 99, 1)]), ItemMap.from_ids([1]))


def test_write_refuses_to_overwrite(tmp_path: Path) -> None:
    p = tmp_path / "e.tsv"
    p.write_text("precious")
    with pytest.raises(DataError, match=r"e.tsv already exists; pass force=True to replace it"):
        write_events(INT_FRAME, p)
    assert p.read_text() == "precious"
    write_events(INT_FRAME, p, force=True)
    assert read_events(p)["ItemId"].tolist() == INT_FRAME["ItemId"].tolist()
    assert list(tmp_path.iterdir()) == [p]


def test_real_rsc15_sample() -> None:
    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "rsc15_100k"
    if not data.is_dir():
        pytest.skip(f"real data not found at {data}")
    df = read_events(data / "train_full.tsv")
    assert len(df) == 70_278
    assert df["ItemId"].dtype == np.int64 and df["SessionId"].dtype == np.int64
    m = ItemMap.from_ids(df["ItemId"])
    assert len(m) == 2_933
    s, _ = sessions_from_events(df, m)
    assert s.n_sessions == 17_794 and s.n_events == 70_278
    assert item_support(s, len(m)).sum() == 70_278
    first_times = df.groupby("SessionId")["Time"].min().loc[s.session_ids].to_numpy()
    assert np.all(np.diff(first_times) >= 0)
