"""Reading the public data sets' raw downloads, with errors that name the file, line and value.

A reader (one per data set module) checks a file's first line before anything else, so that a
wrong file or separator is reported at once and not after minutes of parsing:

* `resolve_header` maps the columns a pipeline needs to their names in a file with a header
  (a header that only matches when split by another separator is reported as such);
* `check_field_count` does the same for header-less files (YOOCHOOSE clicks);
* `iter_csv_chunks` then reads only the needed columns, `DEFAULT_CHUNKSIZE` rows at a time, so
  that the memory does not grow with the raw file (only the kept columns' arrays do);
* `column_int64` / `column_timestamp` convert a chunk's column, or raise DataError naming the
  file, the line (header included) and the first value that does not convert.

gzip, bz2, xz and single-file zip archives are read as they are (`open_text`).
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from gru4rec.errors import DataError

__all__ = [
    "DEFAULT_CHUNKSIZE",
    "check_field_count",
    "column_int64",
    "column_timestamp",
    "first_line",
    "iter_csv_chunks",
    "open_text",
    "resolve_header",
]

#: Rows of a raw file parsed at a time (`--chunksize`): bounds the memory of the parser.
DEFAULT_CHUNKSIZE = 1_000_000


def open_text(path: Path) -> TextIO:
    """Open a (possibly .gz/.bz2/.xz/.zip compressed) text file for reading."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    if suffix == ".bz2":
        return bz2.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    if suffix == ".xz":
        return lzma.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    if suffix == ".zip":
        zf = zipfile.ZipFile(path)
        names = [n for n in zf.namelist() if not n.endswith("/")]
        if len(names) != 1:
            raise DataError(f"{path}: a .zip input must hold exactly one file, found {len(names)}")
        return io.TextIOWrapper(zf.open(names[0]), encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def first_line(path: Path) -> str:
    """The first line of a raw file without its line ending; DataError if missing or empty."""
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a file")
    try:
        with open_text(path) as fh:
            line = fh.readline()
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"{path}: cannot read the file ({exc})") from exc
    line = line.rstrip("\r\n")
    if not line.strip():
        raise DataError(f"{path}: the file is empty (no header or first row)")
    return line


_SEPARATORS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}


def _sep_name(sep: str) -> str:
    return f"{_SEPARATORS.get(sep, repr(sep))} ({sep!r})"


def _normalise(name: str) -> str:
    return name.strip().strip('"').strip("'").lower().replace("_", "").replace(" ", "")


def resolve_header(
    path: Path, sep: str, required: Mapping[str, Sequence[str]], dataset: str
) -> dict[str, str]:
    """Map each canonical column to its name in the file's header.

    `required` maps a canonical name to the accepted spellings; matching ignores case, `_` and
    spaces (DIGINETICA's header is `sessionId;userId;...` in the download and
    `session_id;user_id;...` in some copies). A header that matches when split by another
    separator is reported as a wrong separator.
    """
    line = first_line(path)

    def match(names: list[str]) -> tuple[dict[str, str], list[str]]:
        lookup = {_normalise(n): n.strip().strip('"') for n in names}
        found, missing = {}, []
        for canon, spellings in required.items():
            hit = next((lookup[_normalise(s)] for s in spellings if _normalise(s) in lookup), None)
            if hit is None:
                missing.append(spellings[0])
            else:
                found[canon] = hit
        return found, missing

    found, missing = match(line.split(sep))
    if not missing:
        return found
    for other in _SEPARATORS:
        if other != sep and other in line and not match(line.split(other))[1]:
            raise DataError(
                f"{path}: wrong separator: the header is {_sep_name(other)}-separated but {dataset} "
                f"raw files are {_sep_name(sep)}-separated"
            )
    if len(line.split(sep)) == 1 and any(o in line for o in _SEPARATORS if o != sep):
        raise DataError(
            f"{path}: wrong separator: no {_sep_name(sep)} in the header {line[:120]!r}; "
            f"{dataset} raw files are {_sep_name(sep)}-separated"
        )
    raise DataError(
        f"{path}: missing column(s) {', '.join(repr(m) for m in missing)} for {dataset} "
        f"(header has {', '.join(repr(n) for n in line.split(sep))})"
    )


def check_field_count(path: Path, sep: str, n_fields: int, dataset: str) -> None:
    """For header-less files: the first row must have `n_fields` fields split by `sep`."""
    line = first_line(path)
    n = len(line.split(sep))
    if n == n_fields:
        return
    for other in _SEPARATORS:
        if other != sep and len(line.split(other)) == n_fields:
            raise DataError(
                f"{path}: wrong separator: the first row has {n_fields} {_sep_name(other)}-separated "
                f"fields but {dataset} raw files are {_sep_name(sep)}-separated"
            )
    raise DataError(
        f"{path}: expected {n_fields} {_sep_name(sep)}-separated fields per row for {dataset}, "
        f"the first row has {n}: {line[:120]!r}"
    )


def iter_csv_chunks(
    path: Path,
    *,
    sep: str,
    usecols: Sequence[str] | Sequence[int],
    names: Sequence[str] | None = None,
    dtype: dict[Any, Any] | None = None,
    chunksize: int = DEFAULT_CHUNKSIZE,
) -> Iterator[pd.DataFrame]:
    """Read only `usecols` of a CSV in chunks; parser failures become DataError naming the file.

    With `names` the file has no header. Chunk indices continue across chunks, so a row's
    line number is index + 1 (+ 1 for a header line).
    """
    try:
        reader = pd.read_csv(
            path,
            sep=sep,
            header=None if names is not None else 0,
            names=names,
            usecols=usecols,
            dtype=dtype,
            chunksize=chunksize,
            compression="infer",
            engine="c",
            on_bad_lines="error",
        )
        with reader:
            yield from reader
    except pd.errors.EmptyDataError as exc:
        raise DataError(f"{path}: the file is empty") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        # one line: pandas' message names the line and the field counts
        raise DataError(f"{path}: cannot parse the file: {str(exc).strip().splitlines()[-1]}") from exc


def _first_bad(mask: pd.Series, col: pd.Series) -> tuple[int, Any]:
    label = mask.idxmax()
    return int(label), col.loc[label]


def column_int64(col: pd.Series, path: Path, name: str, header_lines: int, what: str = "an integer") -> np.ndarray:
    """A column as int64, or DataError naming the file, line and value of the first bad entry."""
    if col.dtype.kind in "iu":
        return col.to_numpy(dtype=np.int64)
    num = pd.to_numeric(col, errors="coerce")
    bad = num.isna() | (num.astype("float64") % 1 != 0)
    if bad.any():
        row, value = _first_bad(bad, col)
        shown = "an empty value" if pd.isna(value) else repr(value)
        raise DataError(f"{path}, line {row + 1 + header_lines}: column {name!r} must be {what}, got {shown}")
    return num.to_numpy(dtype=np.int64)


_EPOCH = pd.Timestamp(0, tz="UTC")


def column_timestamp(
    col: pd.Series, path: Path, name: str, header_lines: int, *, unit: str, example: str
) -> np.ndarray:
    """Parse ISO-8601 date/time strings (UTC) into int64 ticks of `unit` ('s', 'ms', 'D').

    DataError names the file, line and value of the first string that does not parse.
    """
    ts = pd.to_datetime(col, format="ISO8601", utc=True, errors="coerce")
    bad = ts.isna()
    if bad.any():
        row, value = _first_bad(bad, col)
        shown = "an empty value" if pd.isna(value) else repr(value)
        raise DataError(
            f"{path}, line {row + 1 + header_lines}: cannot parse {name!r} {shown} as a timestamp "
            f"(expected e.g. {example!r})"
        )
    # floor division by a Timedelta is independent of the parsed resolution (pandas 2 vs 3)
    return ((ts - _EPOCH) // pd.Timedelta(1, unit)).to_numpy(dtype=np.int64)
