"""The item attribute table (gru4rec.items.table) and its encoding aligned to a model's items
(gru4rec.items.attributes): the reader's inference and errors, the codes / offsets / numbers
against a row-by-row plain-Python reference, the round trip through a model file."""
from __future__ import annotations

import gzip
import math
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gru4rec.data import ItemMap
from gru4rec.errors import DataError
from gru4rec.items import (
    UNKNOWN,
    HighCardinalityWarning,
    IntegerCodesWarning,
    ItemAttributes,
    ItemTable,
    item_table_from_frame,
    read_item_table,
)

# ---------------------------------------------------------------------- a reference


def reference(rows: dict[Any, dict[str, Any]], kinds: dict[str, str], train_ids: list[Any], min_count: int
              ) -> tuple[list[Any], dict[str, list[list[int]]], dict[str, list[float]]]:
    """The encoding written row by row from the docs: (items in order, codes per item per
    categorical column, standardised numbers per item per numeric column)."""
    cold = [i for i in rows if i not in train_ids]
    items = list(train_ids) + cold
    codes: dict[str, list[list[int]]] = {}
    numbers: dict[str, list[float]] = {}
    for col, kind in kinds.items():
        if kind == "numeric":
            vals = [rows[i][col] for i in train_ids if i in rows and not math.isnan(rows[i][col])]
            mean = sum(vals) / len(vals) if vals else 0.0
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)) if vals else 1.0
            std = std or 1.0
            numbers[col] = [0.0 if i not in rows or math.isnan(rows[i][col]) else (rows[i][col] - mean) / std
                            for i in items]
            continue

        def values(i: Any, col: str = col, kind: str = kind) -> list[Any]:
            v = rows[i][col]
            return [p.strip() for p in v.split("|")] if kind == "multi" else [v]

        counter: Counter[Any] = Counter()
        first: dict[Any, int] = {}
        for i in rows:  # table order, training items only
            if i in train_ids:
                for v in values(i):
                    counter[v] += 1
                    first.setdefault(v, len(first))
        vocab = sorted((v for v in counter if counter[v] >= min_count), key=lambda v: (-counter[v], first[v]))
        code = {v: n + 1 for n, v in enumerate(vocab)}
        codes[col] = [[code.get(v, 0) for v in values(i)] if i in rows else [0] for i in items]
    return items, codes, numbers


def check_against_reference(attrs: ItemAttributes, rows: dict[Any, dict[str, Any]], kinds: dict[str, str],
                            train_ids: list[Any], min_count: int) -> None:
    items, codes, numbers = reference(rows, kinds, train_ids, min_count)
    assert attrs.item_map.to_list() == items
    assert attrs.n_warm == len(train_ids)
    assert attrs.has_row.tolist() == [i in rows for i in items]
    for c, enc in enumerate(attrs.encoding.categorical):
        got = [attrs.codes[c][attrs.offsets[c][i]:attrs.offsets[c][i + 1]].tolist() for i in range(len(items))]
        assert got == codes[enc.name], enc.name
        assert attrs.codes[c].dtype == np.int64 and attrs.offsets[c].dtype == np.int64
    assert attrs.numeric.dtype == np.float32
    for j, enc in enumerate(attrs.encoding.numeric):
        np.testing.assert_allclose(attrs.numeric[:, j], numbers[enc.name], rtol=1e-6, atol=1e-6)


def random_rows(rng: np.random.Generator, n: int) -> dict[Any, dict[str, Any]]:
    ids = rng.choice(10_000, size=n, replace=False).tolist()
    tags = ["red", "green", "blue", "big", "small", "x"]
    return {
        i: {
            "category": int(rng.integers(1, 8)),
            "brand": str(rng.choice(["acme", "zeta", "omega", "solo"], p=[0.5, 0.3, 0.15, 0.05])),
            "tags": " | ".join(rng.choice(tags, size=int(rng.integers(1, 4)), replace=False)),
            "price": float(np.nan if rng.random() < 0.2 else round(rng.lognormal(3, 1), 2)),
        }
        for i in ids
    }


def frame_of(rows: dict[Any, dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([{"ItemId": i, **r} for i, r in rows.items()])


KINDS = {"category": "categorical", "brand": "categorical", "tags": "multi", "price": "numeric"}
#: Integer category ids read as numbers unless told: the override every such table needs.
TYPES = {"category": "categorical"}


# ---------------------------------------------------------------------- encoding


@pytest.mark.parametrize("min_count", [1, 3])
def test_encoding_matches_a_row_by_row_reference(min_count: int) -> None:
    rng = np.random.default_rng(min_count)
    rows = random_rows(rng, 60)
    table = item_table_from_frame(frame_of(rows), types=TYPES)
    assert table.kinds == KINDS
    assert item_table_from_frame(frame_of(rows)).kinds["category"] == "numeric"  # inferred from the dtype
    ids = list(rows)
    # Training items: 40 of the table's (in another order) and 5 ids without a row; the other 20 are cold.
    train_ids = [ids[i] for i in rng.permutation(40)] + [20_000 + k for k in range(5)]
    attrs = ItemAttributes.build(table, ItemMap.from_ids(train_ids), min_count=min_count)
    check_against_reference(attrs, rows, KINDS, train_ids, min_count)
    assert attrs.counts() == {"known": 40, "unknown": 5, "cold": 20}
    if min_count == 3:  # a rare value is unknown: the reference and the code agree on some 0s
        assert (attrs.codes[0] == UNKNOWN).sum() > 5


def test_hand_computed_example() -> None:
    """Three training items (one without a row), two cold ones: every number by hand."""
    df = pd.DataFrame({"ItemId": [10, 11, 12, 13, 14], "cat": ["a", "b", "a", "c", "a"],
                       "tags": ["x|y", "y", "z| x", "x", "y"], "price": [1.0, np.nan, 3.0, 4.0, 10.0]})
    attrs = ItemAttributes.build(item_table_from_frame(df), ItemMap.from_ids([11, 10, 99, 12]))
    assert attrs.item_map.to_list() == [11, 10, 99, 12, 13, 14]
    # cat: a twice, b once among 11, 10, 12 -> a=1, b=2; c (cold only) and 99 (no row) are 0.
    assert attrs.codes[0].tolist() == [2, 1, 0, 1, 0, 1]
    # tags: x and y twice (x first in the table), z once -> x=1, y=2, z=3.
    assert attrs.codes[1].tolist() == [2, 1, 2, 0, 3, 1, 1, 2]
    assert attrs.offsets[1].tolist() == [0, 1, 3, 4, 6, 7, 8]
    # price: training values 1 and 3 (11 has none): mean 2, std 1.
    assert attrs.numeric[:, 0].tolist() == [0.0, -1.0, 0.0, 1.0, 2.0, 8.0]
    assert attrs.encoding.numeric[0].mean == 2.0 and attrs.encoding.numeric[0].std == 1.0
    assert attrs.encoding.categorical[0].n_codes == 3


def test_constant_numeric_and_no_training_value_divide_by_one() -> None:
    df = pd.DataFrame({"ItemId": [1, 2, 3], "w": [5.0, 5.0, 7.0], "v": [np.nan, np.nan, 2.0]})
    attrs = ItemAttributes.build(item_table_from_frame(df), ItemMap.from_ids([1, 2]))
    assert [(e.mean, e.std) for e in attrs.encoding.numeric] == [(5.0, 1.0), (0.0, 1.0)]
    assert attrs.numeric.tolist() == [[0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]


def test_add_items_keeps_the_encoding() -> None:
    rng = np.random.default_rng(5)
    rows = random_rows(rng, 40)
    ids = list(rows)
    train_ids = ids[:30]
    attrs = ItemAttributes.build(item_table_from_frame(frame_of(rows), types=TYPES), ItemMap.from_ids(train_ids))
    new_rows = random_rows(np.random.default_rng(6), 10)
    new_rows = {i + 10_000: r for i, r in new_rows.items()}
    new_rows[ids[0]] = rows[ids[1]]  # a known item: keeps its row
    more = attrs.add_items(item_table_from_frame(frame_of(new_rows), types=TYPES))
    assert more.item_map.to_list() == attrs.item_map.to_list() + [i for i in new_rows if i != ids[0]]
    assert more.encoding is attrs.encoding and more.n_warm == 30
    for c in range(len(attrs.codes)):
        n = len(attrs.codes[c])
        assert more.codes[c][:n].tolist() == attrs.codes[c].tolist()
        assert more.offsets[c][: attrs.n_items + 1].tolist() == attrs.offsets[c].tolist()
    # The new items, encoded by the old vocabularies: the reference over the old training items.
    _, codes, numbers = reference({**rows, **{i: r for i, r in new_rows.items() if i != ids[0]}}, KINDS, train_ids, 1)
    for c, enc in enumerate(more.encoding.categorical):
        got = [more.codes[c][more.offsets[c][i]:more.offsets[c][i + 1]].tolist() for i in range(more.n_items)]
        assert got == codes[enc.name]
    np.testing.assert_allclose(more.numeric[:, 0], numbers["price"], rtol=1e-6, atol=1e-6)


def test_round_trip_through_a_model_file(tmp_path: Path) -> None:
    from gru4rec.formats.checkpoint import load_file, save_file

    rows = random_rows(np.random.default_rng(8), 30)
    rows = {f"s{i}": r for i, r in rows.items()}  # string ids
    train = ItemMap.from_ids(list(rows)[:20] + ["gone"])
    attrs = ItemAttributes.build(item_table_from_frame(frame_of(rows), types=TYPES), train)
    tensors, meta = attrs.to_tensors()
    assert sorted(tensors) == ["items.cat0.codes", "items.cat1.codes", "items.cat2.codes", "items.cat2.offsets",
                               "items.has_row", "items.numeric"]
    save_file(tmp_path / "m.safetensors", tensors, {"items": meta})
    t2, m2 = load_file(tmp_path / "m.safetensors")
    back = ItemAttributes.from_tensors(t2, m2["items"], train)
    assert back.item_map == attrs.item_map and back.n_warm == attrs.n_warm
    assert back.encoding.to_json() == attrs.encoding.to_json()
    for a, b in zip(attrs.codes + attrs.offsets, back.codes + back.offsets, strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(back.numeric, attrs.numeric) and np.array_equal(back.has_row, attrs.has_row)
    # The restored encoding still encodes: vocabularies of ints stay ints after JSON.
    first = rows[next(iter(rows))]["category"]
    assert back.encoding.categorical[0].codes_of(np.array([first])).tolist() == attrs.encoding.categorical[0].codes_of(
        np.array([first])).tolist() != [UNKNOWN]
    with pytest.raises(DataError, match="made for 21 items, the item map has 20"):
        ItemAttributes.from_tensors(t2, m2["items"], ItemMap.from_ids(list(rows)[:20]))
    del t2["items.numeric"]
    with pytest.raises(DataError, match="'items.numeric' is missing"):
        ItemAttributes.from_tensors(t2, m2["items"], train)


def test_string_table_ids_against_integer_items_is_one_error() -> None:
    table = item_table_from_frame(pd.DataFrame({"ItemId": ["a", "b"], "c": ["x", "y"]}), source="t.tsv")
    with pytest.raises(DataError, match="t.tsv: column 'ItemId' holds string ids but the training items are integer"):
        ItemAttributes.build(table, ItemMap.from_ids([1, 2]))


# ---------------------------------------------------------------------- the reader


def test_reader_sniffs_the_separator_reads_gzip_and_infers_kinds(tmp_path: Path) -> None:
    text = "item;category;brand;tags;price\n7;3;acme;a|b;1.5\n8;3;zeta;b;\n9;4;acme;c | a;2.5\n"
    path = tmp_path / "items.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    table = read_item_table(path, item_key="item")
    assert isinstance(table, ItemTable) and table.ids.tolist() == [7, 8, 9] and table.ids.dtype == np.int64
    assert table.kinds == {"category": "numeric", "brand": "categorical", "tags": "multi", "price": "numeric"}
    tags = table.columns[2]
    assert tags.values.tolist() == ["a", "b", "b", "c", "a"] and tags.offsets is not None
    assert tags.offsets.tolist() == [0, 2, 3, 5]
    assert np.isnan(table.columns[3].values[1])
    over = read_item_table(path, item_key="item", types={"category": "categorical", "tags": "categorical"})
    assert over.kinds["category"] == "categorical" and over.columns[0].values.tolist() == [3, 3, 4]
    assert over.columns[2].values.tolist() == ["a|b", "b", "c | a"]


def test_parquet_reads_like_text(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    df = pd.DataFrame({"ItemId": [5, 6], "brand": ["x", "y|z"], "price": [1.0, 2.0]})
    df.to_parquet(tmp_path / "t.parquet")
    table = read_item_table(tmp_path / "t.parquet")
    assert table.kinds == {"brand": "multi", "price": "numeric"} and table.ids.tolist() == [5, 6]


def write(tmp_path: Path, text: str, name: str = "items.tsv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "types", "message"),
    [
        ("", None, r"items.tsv: empty file"),
        ("Id\tbrand\n1\tx\n", None, r"items.tsv: missing column 'ItemId'; the columns found are \['Id', 'brand'\]"),
        ("ItemId\tbrand\n", None, r"items.tsv: no items \(0 rows\)"),
        ("ItemId\tbrand\n1\tx\n2\ty\n1\tz\n", None,
         r"items.tsv: column 'ItemId': duplicate item id 1 at line 2 and line 4"),
        ("ItemId\tbrand\n1\tx\n\ty\n", None, r"column 'ItemId' has 1 missing value\(s\) \(NaN/empty\), first at line 3"),
        ("ItemId\tbrand\tp\n1\tx\t1\n2\t\t2\n", None,
         r"items.tsv: column 'brand' is categorical but has 1 missing \(NaN/empty\) value\(s\), first at line 3"),
        ("ItemId\tp\n1\t1.5\n2\t2.5\n3\tn/a x\n", None,
         r"items.tsv: column 'p' mixes types: 2 of 3 values are numbers, but 'n/a x' at line 4 is not"),
        ("ItemId\tp\n1\t1.5\n2\tcheap\n", {"p": "numeric"},
         r"items.tsv: column 'p' is numeric but has 1 value\(s\) that are not numbers, first 'cheap' at line 3"),
        ("ItemId\ttags\n1\ta|b\n2\ta||c\n", None, r"items.tsv: column 'tags' has an empty value between '\|' at line 3"),
        ("ItemId\ttags\n1\ta\n", {"tag": "multi"}, r"items.tsv: types names column\(s\) \['tag'\]"),
        ("ItemId\ttags\n1\ta\n", {"tags": "text"}, r"items.tsv: column 'tags': unknown kind 'text'"),
        ("ItemId\tp\n1\t1.5\n2\tinf\n", None, r"items.tsv: column 'p' has an infinite value at line 3"),
    ],
)
def test_every_bad_table_is_one_error_naming_file_and_column(tmp_path: Path, text: str, types: dict[str, str] | None,
                                                           message: str) -> None:
    with pytest.raises(DataError, match=message):
        read_item_table(write(tmp_path, text), types=types)


def test_a_missing_file_and_a_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.tsv: file not found"):
        read_item_table(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match="is a directory"):
        read_item_table(tmp_path)


def test_a_frame_column_of_numbers_and_strings_is_mixed() -> None:
    df = pd.DataFrame({"ItemId": [1, 2, 3], "size": [42, "M", "L"]})
    with pytest.raises(DataError, match=r"<DataFrame>: column 'size' mixes types \(mixed-integer"):
        item_table_from_frame(df)


def test_a_frame_column_of_dates_is_refused() -> None:
    df = pd.DataFrame({"ItemId": [1, 2], "added": pd.to_datetime(["2026-01-01", "2026-02-01"])})
    with pytest.raises(DataError, match="<DataFrame>: column 'added' holds dates"):
        item_table_from_frame(df)


def test_mostly_text_with_some_numbers_is_categorical() -> None:
    table = item_table_from_frame(pd.DataFrame({"ItemId": [1, 2, 3], "size": ["S", "M", "42"]}))
    assert table.kinds == {"size": "categorical"}


def test_high_cardinality_warns_naming_the_column(tmp_path: Path) -> None:
    n = 40
    text = "ItemId\tsku\tcat\n" + "".join(f"{i}\tsku{i}\tc{i % 3}\n" for i in range(n))
    path = write(tmp_path, text)
    with pytest.warns(HighCardinalityWarning, match=r"items.tsv: column 'sku': 40 distinct values in 40 rows"):
        read_item_table(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 'cat' (3 values) and a small table warn about nothing
        read_item_table(write(tmp_path, "ItemId\tsku\n1\ta\n2\tb\n", "small.tsv"))


def test_integer_codes_read_as_numbers_warn_naming_the_column(tmp_path: Path) -> None:
    """A column of integers with few distinct values (a category id, as DIGINETICA's categoryId or
    the intents-attributes generator's category) is inferred numeric, with a warning that names the
    column and the way to say it is categorical; real quantities, a given kind and small tables
    warn about nothing."""
    n = 100
    text = "ItemId\tcategoryId\tprice\tstock\n" + "".join(f"{i}\t{i % 4}\t{1.5 + i}\t{i}\n" for i in range(n))
    path = write(tmp_path, text)
    with pytest.warns(IntegerCodesWarning) as record:
        table = read_item_table(path)
    assert table.kinds == {"categoryId": "numeric", "price": "numeric", "stock": "numeric"}
    assert len(record) == 1  # not price (fractions), not stock (100 distinct integers)
    message = str(record[0].message)
    assert "column 'categoryId'" in message and "4 distinct ones in 100 rows" in message
    assert "--item-types categoryId=categorical" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_item_table(path, types={"categoryId": "categorical"}).kinds["categoryId"] == "categorical"
        read_item_table(write(tmp_path, "ItemId\tcat\n1\t1\n2\t1\n", "small.tsv"))


def test_codes_match_values_read_as_text_or_as_numbers() -> None:
    """A vocabulary of integer codes and values read as text (one non-number in the column), or
    the reverse: matched by their text, so a code is never silently the unknown value."""
    from gru4rec.items.attributes import CategoricalEncoding

    numbers = CategoricalEncoding("c", False, pd.Index([5, 28, 3]), 1)
    assert numbers.codes_of(np.array(["28", "shoes", "5"], dtype=object)).tolist() == [2, 0, 1]
    assert numbers.codes_of(np.array([28, 7])).tolist() == [2, 0]
    text = CategoricalEncoding("c", False, pd.Index(["a", "28"]), 1)
    assert text.codes_of(np.array([28, 1])).tolist() == [2, 0]
    assert text.codes_of(np.array(["a", "x"], dtype=object)).tolist() == [1, 0]
