"""The item attribute table as read: one row per item, an id column and attribute columns.

A table is TSV/CSV/Parquet (optionally gzipped), read with the event readers' conventions
(:mod:`gru4rec.data.events`: the format from the suffix, the separator sniffed from the header,
ids kept as read — int64 or strings —, errors naming the file, the column and the 1-based line).
Every column but the id column is an attribute of one of three kinds:

* ``categorical``: one value per item (``3``, ``shoes``);
* ``multi``: several values per item, written ``a|b|c`` (spaces around ``|`` ignored);
* ``numeric``: a number per item; an empty cell is a missing value.

Kinds are inferred — a numeric column is ``numeric``, a string column ``categorical``, a
string column with a ``|`` in any cell ``multi`` — and overridden per column with ``types``.
Categorical values are kept as read (ints stay ints). Every column is held flat: a categorical
column's values of row r are ``values[offsets[r]:offsets[r + 1]]`` (one per row for
``categorical``), a numeric column is float64 with NaN for missing. Nothing here loops over rows.
"""
from __future__ import annotations

import gzip
import io
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.data.events import (
    PARQUET_HINT,
    PARQUET_SUFFIXES,
    line_or_row,
    missing_columns_error,
    show_value,
    table_file,
    text_header,
    validate_ids,
)
from gru4rec.errors import DataError, Gru4RecError

__all__ = ["KINDS", "MULTI_SEP", "HighCardinalityWarning", "IntegerCodesWarning", "ItemTable", "TableColumn",
           "item_table_from_frame", "read_item_table"]

log = logging.getLogger(__name__)

#: The attribute kinds.
KINDS = ("categorical", "multi", "numeric")
#: The separator of a multi-valued cell.
MULTI_SEP = "|"
#: A categorical column with more distinct values than this share of its rows is warned about
#: (an id-like column: its vocabulary would be as large as the item table and learn nothing shared).
MAX_DISTINCT_SHARE = 0.5
_MIN_ROWS_FOR_CARDINALITY = 20  # a tiny table always looks high-cardinality


class HighCardinalityWarning(UserWarning):
    """A categorical attribute with nearly one value per item (the message names file and column)."""


class IntegerCodesWarning(UserWarning):
    """A column inferred as numeric whose values look like codes — integers, few distinct ones —
    such as a category id (DIGINETICA's ``categoryId``): as a number it would give an item the
    category's id times a learnt vector, which means nothing (the message names file and column)."""


#: An integer column inferred as numeric with at most this share of distinct values (and at
#: least 20 rows) is warned about (:class:`IntegerCodesWarning`).
MAX_CODE_SHARE = 0.05


@dataclass(frozen=True, eq=False)
class TableColumn:
    """One attribute column, flat. ``kind`` is one of :data:`KINDS`. Categorical kinds: row r's
    values are ``values[offsets[r]:offsets[r + 1]]`` (``offsets`` int64 [rows + 1]); numeric:
    ``values`` float64 [rows], NaN where missing, ``offsets`` None."""

    name: str
    kind: str
    values: np.ndarray
    offsets: np.ndarray | None


@dataclass(frozen=True, eq=False)
class ItemTable:
    """An item attribute table, read and checked: ``ids`` (unique, int64 or strings) and the
    attribute columns in file order; ``source`` names it in messages."""

    item_key: str
    ids: pd.Index
    columns: tuple[TableColumn, ...]
    source: str

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def kinds(self) -> dict[str, str]:
        """``{column: kind}`` as inferred or given."""
        return {c.name: c.kind for c in self.columns}


def read_item_table(
    path: str | os.PathLike[str],
    *,
    item_key: str = "ItemId",
    types: Mapping[str, str] | None = None,
    sep: str | None = None,
    required: Sequence[str] = (),
) -> ItemTable:
    """Read an item attribute table (TSV/CSV/Parquet, optionally ``.gz``; the separator sniffed
    from the header among TAB, comma, semicolon, pipe and space unless ``sep``) and check it
    (see :func:`item_table_from_frame`). Every column other than ``item_key`` is an attribute.
    ``required``: attribute columns it must have (a model's, whose kinds ``types`` then gives).

    Raises DataError naming the file (and the column, line) for: a missing or empty file, no
    ``item_key`` column, a missing or duplicate id, and each bad attribute column."""
    p, suffix, gz = table_file(path, "an item attribute table")
    if suffix in PARQUET_SUFFIXES:
        return _from_frame(_read_parquet(p, gz), item_key, types, str(p), 0, required)
    sep_used, fields = text_header(p, suffix, gz, [item_key], sep, "items")
    if item_key not in fields:
        raise missing_columns_error(str(p), [item_key], fields, f" (separator {sep_used!r}); name the id column with item_key")
    try:
        # Whole columns at once (low_memory=False): chunked inference can mix ints and strings.
        df = pd.read_csv(p, sep=sep_used, compression="gzip" if gz else None, encoding="utf-8-sig", low_memory=False)
    except (pd.errors.ParserError, ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{p}: cannot parse the file ({type(e).__name__}: {e})") from e
    return _from_frame(df, item_key, types, str(p), 2, required)


def _read_parquet(path: Path, gz: bool) -> pd.DataFrame:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # optional dependency
        raise Gru4RecError(f"{path}: {PARQUET_HINT}") from e
    try:
        src: Any = path
        if gz:  # Parquet needs random access: decompress into memory first
            with gzip.open(path, "rb") as fh:
                src = io.BytesIO(fh.read())
        return pq.read_table(src).to_pandas()
    except Exception as e:  # pyarrow raises a zoo of types for corrupt files
        raise DataError(f"{path}: cannot read the Parquet file ({type(e).__name__}: {e})") from e


def item_table_from_frame(
    df: pd.DataFrame, *, item_key: str = "ItemId", types: Mapping[str, str] | None = None, source: str = "<DataFrame>"
) -> ItemTable:
    """Check an item attribute frame and return it as an :class:`ItemTable` (rows named by
    0-based position in messages).

    Kinds: numeric dtypes are ``numeric``, anything else ``categorical``, or ``multi`` when a
    cell holds ``|``; ``types={column: kind}`` overrides. DataError naming ``source`` and the
    column for: no rows, no ``item_key`` column, a missing or duplicate id, an unknown column or
    kind in ``types``, a missing/empty value in a categorical column (or an empty part of a
    ``multi`` cell), a column of mixed types (Python numbers and strings; or mostly numbers with
    some text, e.g. ``12.5`` and ``n/a``: say ``categorical`` or fix the file), a non-number in a
    column given as ``numeric``, an infinite number. A categorical column with more distinct
    values than half its rows (and at least 20 rows) gives a :class:`HighCardinalityWarning`."""
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"{source}: expected a pandas DataFrame, got {type(df).__name__}")
    return _from_frame(df, item_key, types, source, 0)


def _from_frame(df: pd.DataFrame, item_key: str, types: Mapping[str, str] | None, source: str,
                first_line: int, required: Sequence[str] = ()) -> ItemTable:
    if item_key not in df.columns:
        raise missing_columns_error(source, [item_key], df.columns, "; name the id column with item_key")
    duplicated = [str(c) for c in df.columns[df.columns.duplicated()]]
    if duplicated:
        raise DataError(f"{source}: column {duplicated[0]!r} appears more than once")
    if len(df) == 0:
        raise DataError(f"{source}: no items (0 rows)")
    attributes = [str(c) for c in df.columns if c != item_key]
    missing = [name for name in required if name not in attributes]
    if missing:
        raise DataError(f"{source}: missing the required attribute column(s) {missing} (required: {list(required)}; "
                        f"the table's: {attributes})")
    types = dict(types or {})
    unknown = sorted(set(types) - {str(c) for c in df.columns if c != item_key})
    if unknown:
        raise DataError(f"{source}: types names column(s) {unknown} that the table does not have "
                        f"(attribute columns: {[str(c) for c in df.columns if c != item_key]})")
    bad_kind = {c: k for c, k in types.items() if k not in KINDS}
    if bad_kind:
        name, kind = next(iter(bad_kind.items()))
        raise DataError(f"{source}: column {name!r}: unknown kind {kind!r} in types; expected one of {list(KINDS)}")
    ids = validate_ids(df[item_key], item_key, source, first_line)
    dup = ids.duplicated(keep=False).to_numpy()
    if dup.any():
        rows = np.flatnonzero(dup)
        first = ids.iloc[rows[0]]
        again = rows[1:][(ids.iloc[rows[1:]] == first).to_numpy()][0]
        raise DataError(f"{source}: column {item_key!r}: duplicate item id {show_value(first)} at "
                        f"{line_or_row(int(rows[0]), first_line)} and {line_or_row(int(again), first_line)} "
                        f"({int(ids.duplicated().sum())} duplicate row(s) in all)")
    columns = tuple(_column(df[name], str(name), types.get(str(name)), source, first_line)
                    for name in df.columns if name != item_key)
    return ItemTable(item_key, pd.Index(ids.to_numpy()), columns, source)


def _column(s: pd.Series, name: str, kind: str | None, source: str, first_line: int) -> TableColumn:
    where = f"{source}: column {name!r}"
    if isinstance(s.dtype, pd.CategoricalDtype):
        s = s.astype(s.dtype.categories.dtype)
    if pd.api.types.is_datetime64_any_dtype(s.dtype) or isinstance(s.dtype, pd.PeriodDtype):
        raise DataError(f"{where} holds dates; give them as numbers (e.g. unix seconds) or as text categories")
    numeric_dtype = pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype)
    if not numeric_dtype:
        inferred = pd.api.types.infer_dtype(s, skipna=True)
        if inferred in ("mixed", "mixed-integer", "mixed-integer-float"):
            raise DataError(f"{where} mixes types ({inferred}: numbers and strings); make it one type")
    if kind is None:
        if numeric_dtype:
            kind = "numeric"
            _warn_integer_codes(s, name, where)
        else:
            _refuse_mostly_numeric(s, name, where, first_line)
            text = s.astype("string")
            kind = "multi" if bool(text.str.contains(MULTI_SEP, regex=False).fillna(False).any()) else "categorical"
    if kind == "numeric":
        return TableColumn(name, kind, _numbers(s, where, first_line), None)
    return _categories(s, name, kind, where, first_line)


def _warn_integer_codes(s: pd.Series, name: str, where: str) -> None:
    """An :class:`IntegerCodesWarning` for an inferred numeric column of integers with few distinct values."""
    v = s.dropna()
    n = len(v)
    if n < _MIN_ROWS_FOR_CARDINALITY:
        return
    values = v.to_numpy()
    if not pd.api.types.is_integer_dtype(values.dtype) and not bool(np.all(np.mod(values, 1) == 0)):
        return
    n_distinct = len(pd.unique(values))
    if n_distinct <= MAX_CODE_SHARE * n:
        warnings.warn(IntegerCodesWarning(
            f"{where}: read as numeric, but its values are integers with only {n_distinct} distinct ones in {n} rows — "
            f"codes (a category id?) more likely than quantities; if they name categories, give it as 'categorical' "
            f"(--item-types {name}=categorical, or types={{{name!r}: 'categorical'}})"), stacklevel=4)


def _refuse_mostly_numeric(s: pd.Series, name: str, where: str, first_line: int) -> None:
    """A text column whose values are mostly numbers is a numeric column with junk in it: one
    clear error rather than a vocabulary of prices."""
    present = s.notna().to_numpy()
    num = pd.to_numeric(s, errors="coerce").notna().to_numpy()
    n_num, n = int(num.sum()), int(present.sum())
    if 0 < n_num < n and 2 * n_num > n:
        first = int(np.argmax(present & ~num))
        raise DataError(f"{where} mixes types: {n_num} of {n} values are numbers, but "
                        f"{show_value(s.iloc[first])} at {line_or_row(first, first_line)} is not; fix the file, "
                        f"or say it is categorical: --item-types {name}=categorical (Python: types={{{name!r}: 'categorical'}})")


def _numbers(s: pd.Series, where: str, first_line: int) -> np.ndarray:
    if pd.api.types.is_bool_dtype(s.dtype):
        raise DataError(f"{where} holds booleans; give it as 'categorical'")
    v = pd.to_numeric(s, errors="coerce")
    bad = (v.isna() & s.notna()).to_numpy()
    if bad.any():
        first = int(np.argmax(bad))
        raise DataError(f"{where} is numeric but has {int(bad.sum())} value(s) that are not numbers, first "
                        f"{show_value(s.iloc[first])} at {line_or_row(first, first_line)}")
    out = v.to_numpy(dtype=np.float64, na_value=np.nan)
    inf = np.isinf(out)
    if inf.any():
        first = int(np.argmax(inf))
        raise DataError(f"{where} has an infinite value at {line_or_row(first, first_line)}")
    return out


def _categories(s: pd.Series, name: str, kind: str, where: str, first_line: int) -> TableColumn:
    missing = s.isna().to_numpy()
    if pd.api.types.is_string_dtype(s.dtype) or s.dtype == object:
        missing = missing | (s.astype("string") == "").to_numpy(dtype=bool, na_value=False)
    if missing.any():
        first = int(np.argmax(missing))
        raise DataError(f"{where} is {kind} but has {int(missing.sum())} missing (NaN/empty) value(s), first at "
                        f"{line_or_row(first, first_line)}; a categorical value cannot be missing")
    n = len(s)
    if kind == "categorical":
        values = s.to_numpy()
        if pd.api.types.is_float_dtype(s.dtype) and np.all(values == np.floor(values)):
            values = values.astype(np.int64)  # 3.0 and 3 are one category
        offsets = np.arange(n + 1, dtype=np.int64)
    else:
        parts = s.astype("string").str.split(MULTI_SEP, regex=False)
        lengths = parts.str.len().to_numpy(dtype=np.int64)
        flat = parts.explode().str.strip()
        empty = (flat == "").to_numpy(dtype=bool)
        if empty.any():
            row = int(np.searchsorted(np.cumsum(lengths), int(np.argmax(empty)), side="right"))
            raise DataError(f"{where} has an empty value between '{MULTI_SEP}' at {line_or_row(row, first_line)}")
        values = flat.to_numpy(dtype=object)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
    n_distinct = len(pd.unique(values))
    if n >= _MIN_ROWS_FOR_CARDINALITY and n_distinct > MAX_DISTINCT_SHARE * n:
        warnings.warn(HighCardinalityWarning(
            f"{where}: {n_distinct} distinct values in {n} rows — nearly one per item, so its "
            "values share little; is it an id? (drop it, or give it as 'numeric' if it is a number)"), stacklevel=4)
    return TableColumn(name, kind, values, offsets)
