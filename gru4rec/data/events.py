"""Event files and frames: readers (TSV/CSV/Parquet, optionally gzipped), validation, writing.

One event per row with a session id, an item id and a timestamp (docs/behaviour.md §1). The
item map is in :mod:`gru4rec.data.items`, sessions as flat arrays in :mod:`gru4rec.data.sessions`.
Everything here is vectorised (NumPy/pandas): it must handle tens of millions of events, so
there is no Python loop over rows or sessions.

Identity of ids: item and session ids are kept as read. Integer ids stay int64 (a missing value
is an error, never a silent cast to float), string ids stay strings, so ``214821371`` in the
training file and ``214821371`` in a test file or a live request map to the same item.
"""
from __future__ import annotations

import csv
import gzip
import io
import itertools
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.errors import DataError, Gru4RecError, OutputExistsError
from gru4rec.files import atomic_write

# The file-format helpers are public for the other readers of tabular files (gru4rec.items.table).
__all__ = ["CSV_SUFFIXES", "KEY_COLUMNS_HINT", "PARQUET_HINT", "PARQUET_SUFFIXES", "TAB_SUFFIXES", "ColumnKeys",
           "choose_separator", "header_fields", "is_event_file_name", "line_or_row", "table_file", "text_header", "read_events",
           "read_head", "split_suffix", "validate_events", "validate_ids", "write_event_chunks", "write_events"]

TAB_SUFFIXES = (".tsv", ".txt", ".dat")
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
_SNIFF_DELIMITERS = "\t,;| "
PARQUET_HINT = "reading or writing Parquet needs pyarrow: pip install 'gru4rec[parquet]' (or pip install pyarrow)"

# Integral float ids are turned back into int64 only while exactly representable.
_MAX_EXACT_FLOAT_INT = 2**53


@dataclass(frozen=True)
class ColumnKeys:
    """The session, item and time column names of an event file."""

    session_key: str = "SessionId"
    item_key: str = "ItemId"
    time_key: str = "Time"

    @classmethod
    def resolve(cls, defaults: Any = None, *, session_key: str | None = None, item_key: str | None = None,
                time_key: str | None = None) -> ColumnKeys:
        """The names given; each one not given (None or empty) is ``defaults``' (anything with
        ``session_key``, ``item_key`` and ``time_key``, e.g. a model's config), or the standard
        name without ``defaults``. The one reading of the ``-sk/-ik/-tk`` flags and their likes."""
        base = cls() if defaults is None else cls(defaults.session_key, defaults.item_key, defaults.time_key)
        return cls(session_key or base.session_key, item_key or base.item_key, time_key or base.time_key)

    def as_dict(self) -> dict[str, str]:
        """``session_key=..., item_key=..., time_key=...`` for the readers' keyword arguments."""
        return {"session_key": self.session_key, "item_key": self.item_key, "time_key": self.time_key}


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def split_suffix(path: Path) -> tuple[str, bool]:
    """Return (format suffix, gzipped): 'x.tsv.gz' -> ('.tsv', True)."""
    name = path.name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-3]
    return Path(name).suffix, gz


def is_event_file_name(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s suffix is one that :func:`read_events` reads (``.tsv``, ``.csv``,
    ``.parquet``, ... optionally ``.gz``)."""
    return split_suffix(Path(path))[0] in (*TAB_SUFFIXES, *CSV_SUFFIXES, *PARQUET_SUFFIXES)


def _open_text(path: Path, gz: bool) -> io.TextIOBase:
    if gz:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def read_head(path: Path, gz: bool, n_chars: int = 65536) -> str:
    """The first characters of a text file (for the header and the delimiter sniffer)."""
    try:
        with _open_text(path, gz) as f:
            return f.read(n_chars)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the file ({e})") from e


def header_fields(head: str, sep: str) -> list[str]:
    """The column names of ``head``'s first line split by ``sep`` (the item attribute table reads its header so too)."""
    first_line = head.splitlines()[0] if head else ""
    if not first_line:
        return []
    return next(csv.reader([first_line], delimiter=sep))


def table_file(path: str | os.PathLike[str], what: str) -> tuple[Path, str, bool]:
    """``path`` checked to be a file (DataError naming it, ``what`` it should be: "an event
    file"), with its format suffix and whether it is gzipped (:func:`split_suffix`)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, expected {what}")
    suffix, gz = split_suffix(p)
    return p, suffix, gz


def text_header(p: Path, suffix: str, gz: bool, needed: list[str], sep: str | None, rows: str) -> tuple[str, list[str]]:
    """The separator and header fields of the text table ``p``: ``sep`` if given, else sniffed
    (:func:`choose_separator`, starting from the suffix's own); DataError for an empty file
    (no header, no ``rows``)."""
    head = read_head(p, gz)
    if not head.strip():
        raise DataError(f"{p}: empty file (no header, no {rows})")
    if sep is not None:
        return sep, header_fields(head, sep)
    default = "\t" if suffix in TAB_SUFFIXES else "," if suffix in CSV_SUFFIXES else None
    return choose_separator(head, needed, default)


def choose_separator(head: str, needed: list[str], default: str | None) -> tuple[str, list[str]]:
    """Pick the delimiter: the suffix's default if the header splits into the needed columns,
    otherwise the first of TAB, comma, semicolon, pipe, space that does (a header-based sniff,
    checked against the column names, so it cannot pick a wrong one). Returns (sep, header
    fields with that sep); with no match, the one that splits the header into the most fields,
    so that the error message can list the columns the file does have."""
    candidates = ([default] if default is not None else []) + list(_SNIFF_DELIMITERS)
    best: tuple[str, list[str]] | None = None
    for sep in candidates:
        fields = header_fields(head, sep)
        if all(c in fields for c in needed):
            return sep, fields
        if best is None or len(fields) > len(best[1]):
            best = (sep, fields)
    assert best is not None
    return best


#: How an event file's key columns are named when they are not the standard ones (the end of
#: a missing-column error: a newcomer whose log says session_id must learn it from the message).
KEY_COLUMNS_HINT = "; name the columns with -sk/-ik/-tk (in Python: session_key=, item_key=, time_key=)"


def missing_columns_error(source: str, missing: list[str], present: Iterable[Any], extra: str = "") -> DataError:
    """The DataError for key columns missing from ``source``, listing the columns it does have and
    any that differ from a missing one only in case (``SessionID`` for ``SessionId``)."""
    present = [str(c) for c in present]
    miss = ", ".join(repr(c) for c in missing)
    have = ", ".join(repr(c) for c in present)
    by_case = {c.casefold(): c for c in present}
    cased = [f"{by_case[m.casefold()]!r} for {m!r}" for m in missing if m.casefold() in by_case]
    case_note = f" (differing only in case: {', '.join(cased)})" if cased else ""
    return DataError(
        f"{source}: missing column{'s' if len(missing) > 1 else ''} {miss}; the columns found are [{have}]{case_note}{extra}"
    )


def check_keys(session_key: str, item_key: str, time_key: str) -> list[str]:
    """The three key column names as a list; DataError unless they are three different names."""
    keys = [session_key, item_key, time_key]
    if len(set(keys)) != 3:
        raise DataError(
            f"session_key, item_key and time_key must name three different columns, got {keys!r}"
        )
    return keys


def read_events(
    path: str | os.PathLike[str],
    *,
    session_key: str = "SessionId",
    item_key: str = "ItemId",
    time_key: str = "Time",
    sep: str | None = None,
) -> pd.DataFrame:
    """Read an event file and return it validated (see `validate_events`).

    Formats, chosen by the suffix (before an optional ``.gz``): ``.tsv``/``.txt``/``.dat`` are
    TAB-separated, ``.csv`` comma-separated, ``.parquet``/``.pq`` Parquet (needs pyarrow).
    Text files need a header row. When ``sep`` is None and the header does not split into the
    three key columns with the suffix's separator (or the suffix is unknown), the separator is
    sniffed from the header among TAB, comma, semicolon, pipe and space. Only the three key
    columns are read. Error messages give 1-based line numbers of the file (line 1 = header).
    Id columns whose values are all integers are read as int64 (so "007" becomes 7: pass a
    DataFrame with string columns to keep such ids as strings); any other id is a string.

    Returns a DataFrame with exactly the columns ``[session_key, item_key, time_key]``.
    Raises DataError for a missing or unreadable file, a missing column, missing/empty ids, an
    unparsable time or a file without events.
    """
    keys = check_keys(session_key, item_key, time_key)
    p, suffix, gz = table_file(path, "an event file")
    source = str(p)

    if suffix in PARQUET_SUFFIXES:
        df, first_line = _read_parquet(p, gz, keys), 0
    else:
        sep_used, fields = text_header(p, suffix, gz, keys, sep, "events")
        missing = [c for c in keys if c not in fields]
        if missing:
            raise missing_columns_error(source, missing, fields, f" (separator {sep_used!r}){KEY_COLUMNS_HINT}")
        try:
            df = pd.read_csv(
                p,
                sep=sep_used,
                usecols=keys,
                compression="gzip" if gz else None,
                encoding="utf-8-sig",
                # Read whole columns at once: chunked type inference can yield a column of
                # mixed ints and strings, which would break id identity.
                low_memory=False,
            )
        except (pd.errors.ParserError, ValueError, OSError, EOFError, UnicodeDecodeError) as e:
            raise DataError(f"{p}: cannot parse the file ({type(e).__name__}: {e})") from e
        first_line = 2  # data row 0 is on line 2, after the header
    return _validate(df, keys, source, first_line)


def _read_parquet(path: Path, gz: bool, keys: list[str]) -> pd.DataFrame:
    try:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as e:  # optional dependency
        raise Gru4RecError(f"{path}: {PARQUET_HINT}") from e
    try:
        src: Any = gzip.open(path, "rb") if gz else path
        if gz:
            # Parquet needs random access: decompress into memory first.
            with src:
                src = io.BytesIO(src.read())
        schema = pq.read_schema(src)
        if gz:
            src.seek(0)
        missing = [c for c in keys if c not in schema.names]
        if missing:
            raise missing_columns_error(str(path), missing, schema.names, KEY_COLUMNS_HINT)
        table = pq.read_table(src, columns=keys)
    except DataError:
        raise
    except Exception as e:  # pyarrow raises a zoo of types for corrupt files
        raise DataError(f"{path}: cannot read the Parquet file ({type(e).__name__}: {e})") from e
    # to_pandas() turns an integer column with nulls into float64, losing large ids: catch the
    # nulls here, while the column is still integer.
    for key in keys[:2]:
        col = table.column(key)
        if col.null_count:
            first = int(np.argmax(pc.is_null(col).to_numpy(zero_copy_only=False)))
            raise DataError(
                f"{path}: column {key!r} has {col.null_count} missing value(s), first at row {first}"
            )
    return table.to_pandas()


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def show_value(value: Any) -> str:
    """repr of a value as the user wrote it (5, not np.int64(5)), for error messages."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def line_or_row(pos: int, first_line: int) -> str:
    """Where row ``pos`` is, for an error: its file line (``first_line``: the first data row's line) or, in a frame, its row."""
    return f"line {pos + first_line}" if first_line else f"row {pos}"


def _is_stringlike(s: pd.Series) -> bool:
    return pd.api.types.is_string_dtype(s.dtype) or s.dtype == object


def _to_numpy_backed(s: pd.Series) -> pd.Series:
    """Categorical, nullable (Int64, Float64) and Arrow-backed numeric columns -> plain NumPy
    dtypes, so that ids and times behave the same whatever produced the frame. Missing values
    become NaN (floats) and are caught by the callers."""
    dtype = s.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        s = s.astype(dtype.categories.dtype)
        dtype = s.dtype
    if isinstance(dtype, np.dtype) or not pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype):
        return s
    if pd.api.types.is_integer_dtype(dtype) and not s.isna().any():
        return pd.Series(s.to_numpy(dtype=np.int64), index=s.index, name=s.name)
    return pd.Series(s.to_numpy(dtype=np.float64, na_value=np.nan), index=s.index, name=s.name)


def validate_ids(s: pd.Series, key: str, source: str, first_line: int) -> pd.Series:
    """The id column ``key`` checked (no missing id; integral floats back to int64), one error naming the row."""
    s = _to_numpy_backed(s)
    bad = s.isna().to_numpy()
    what = "missing value(s) (NaN/empty)"
    if _is_stringlike(s):
        # An empty string is as good as missing (e.g. a quoted "" in a CSV).
        empty = (s == "").to_numpy(dtype=bool, na_value=False)
        bad = bad | empty
    n_bad = int(bad.sum())
    if n_bad:
        first = int(np.argmax(bad))
        raise DataError(
            f"{source}: column {key!r} has {n_bad} {what}, first at {line_or_row(first, first_line)}"
        )
    if pd.api.types.is_float_dtype(s.dtype):
        # Ids stored as floats (e.g. after a NaN passed through pandas and was dropped): go back
        # to int64 when every value is an exactly representable integer, so that 1.0 and 1 are
        # the same item everywhere.
        v = s.to_numpy()
        if np.all(np.isfinite(v)) and np.all(np.abs(v) < _MAX_EXACT_FLOAT_INT) and np.all(v == np.floor(v)):
            return pd.Series(v.astype(np.int64), index=s.index, name=s.name)
    return s


def time_to_numeric(s: pd.Series, key: str, source: str, first_line: int) -> pd.Series:
    """Numeric times stay as they are; datetimes and date strings become float unix seconds
    (naive datetimes are taken as UTC)."""
    s = _to_numpy_backed(s)
    dtype = s.dtype
    if pd.api.types.is_bool_dtype(dtype):
        raise DataError(f"{source}: column {key!r} holds booleans, expected numbers or datetimes")
    if pd.api.types.is_numeric_dtype(dtype):
        v = s.to_numpy()
        if pd.api.types.is_float_dtype(dtype):
            bad = ~np.isfinite(v)
            if bad.any():
                first = int(np.argmax(bad))
                raise DataError(
                    f"{source}: column {key!r} has {int(bad.sum())} missing or non-finite time(s), "
                    f"first at {line_or_row(first, first_line)}"
                )
        return s
    if isinstance(dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(dtype):
        dt = s if isinstance(dtype, pd.DatetimeTZDtype) else s.dt.tz_localize("UTC")
        return _datetimes_to_seconds(dt, s, key, source, first_line)
    if _is_stringlike(s):
        missing = s.isna().to_numpy()
        if missing.any():
            first = int(np.argmax(missing))
            raise DataError(
                f"{source}: column {key!r} has {int(missing.sum())} missing time(s), "
                f"first at {line_or_row(first, first_line)}"
            )
        if pd.api.types.is_object_dtype(dtype):
            # Python numbers in an object column: numeric times.
            num = pd.to_numeric(s, errors="coerce")
            if not num.isna().any():
                return time_to_numeric(num, key, source, first_line)
        with warnings.catch_warnings():
            # pandas warns when it cannot infer one format; we report failures ourselves.
            warnings.simplefilter("ignore", UserWarning)
            dt = pd.to_datetime(s, utc=True, errors="coerce")
            if dt.isna().any():
                # The default parser fixes one format from the first value; allow mixed formats.
                dt_mixed = pd.to_datetime(s, utc=True, errors="coerce", format="mixed")
                if dt_mixed.isna().sum() < dt.isna().sum():
                    dt = dt_mixed
        if dt.isna().any():
            # Numbers written as strings are numeric times, not dates.
            num = pd.to_numeric(s, errors="coerce")
            if not num.isna().any():
                return time_to_numeric(num, key, source, first_line)
        return _datetimes_to_seconds(dt, s, key, source, first_line)
    raise DataError(f"{source}: column {key!r} has unsupported type {dtype}, expected numbers or datetimes")


def _datetimes_to_seconds(
    dt: pd.Series, original: pd.Series, key: str, source: str, first_line: int
) -> pd.Series:
    bad = dt.isna().to_numpy()
    if bad.any():
        first = int(np.argmax(bad))
        raise DataError(
            f"{source}: column {key!r} has {int(bad.sum())} unparsable time(s), first "
            f"{show_value(original.iloc[first])} at {line_or_row(first, first_line)}; expected numbers or datetimes"
        )
    secs = (dt - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    return pd.Series(secs.to_numpy(dtype=np.float64), index=original.index, name=original.name)


def _validate(df: pd.DataFrame, keys: list[str], source: str, first_line: int) -> pd.DataFrame:
    session_key, item_key, time_key = keys
    missing = [c for c in keys if c not in df.columns]
    if missing:
        raise missing_columns_error(source, missing, df.columns, KEY_COLUMNS_HINT)
    duplicated = [c for c in keys if int((df.columns == c).sum()) > 1]
    if duplicated:
        raise DataError(f"{source}: column {duplicated[0]!r} appears more than once")
    if len(df) == 0:
        raise DataError(f"{source}: no events (0 rows)")
    out = pd.DataFrame(
        {
            session_key: validate_ids(df[session_key], session_key, source, first_line),
            item_key: validate_ids(df[item_key], item_key, source, first_line),
            time_key: time_to_numeric(df[time_key], time_key, source, first_line),
        },
        index=df.index,
    )
    return out


def validate_events(
    df: pd.DataFrame,
    *,
    session_key: str = "SessionId",
    item_key: str = "ItemId",
    time_key: str = "Time",
    source: str = "<DataFrame>",
) -> pd.DataFrame:
    """Check an event frame and return a frame with exactly ``[session_key, item_key, time_key]``.

    Raises DataError, naming ``source`` and the column, for: a missing column (the message lists
    the columns that exist), 0 rows, missing (NaN/None) or empty-string session/item ids (count
    and first offending row, 0-based position), and missing or unparsable times (first bad
    value). Numeric times are kept as they are; datetime columns and date strings are converted
    to float unix seconds (naive values taken as UTC). Float id columns whose values are all
    integers become int64. The input frame is not modified.
    """
    keys = check_keys(session_key, item_key, time_key)
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"{source}: expected a pandas DataFrame, got {type(df).__name__}")
    return _validate(df, keys, source, 0)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_events(
    df: pd.DataFrame, path: str | os.PathLike[str], *, force: bool = False, sep: str | None = None
) -> Path:
    """Write an event frame atomically (temp file in the same folder, then rename).

    The format follows the suffix as in `read_events` (TSV by default, CSV, Parquet; ``.gz``
    compresses text formats). Refuses to replace an existing file unless ``force`` (DataError
    naming the file). Writes every column of ``df``, without the index. Returns the path.
    """
    written = write_event_chunks([df], path, force=force, sep=sep)
    assert written is not None  # None only for standard output (path None)
    return written


def write_event_chunks(
    chunks: Iterable[pd.DataFrame], path: str | os.PathLike[str] | None, *, force: bool = False, sep: str | None = None
) -> Path | None:
    """:func:`write_events` for frames that come one after another (all with the same
    columns): each is written as it comes, so the whole never has to be in memory. The file
    appears, atomically, when the last chunk is written; an error on the way leaves no file
    (and an existing one as it was). ``path`` None writes TSV to standard output. At least one
    frame is needed (the columns come from it). (``gru4rec.datasets.outputs`` writes the split
    files in chunks too, through pyarrow's streaming writers; this one serves ``gru4rec recommend``.)"""
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        raise ValueError("write_event_chunks: no frames to write (the columns come from the first)")
    chunks = itertools.chain([first], chunks)
    if path is None:
        import sys

        for i, chunk in enumerate(chunks):
            chunk.to_csv(sys.stdout, sep=sep or "\t", index=False, header=i == 0)
        sys.stdout.flush()
        return None
    p = Path(path)
    if p.exists() and not force:
        raise OutputExistsError(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    suffix, gz = split_suffix(p)
    if sep is None:
        sep = "," if suffix in CSV_SUFFIXES else "\t"

    def write(tmp: Path) -> None:
        if suffix in PARQUET_SUFFIXES:
            try:
                import pyarrow
                import pyarrow.parquet as pq
            except ImportError as e:
                raise Gru4RecError(f"{p}: {PARQUET_HINT}") from e
            with (gzip.open(tmp, "wb") if gz else open(tmp, "wb")) as fh:
                table = pyarrow.Table.from_pandas(first, preserve_index=False)
                writer = pq.ParquetWriter(fh, table.schema)
                try:
                    for chunk in chunks:
                        writer.write_table(pyarrow.Table.from_pandas(chunk, preserve_index=False))
                finally:
                    writer.close()
        else:
            with (gzip.open(tmp, "wt", newline="") if gz else open(tmp, "w", newline="")) as fh:
                for i, chunk in enumerate(chunks):
                    chunk.to_csv(fh, sep=sep, index=False, header=i == 0)

    return atomic_write(p, write)
