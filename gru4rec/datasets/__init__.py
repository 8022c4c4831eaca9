"""Preprocessing of the public session data sets (docs/datasets.md) and of users' own logs.

    preprocess(name, raw_paths, out_dir)   one public data set -> train_full, test, train_tr,
                                           train_valid (+ stats.tsv); returns the stats table
    split_events(data, out_dir, days=...)  the same time split for a user's own event log
    PIPELINES                              name -> module (each has INFO and read_raw)

The command line over these (`gru4rec preprocess`, `gru4rec split`) is gru4rec.cli.preprocess.
"""
from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import pandas as pd

from gru4rec.datasets import coveo, diginetica, rees46, retailrocket, rsc15, yoochoose
from gru4rec.datasets.outputs import FORMATS, PathLike
from gru4rec.datasets.pipeline import run_dataset
from gru4rec.datasets.protocol import OUTPUT_NAMES
from gru4rec.datasets.rawfiles import DEFAULT_CHUNKSIZE
from gru4rec.datasets.split import split_events
from gru4rec.errors import ConfigError

PIPELINES: dict[str, ModuleType] = {
    m.NAME: m for m in (rsc15, yoochoose, rees46, coveo, retailrocket, diginetica)
}

__all__ = [
    "DEFAULT_CHUNKSIZE",
    "FORMATS",
    "PIPELINES",
    "OUTPUT_NAMES",
    "preprocess",
    "split_events",
]


def preprocess(
    name: str,
    raw_paths: PathLike | Sequence[PathLike],
    out_dir: PathLike,
    *,
    fmt: str = "tsv",
    force: bool = False,
    progress: bool = True,
    chunksize: int = DEFAULT_CHUNKSIZE,
    min_item_support: int | None = None,
    min_session_length: int | None = None,
) -> pd.DataFrame:
    """Turn a public data set's raw download into the four split files and return their stats.

    name: one of PIPELINES (rsc15, yoochoose, rees46, coveo, retailrocket, diginetica).
    raw_paths: the raw file(s), or one folder holding the expected file names.
    out_dir: created if missing; existing outputs are only replaced with force=True.
    fmt: 'tsv' (header SessionId ItemId Time) or 'parquet' (needs pyarrow).
    progress: log one line per chunk and step (INFO records; see gru4rec.datasets.progress).
    min_item_support / min_session_length: override the published 5 / 2 (for experiments).
    Returns a DataFrame with one row per set ('filtered' = all events after filtering, then
    the four files): events, sessions, items, first/last time, their UTC dates and span in days.
    Raises DataError naming the file and the problem for bad input, ConfigError for options.
    """
    if name not in PIPELINES:
        raise ConfigError(f"unknown data set {name!r}; choose one of {', '.join(PIPELINES)}")
    module = PIPELINES[name]
    return run_dataset(
        module.INFO,
        module.read_raw,
        raw_paths,
        out_dir,
        fmt=fmt,
        force=force,
        progress=progress,
        chunksize=chunksize,
        min_item_support=min_item_support,
        min_session_length=min_session_length,
    )
