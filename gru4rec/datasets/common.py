"""Shared preprocessing steps for the public data sets and for users' own logs (spec §11).

Every pipeline is the same chain of vectorised steps over three numpy arrays (one element per
event), so that tens of millions of events fit in a few hundred MB:

    read raw file(s) in chunks  ->  key (int64/uint64), item code (int32), time (int64 ticks)
    sort by (key, time, item)   ->  sessionise (given ids, or a new session after a gap)
    drop consecutive repeats    ->  iterative length/support filtering
    time split                  ->  train_full / test, then train_tr / train_valid
    atomic writes + a stats table

Times are kept as integer "ticks" of the raw resolution (seconds or milliseconds) until the
files are written; `Protocol.output_time_divisor` turns ticks into the written unit (e.g. the
YOOCHOOSE clicks have millisecond timestamps but the published files use float seconds).

Tie order: events of a session with the same timestamp are ordered by item id (as the scripts
behind the published numbers did), so the result does not depend on the order of the raw rows.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import sys
import time as _time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import pandas as pd

from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.files import atomic_write

OUTPUT_NAMES: tuple[str, ...] = ("train_full", "test", "train_tr", "train_valid")
STATS_FILE = "stats.tsv"
FORMATS: dict[str, str] = {"tsv": ".tsv", "parquet": ".parquet"}
COLUMNS: tuple[str, str, str] = ("SessionId", "ItemId", "Time")
DEFAULT_CHUNKSIZE = 1_000_000
SECONDS_PER_DAY = 86_400
# Rows per slice when writing: bounds the memory of the text/Arrow buffers of large outputs.
_WRITE_SLICE = 1_000_000

PathLike = str | os.PathLike[str]


# --------------------------------------------------------------------------------------------
# progress


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux/macOS; 0 where unknown)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):  # pragma: no cover - Windows
        return 0.0
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


class Progress:
    """Prints one line per step to stderr (elapsed time, peak memory so far), or nothing."""

    def __init__(self, name: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.name = name
        self.enabled = enabled
        self.stream = stream
        self.t0 = _time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = _time.perf_counter() - self.t0
            print(
                f"[{self.name} {elapsed:7.1f}s {peak_rss_mb():6.0f}MB] {message}",
                file=self.stream or sys.stderr,
                flush=True,
            )


# --------------------------------------------------------------------------------------------
# protocol


@dataclass(frozen=True)
class Protocol:
    """How a data set is sessionised, filtered and split (one row of the §11 table).

    kind: 'common' (the five data sets, `split_events`) or 'rsc15' (the 2016/2018 papers' one-pass
        protocol: no de-duplication, test = sessions whose last event is in the final window,
        unknown test items removed).
    days: the test window D in days; valid_days: the validation window (default: days).
    ticks_per_second: resolution of the internal integer time (1 = s, 1000 = ms).
    output_time_divisor: ticks per written time unit (1000 writes ms ticks as float seconds).
    session_gap_s: None when sessions are given; else a new session starts when the time since
        the previous event of the same key is strictly greater than this many seconds.
    boundary: a fixed T in ticks (None: T = the latest event after filtering).
    """

    kind: Literal["common", "rsc15"] = "common"
    days: float = 1.0
    valid_days: float | None = None
    ticks_per_second: int = 1
    output_time_divisor: int = 1
    session_gap_s: float | None = None
    boundary: int | float | None = None
    dedup: bool = True
    min_item_support: int = 5
    min_session_length: int = 2

    def ticks(self, days: float) -> int | float:
        """`days` as a duration in ticks (an int whenever it is whole)."""
        value = days * SECONDS_PER_DAY * self.ticks_per_second
        return int(value) if float(value).is_integer() else value

    def with_options(self, **options: Any) -> Protocol:
        """A copy with the given fields replaced; None values are ignored."""
        return replace(self, **{k: v for k, v in options.items() if v is not None})

    def validate(self) -> None:
        """Raise ConfigError listing every meaningless setting."""

        def positive(x: Any) -> bool:
            return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and x > 0

        def count(x: Any) -> bool:
            return positive(x) and float(x).is_integer()

        problems = []
        if not positive(self.days):
            problems.append(f"days must be > 0, got {self.days!r}")
        if self.valid_days is not None and not positive(self.valid_days):
            problems.append(f"valid_days must be > 0, got {self.valid_days!r}")
        if not count(self.min_item_support):
            problems.append(f"min_item_support must be an integer >= 1, got {self.min_item_support!r}")
        if not count(self.min_session_length):
            problems.append(f"min_session_length must be an integer >= 1, got {self.min_session_length!r}")
        if self.session_gap_s is not None and not positive(self.session_gap_s):
            problems.append(f"session_gap_s must be > 0, got {self.session_gap_s!r}")
        if self.boundary is not None and not isinstance(self.boundary, (int, float, np.integer, np.floating)):
            problems.append(f"boundary must be a number, got {self.boundary!r}")
        if problems:
            raise ConfigError("; ".join(problems))


# --------------------------------------------------------------------------------------------
# output paths and atomic writes


def output_paths(out_dir: PathLike, fmt: str = "tsv") -> dict[str, Path]:
    """The files a pipeline writes: the four splits in `fmt` plus `stats.tsv`."""
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    out = Path(out_dir)
    paths = {name: out / f"{name}{FORMATS[fmt]}" for name in OUTPUT_NAMES}
    paths["stats"] = out / STATS_FILE
    return paths


def prepare_out_dir(out_dir: PathLike, fmt: str, force: bool) -> dict[str, Path]:
    """Create `out_dir` and refuse (DataError naming the file) to overwrite outputs unless force.

    Called before any input is read so that a long run never ends in a refusal.
    """
    paths = output_paths(out_dir, fmt)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: output path exists and is not a directory")
    if not force:
        for path in paths.values():
            if path.exists():
                raise DataError(f"{path}: output file exists; refusing to overwrite it (use force=True / --force)")
    out.mkdir(parents=True, exist_ok=True)
    return paths


def _require_pyarrow(what: str) -> Any:
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in the dev setup
        raise Gru4RecError(f"{what} needs pyarrow: pip install 'gru4rec[parquet]'") from exc
    return pyarrow


Columns = dict[str, np.ndarray]


def _frames(columns: Columns | Iterable[Columns]) -> Iterator[pd.DataFrame]:
    """DataFrames of at most _WRITE_SLICE rows from one column dict or an iterable of them."""
    parts = [columns] if isinstance(columns, dict) else columns
    for part in parts:
        n = len(next(iter(part.values())))
        for start in range(0, n, _WRITE_SLICE):
            yield pd.DataFrame({k: v[start : start + _WRITE_SLICE] for k, v in part.items()})


def _arrow_csv() -> tuple[Any, Any] | None:
    """(pyarrow, pyarrow.csv) when installed: the fast TSV writer; None: pandas writes."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    except (ImportError, TypeError, ValueError):  # absent, or too old for quoting_style (< 13)
        return None
    return pa, pacsv


def _write_tsv(tmp: Path, names: Sequence[str], columns: Columns | Iterable[Columns]) -> None:
    arrow = _arrow_csv()
    with open(tmp, "wb") as fh:
        fh.write(("\t".join(names) + "\n").encode("utf-8"))
        for frame in _frames(columns):
            if arrow is not None:
                pa, pacsv = arrow
                # pyarrow's writer is ~10x faster than DataFrame.to_csv; it refuses values that
                # would need quoting (tabs, quotes, newlines in ids), which pandas then quotes.
                try:
                    table = pa.Table.from_pandas(frame, preserve_index=False)
                    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
                    buf = pa.BufferOutputStream()
                    pacsv.write_csv(table, buf, options)
                    fh.write(memoryview(buf.getvalue()))
                    continue
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    pass
            fh.write(frame.to_csv(sep="\t", index=False, header=False, lineterminator="\n").encode("utf-8"))


def _write_parquet(tmp: Path, names: Sequence[str], columns: Columns | Iterable[Columns]) -> None:
    _require_pyarrow("writing Parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    try:
        for frame in _frames(columns):
            table = pa.Table.from_pandas(frame[list(names)], preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
        if writer is None:  # no rows at all: still a valid file with the columns
            pq.write_table(pa.table({n: pa.array([], pa.int64()) for n in names}), tmp)
    finally:
        if writer is not None:
            writer.close()


def write_events(
    path: Path, columns: Columns | Iterable[Columns], fmt: str = "tsv", names: Sequence[str] | None = None
) -> None:
    """Atomically write an event table (TSV with a header line, or Parquet).

    `columns` is one dict of equal-length arrays, or an iterable of such dicts (slices written
    one after the other, so a large table never needs to exist in memory at once); `names`
    gives the column order (default: the dict's keys).
    """
    if names is None:
        if not isinstance(columns, dict):
            raise TypeError("names are required when columns is an iterable of slices")
        names = list(columns)
    if fmt == "parquet":
        atomic_write(path, lambda tmp: _write_parquet(tmp, names, columns))
    else:
        atomic_write(path, lambda tmp: _write_tsv(tmp, names, columns))


def write_stats(path: Path, stats: pd.DataFrame) -> None:
    """Atomically write the stats table as TSV."""
    atomic_write(path, lambda tmp: stats.to_csv(tmp, sep="\t", index=False))


# --------------------------------------------------------------------------------------------
# reading raw files


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
    path: Path, sep: str, required: dict[str, Sequence[str]], dataset: str
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


class ItemCoder:
    """Dense int32 codes for item ids across chunks, in order of first appearance."""

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {}

    def encode(self, values: pd.Series | np.ndarray) -> np.ndarray:
        """Codes of `values` (new ids get the next free codes)."""
        local, uniques = pd.factorize(values)
        table = self._codes
        glob = np.fromiter(
            (table.setdefault(u, len(table)) for u in uniques.tolist()), dtype=np.int64, count=len(uniques)
        )
        if len(table) > np.iinfo(np.int32).max:  # pragma: no cover - billions of items
            raise DataError("more than 2^31 distinct item ids")
        return glob[local].astype(np.int32)

    def __len__(self) -> int:
        return len(self._codes)

    def ids(self) -> np.ndarray:
        """code -> original id (int64 array when every id is an int, else object)."""
        keys = list(self._codes)
        if keys and all(isinstance(k, (int, np.integer)) for k in keys):
            return np.asarray(keys, dtype=np.int64)
        return np.asarray(keys, dtype=object)


def hash_keys(values: pd.Series) -> np.ndarray:
    """64-bit hashes of string keys (session hashes): a fixed 8 bytes per event instead of a
    Python string, with a collision chance of ~n^2/2^65 (1e-6 for 5M distinct keys)."""
    return pd.util.hash_array(values.to_numpy(dtype=object)).astype(np.uint64)


@dataclass
class RawEvents:
    """The kept raw events as flat arrays (not yet sorted).

    key: session id (given sessions) or user/session-hash key (sessionised with a gap).
    item: int32 item codes; item_ids maps a code to the original id.
    time: int64 ticks.
    """

    key: np.ndarray
    item: np.ndarray
    time: np.ndarray
    item_ids: np.ndarray
    sources: list[str]
    n_rows: int = 0
    notes: list[str] = field(default_factory=list)


class Accumulator:
    """Collects per-chunk arrays; `finish` concatenates one column at a time (low peak memory)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {"key": [], "item": [], "time": []}
        self.n_rows = 0

    def add(self, key: np.ndarray, item: np.ndarray, time: np.ndarray) -> None:
        assert len(key) == len(item) == len(time)
        if key.dtype == np.int64 and len(key) and key.min() >= -(2**31) and key.max() < 2**31:
            # session/user ids of the public data sets fit in 32 bits: 4 bytes per event less;
            # np.concatenate upcasts if a later chunk needs 64 bits
            key = key.astype(np.int32)
        self.parts["key"].append(key)
        self.parts["item"].append(item)
        self.parts["time"].append(time)

    @property
    def n_kept(self) -> int:
        return sum(len(a) for a in self.parts["key"])

    def finish(self, coder: ItemCoder, sources: list[str]) -> RawEvents:
        cols = {}
        for name in ("key", "item", "time"):
            parts = self.parts[name]
            cols[name] = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
            parts.clear()
        return RawEvents(
            key=cols["key"],
            item=cols["item"].astype(np.int32, copy=False),
            time=cols["time"].astype(np.int64, copy=False),
            item_ids=coder.ids(),
            sources=sources,
            n_rows=self.n_rows,
        )


# --------------------------------------------------------------------------------------------
# the vectorised steps


@dataclass
class Events:
    """Events sorted by (session, time, item).

    session: int32 (or int64) session codes, non-decreasing (not necessarily dense after filtering).
    item: int32 item codes. time: int64 (or float64) ticks.
    session_ids / item_ids: code -> the id written to the files.
    """

    session: np.ndarray
    item: np.ndarray
    time: np.ndarray
    session_ids: np.ndarray
    item_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.session)

    def take(self, index: np.ndarray) -> Events:
        """The events at `index` (a bool mask or sorted positions); order is kept."""
        return Events(self.session[index], self.item[index], self.time[index], self.session_ids, self.item_ids)

    @property
    def n_session_codes(self) -> int:
        return len(self.session_ids)

    @property
    def n_item_codes(self) -> int:
        return len(self.item_ids)


def sort_and_sessionise(raw: RawEvents, gap_ticks: int | float | None, progress: Progress | None = None) -> Events:
    """Sort by (key, time, item); cut sessions at key changes and, if given, at gaps > gap_ticks.

    With given sessions (gap None) the written SessionId is the raw key; with a gap, sessions get
    new ids 1, 2, ... in (key, time) order.
    """
    # item codes are in order of first appearance, which depends on the row order of the raw
    # files; recode them in id order so that the tie-break below is by item id
    perm = np.argsort(raw.item_ids, kind="stable")
    rank = np.empty(len(perm), dtype=np.int32)
    rank[perm] = np.arange(len(perm), dtype=np.int32)
    raw.item = rank[raw.item]
    raw.item_ids = raw.item_ids[perm]
    del perm, rank
    order = np.lexsort((raw.item, raw.time, raw.key))
    key = raw.key[order]
    raw.key = np.empty(0, dtype=key.dtype)  # free the unsorted copies as we go
    item = raw.item[order]
    raw.item = np.empty(0, dtype=np.int32)
    tm = raw.time[order]
    raw.time = np.empty(0, dtype=np.int64)
    del order
    n = len(key)
    new = np.empty(n, dtype=bool)
    if n:
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        if gap_ticks is not None:
            new[1:] |= (tm[1:] - tm[:-1]) > gap_ticks
    # int32 codes while they fit: 4 bytes per event less in every later step
    session = np.cumsum(new, dtype=np.int32 if n < 2**31 else np.int64)
    session -= 1
    if gap_ticks is None:
        session_ids = key[new]
        if session_ids.dtype == np.uint64:
            session_ids = np.arange(1, len(session_ids) + 1, dtype=np.int64)
    else:
        session_ids = np.arange(1, int(new.sum()) + 1, dtype=np.int64)
    del key, new
    if progress is not None:
        progress(f"sorted; {len(session_ids):,} sessions")
    return Events(session, item, tm, session_ids, raw.item_ids)


def consecutive_repeat_mask(ev: Events) -> np.ndarray:
    """True for events that repeat the previous event's item in the same session."""
    rep = np.zeros(len(ev), dtype=bool)
    if len(ev) > 1:
        rep[1:] = (ev.session[1:] == ev.session[:-1]) & (ev.item[1:] == ev.item[:-1])
    return rep


def drop_consecutive_repeats(ev: Events) -> Events:
    """Keep the first of each run of the same item within a session ((i, i, j) -> (i, j))."""
    return ev.take(~consecutive_repeat_mask(ev))


def _drop_short(ev: Events, mask: np.ndarray, min_length: int) -> np.ndarray:
    """`mask` without the sessions that have fewer than `min_length` events inside it."""
    if min_length <= 1:
        return mask
    # decide per session, then gather booleans: 1 byte per event instead of an int64 gather
    ok = np.bincount(ev.session[mask], minlength=ev.n_session_codes) >= min_length
    return mask & ok[ev.session]


def _drop_rare(ev: Events, mask: np.ndarray, min_support: int) -> np.ndarray:
    """`mask` without the events whose item has fewer than `min_support` events inside it."""
    if min_support <= 1:
        return mask
    ok = np.bincount(ev.item[mask], minlength=ev.n_item_codes) >= min_support
    return mask & ok[ev.item]


def drop_short_sessions(ev: Events, min_length: int) -> Events:
    """Drop every session with fewer than `min_length` events."""
    return ev.take(_drop_short(ev, np.ones(len(ev), dtype=bool), min_length))


def drop_rare_items(ev: Events, min_support: int) -> Events:
    """Drop every event whose item occurs in fewer than `min_support` events."""
    return ev.take(_drop_rare(ev, np.ones(len(ev), dtype=bool), min_support))


def iterative_filter_mask(
    ev: Events,
    keep: np.ndarray,
    min_support: int,
    min_length: int,
    progress: Progress | None = None,
) -> tuple[np.ndarray, int]:
    """Alternately drop short sessions and rare items among the events in `keep` until
    nothing changes; returns the final mask and the number of passes (a pass = one session
    step + one item step).

    Both removals are monotone, so the result is the unique largest subset in which every
    session has >= min_length events and every item >= min_support events. Working on a mask
    (1 byte per event) instead of copying the arrays each pass keeps the peak memory low.
    """
    passes = 0
    n = int(keep.sum())
    while True:
        keep = _drop_rare(ev, _drop_short(ev, keep, min_length), min_support)
        passes += 1
        before, n = n, int(keep.sum())
        if progress is not None:
            progress(f"filter pass {passes}: {before:,} -> {n:,} events")
        if n == before or n == 0:
            return keep, passes


def iterative_filter(
    ev: Events, min_support: int, min_length: int, progress: Progress | None = None
) -> tuple[Events, int]:
    """`iterative_filter_mask` over all events; returns the kept events and the passes."""
    keep, passes = iterative_filter_mask(ev, np.ones(len(ev), dtype=bool), min_support, min_length, progress)
    return ev.take(keep), passes


def _session_first_last(ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """Per session code: the time of its first and last event (events sorted by session, time);
    codes without events get the largest / smallest value of the time dtype."""
    n = len(ev)
    # keep the time dtype: int64 ticks beyond 2**53 would lose precision as floats
    info = np.iinfo(ev.time.dtype) if ev.time.dtype.kind in "iu" else np.finfo(ev.time.dtype)
    first = np.full(ev.n_session_codes, info.max, dtype=ev.time.dtype)
    last = np.full(ev.n_session_codes, info.min, dtype=ev.time.dtype)
    if n:
        change = np.flatnonzero(ev.session[1:] != ev.session[:-1]) + 1
        starts = np.r_[0, change]
        ends = np.r_[change - 1, n - 1]
        first[ev.session[starts]] = ev.time[starts]
        last[ev.session[ends]] = ev.time[ends]
    return first, last


def time_split(
    ev: Events, split_time: int | float, min_length: int, within: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """§11 split at `split_time` of the events in `within` (default: all), as boolean masks.

    test = the sessions that START at or after it (all their events); train = the events
    strictly before it, then sessions with fewer than `min_length` events there dropped. A
    session that starts before the boundary and continues after it keeps only its earlier
    events in train; its later events are in neither set. Session starts are taken over all of
    `ev`, which is right for `within` = train_full: train_full keeps every session's first event.
    """
    if within is None:
        within = np.ones(len(ev), dtype=bool)
    first, _ = _session_first_last(ev)
    test = within & (first >= split_time)[ev.session]
    train = _drop_short(ev, within & (ev.time < split_time), min_length)
    return train, test


def last_event_split(
    ev: Events, window: int | float, min_length: int, within: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """rsc15 split of the (whole) sessions in `within` as boolean masks: test = sessions whose
    LAST event is at or after (latest event in `within`) - window; train = the other sessions.
    Test events whose item is not in train are removed, then test sessions shorter than
    `min_length`."""
    if within is None:
        within = np.ones(len(ev), dtype=bool)
    tmax = ev.time[within].max()
    _, last = _session_first_last(ev)
    is_test = (last >= tmax - window)[ev.session]
    train = within & ~is_test
    test = within & is_test
    known = np.bincount(ev.item[train], minlength=ev.n_item_codes) > 0
    test = _drop_short(ev, test & known[ev.item], min_length)
    return train, test


def run_protocol(ev: Events, protocol: Protocol, progress: Progress) -> tuple[Events, dict[str, np.ndarray]]:
    """Filtering and splitting after sessionisation.

    Returns the filtered events and one boolean mask over them per output file: the four sets
    share the filtered arrays instead of holding copies (bounded memory on large data).
    """
    p = protocol
    D = p.ticks(p.days)
    Dv = p.ticks(p.valid_days if p.valid_days is not None else p.days)
    # callers pass `ev` as a temporary, so rebinding it here frees the unfiltered arrays
    if p.kind == "rsc15":
        # the 2016 protocol: one pass, in this order, no de-duplication
        keep = np.ones(len(ev), dtype=bool)
        keep = _drop_short(ev, keep, p.min_session_length)
        keep = _drop_rare(ev, keep, p.min_item_support)
        keep = _drop_short(ev, keep, p.min_session_length)
        ev = ev.take(keep)
        del keep
        progress(f"filtered (one pass): {len(ev):,} events")
        _require_nonempty(len(ev), None, p)
        train_full, test = last_event_split(ev, D, p.min_session_length)
        _require_nonempty(int(train_full.sum()), "train_full", p)
        train_tr, valid = last_event_split(ev, Dv, p.min_session_length, within=train_full)
    else:
        if p.dedup:
            keep = ~consecutive_repeat_mask(ev)
            progress(f"dropped {len(ev) - int(keep.sum()):,} consecutive repeats")
        else:
            keep = np.ones(len(ev), dtype=bool)
        keep, _ = iterative_filter_mask(ev, keep, p.min_item_support, p.min_session_length, progress)
        ev = ev.take(keep)
        del keep
        _require_nonempty(len(ev), None, p)
        T = p.boundary if p.boundary is not None else ev.time.max()
        train_full, test = time_split(ev, T - D, p.min_session_length)
        train_tr, valid = time_split(ev, T - D - Dv, p.min_session_length, within=train_full)
    masks = {"train_full": train_full, "test": test, "train_tr": train_tr, "train_valid": valid}
    for name in OUTPUT_NAMES:
        _require_nonempty(int(masks[name].sum()), name, p)
    return ev, masks


def _require_nonempty(n: int, what: str | None, p: Protocol) -> None:
    if n > 0:
        return
    if what is None:
        raise DataError(
            f"no events left after filtering (sessions of >= {p.min_session_length} events, "
            f"items of >= {p.min_item_support} events)"
        )
    window = f"{p.days:g} day(s)" if what in ("train_full", "test") else f"{p.valid_days or p.days:g} day(s)"
    raise DataError(f"{what} is empty after the time split (window {window}): the data cover too short a time span")


# --------------------------------------------------------------------------------------------
# stats and writing


def _fmt_time(value: float, ticks_per_second: float) -> str:
    """UTC date of a time in ticks; '' when it is no plausible epoch time (users' own data)."""
    try:
        seconds = float(value) / ticks_per_second
        return pd.Timestamp(seconds, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, pd.errors.OutOfBoundsDatetime):
        return ""


def stats_row(name: str, ev: Events, protocol: Protocol, mask: np.ndarray | None = None) -> dict[str, Any]:
    """events, sessions, items, first/last time (written unit and UTC) of a set."""
    session = ev.session if mask is None else ev.session[mask]
    n = len(session)
    sessions = int(np.count_nonzero(np.bincount(session, minlength=1))) if n else 0
    del session
    items = int(np.count_nonzero(np.bincount(ev.item if mask is None else ev.item[mask], minlength=1))) if n else 0
    tm = ev.time if mask is None else ev.time[mask]
    first = tm.min() if n else np.nan
    last = tm.max() if n else np.nan
    div = protocol.output_time_divisor
    tps = protocol.ticks_per_second
    return {
        "file": name,
        "events": n,
        "sessions": sessions,
        "items": items,
        "first_time": first / div if div != 1 else first,
        "last_time": last / div if div != 1 else last,
        "first_utc": _fmt_time(first, tps) if n else "",
        "last_utc": _fmt_time(last, tps) if n else "",
        "days": round((last - first) / (SECONDS_PER_DAY * tps), 3) if n else 0.0,
    }


def output_slices(ev: Events, protocol: Protocol, mask: np.ndarray | None = None) -> Iterator[Columns]:
    """SessionId, ItemId, Time columns of the events in `mask`, slice by slice, with the
    original ids and the written time unit."""
    div = protocol.output_time_divisor
    for lo in range(0, len(ev), _WRITE_SLICE):
        hi = lo + _WRITE_SLICE
        m = slice(None) if mask is None else mask[lo:hi]
        session = ev.session[lo:hi][m]
        if len(session) == 0:
            continue
        tm = ev.time[lo:hi][m]
        yield {
            "SessionId": ev.session_ids[session],
            "ItemId": ev.item_ids[ev.item[lo:hi][m]],
            "Time": tm / div if div != 1 else tm,
        }


def write_outputs(
    ev: Events,
    masks: dict[str, np.ndarray],
    paths: dict[str, Path],
    protocol: Protocol,
    fmt: str,
    progress: Progress,
) -> pd.DataFrame:
    """Write the four sets and stats.tsv atomically; return the stats table."""
    rows = [stats_row("filtered", ev, protocol)]
    for name in OUTPUT_NAMES:
        write_events(paths[name], output_slices(ev, protocol, masks[name]), fmt, names=COLUMNS)
        rows.append(stats_row(name, ev, protocol, masks[name]))
        progress(f"wrote {paths[name]} ({rows[-1]['events']:,} events)")
    stats = pd.DataFrame(rows)
    write_stats(paths["stats"], stats)
    return stats


# --------------------------------------------------------------------------------------------
# a whole public-data-set pipeline


@dataclass(frozen=True)
class DatasetInfo:
    """What a data-set module declares about its raw download."""

    name: str
    title: str
    raw_files: tuple[str, ...]
    download: str
    protocol: Protocol
    min_files: int = 1
    max_files: int | None = None


def resolve_raw_paths(info: DatasetInfo, raw_paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """The raw files to read: the given files, or the expected names inside a given folder."""
    if isinstance(raw_paths, (str, os.PathLike)):
        raw_paths = [raw_paths]
    paths = [Path(p) for p in raw_paths]
    if len(paths) == 1 and paths[0].is_dir():
        folder = paths[0]
        paths = [folder / name for name in info.raw_files]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise DataError(f"{folder}: missing raw file(s) for {info.name}: {', '.join(missing)}")
        return paths
    if not paths:
        raise DataError(f"{info.name}: no raw files given (expected {', '.join(info.raw_files)})")
    if len(paths) < info.min_files or (info.max_files is not None and len(paths) > info.max_files):
        want = (
            f"{info.min_files}" if info.max_files == info.min_files else f"{info.min_files}..{info.max_files or 'n'}"
        )
        raise DataError(
            f"{info.name}: expected {want} raw file(s) ({', '.join(info.raw_files)}), got {len(paths)}: "
            f"{', '.join(map(str, paths))}"
        )
    for p in paths:
        first_line(p)  # existence / emptiness, with the file's name in the message
    return paths


Reader = Callable[[list[Path], int, Progress], RawEvents]


def run_dataset(
    info: DatasetInfo,
    reader: Reader,
    raw_paths: PathLike | Sequence[PathLike],
    out_dir: PathLike,
    *,
    fmt: str = "tsv",
    force: bool = False,
    progress: bool | Progress = True,
    chunksize: int = DEFAULT_CHUNKSIZE,
    min_item_support: int | None = None,
    min_session_length: int | None = None,
) -> pd.DataFrame:
    """Read, sessionise, filter, split and write one public data set; returns the stats table."""
    protocol = info.protocol.with_options(min_item_support=min_item_support, min_session_length=min_session_length)
    protocol.validate()
    if not isinstance(chunksize, (int, np.integer)) or isinstance(chunksize, bool) or chunksize < 1:
        raise ConfigError(f"chunksize must be a positive integer, got {chunksize!r}")
    prog = progress if isinstance(progress, Progress) else Progress(info.name, bool(progress))
    paths = prepare_out_dir(out_dir, fmt, force)
    files = resolve_raw_paths(info, raw_paths)
    raw = reader(files, int(chunksize), prog)
    where = ", ".join(raw.sources)
    if len(raw.key) == 0:
        raise DataError(f"{where}: no events of the kind {info.name} uses (read {raw.n_rows:,} rows)")
    prog(f"read {raw.n_rows:,} rows, kept {len(raw.key):,} events, {len(raw.item_ids):,} items")
    gap = None if protocol.session_gap_s is None else protocol.session_gap_s * protocol.ticks_per_second
    try:
        # no name holds the sorted events: run_protocol frees them once filtered
        ev, masks = run_protocol(sort_and_sessionise(raw, gap, prog), protocol, prog)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    return write_outputs(ev, masks, paths, protocol, fmt, prog)


def chunk_progress(prog: Progress, path: Path, n_rows: int, n_kept: int) -> None:
    """The per-chunk progress line."""
    prog(f"{path.name}: {n_rows:,} rows read, {n_kept:,} events kept")
