"""One public data set from its raw download to the four files: `run_dataset`.

Each data set module (rsc15.py, yoochoose.py, ...) declares a `DatasetInfo` (its raw file
names, download page and `Protocol`) and a reader (raw files -> `RawEvents`); `run_dataset`
chains the shared steps, each a vectorised pass over flat arrays:

    check options, refuse to overwrite outputs    (before any input is read)
    read raw file(s) in chunks                    key, item code, time ticks (the module's reader)
    sort by (key, time, item), sessionise         given ids, or a new session after a gap
    filter and split                              the data set's Protocol
    atomic writes + stats.tsv

`gru4rec split` (`gru4rec.datasets.split.split_events`) runs the same protocol on a user's own
event log.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gru4rec.datasets.outputs import PathLike, prepare_out_dir, write_outputs
from gru4rec.datasets.progress import Progress
from gru4rec.datasets.protocol import Protocol, run_protocol
from gru4rec.datasets.rawfiles import DEFAULT_CHUNKSIZE, first_line
from gru4rec.datasets.sessionise import RawEvents, sort_and_sessionise
from gru4rec.errors import ConfigError, DataError

__all__ = ["DatasetInfo", "Reader", "resolve_raw_paths", "run_dataset"]


@dataclass(frozen=True)
class DatasetInfo:
    """What a data-set module declares about its raw download.

    name: the data set's name (`preprocess(name, ...)`); title / download: for the help and docs.
    raw_files: the raw file names (looked up inside a folder argument).
    protocol: how it is sessionised, filtered and split.
    min_files / max_files: how many raw files a call may give (None: no upper limit).
    """

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


#: A data set's reader: (raw file paths, rows per chunk, progress) -> the kept raw events.
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
    """Read, sessionise, filter, split and write one public data set; returns the stats table.

    progress: True / False (log the steps or not), or a Progress of the caller's. The other
    options are `gru4rec.datasets.preprocess`'s.
    """
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
