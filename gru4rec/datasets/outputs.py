"""The files a pipeline writes: the four sets and stats.tsv, atomically, in TSV or Parquet.

`prepare_out_dir` runs before any input is read, so that a long run never ends in a refusal to
overwrite; `write_outputs` then writes each set slice by slice from the shared filtered arrays
(`output_slices`: original ids, written time unit), followed by the stats table. Every file is
written to a temporary file and renamed (`gru4rec.files.atomic_write`), so an interrupted run
never leaves a half-written file.

Times are kept as integer ticks until here; `Protocol.output_time_divisor` turns them into the
written unit (e.g. the YOOCHOOSE clicks have millisecond timestamps but the published files use
float seconds).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.datasets.progress import Progress
from gru4rec.datasets.protocol import OUTPUT_NAMES, SECONDS_PER_DAY, Protocol
from gru4rec.datasets.sessionise import Events
from gru4rec.errors import ConfigError, DataError, Gru4RecError, OutputExistsError
from gru4rec.files import atomic_write

__all__ = [
    "COLUMNS",
    "FORMATS",
    "STATS_FILE",
    "Columns",
    "PathLike",
    "output_paths",
    "output_slices",
    "prepare_out_dir",
    "stats_row",
    "write_events",
    "write_outputs",
    "write_stats",
]

STATS_FILE = "stats.tsv"
#: Output format -> file suffix.
FORMATS: dict[str, str] = {"tsv": ".tsv", "parquet": ".parquet"}
#: The written columns, in this order.
COLUMNS: tuple[str, str, str] = ("SessionId", "ItemId", "Time")
# Rows per slice when writing: bounds the memory of the text/Arrow buffers of large outputs.
_WRITE_SLICE = 1_000_000

PathLike = str | os.PathLike[str]
#: A table as column name -> equal-length arrays.
Columns = dict[str, np.ndarray]


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
                raise OutputExistsError(path)
    out.mkdir(parents=True, exist_ok=True)
    return paths


def _require_pyarrow(what: str) -> Any:
    """The pyarrow module, or Gru4RecError with the install hint for `what`."""
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in the dev setup
        raise Gru4RecError(f"{what} needs pyarrow: pip install 'gru4rec[parquet]'") from exc
    return pyarrow


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
    """A header line, then the rows TAB-separated (pyarrow's writer where it can, else pandas)."""
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
    """One Parquet file written row group by row group (one per slice)."""
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
