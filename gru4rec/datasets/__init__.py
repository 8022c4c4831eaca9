"""Preprocessing of the public session data sets (docs/datasets.md) and of users' own logs.

    preprocess(name, raw_paths, out_dir)   one public data set -> train_full, test, train_tr,
                                           train_valid (+ stats.tsv); returns the stats table
    split_events(data, out_dir, days=...)  the same time split for a user's own event log
    PIPELINES                              name -> module (each has INFO and read_raw)

Command-line glue (registered by gru4rec.cli): this package's `add_arguments` / `run`
(= `add_preprocess_arguments` / `run_preprocess`) for `gru4rec preprocess`, and
`gru4rec.datasets.split`'s `add_arguments` / `run` (= `add_split_arguments` / `run_split`)
for `gru4rec split`.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

import pandas as pd

from gru4rec.datasets import coveo, diginetica, rees46, retailrocket, rsc15, yoochoose
from gru4rec.datasets.outputs import FORMATS, PathLike
from gru4rec.datasets.pipeline import run_dataset
from gru4rec.datasets.protocol import OUTPUT_NAMES
from gru4rec.datasets.rawfiles import DEFAULT_CHUNKSIZE
from gru4rec.datasets.split import add_split_arguments, run_split, split_events
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
    "add_preprocess_arguments",
    "run_preprocess",
    "add_split_arguments",
    "run_split",
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


def add_preprocess_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of `gru4rec preprocess DATASET RAW_PATH... --out DIR`."""
    lines = [f"  {m.NAME:13s} {', '.join(m.INFO.raw_files)}" for m in PIPELINES.values()]
    _describe(
        parser,
        "Preprocess a public data set's raw download into train_full, test, train_tr and "
        "train_valid (spec §11), plus stats.tsv.",
        "data sets and their raw files (see docs/datasets.md for the downloads):\n" + "\n".join(lines),
    )
    parser.add_argument("dataset", metavar="DATASET", choices=list(PIPELINES), help="one of: " + ", ".join(PIPELINES))
    parser.add_argument("raw_paths", metavar="RAW_PATH", nargs="+", help="raw file(s), or one folder holding them")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    parser.add_argument("--format", dest="fmt", choices=list(FORMATS), default="tsv", help="output format (default: tsv)")
    parser.add_argument("--force", action="store_true", help="replace existing output files")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--min-item-support", type=int, default=None, metavar="N",
                        help="drop items with fewer events (default: the published 5)")
    parser.add_argument("--min-session-length", type=int, default=None, metavar="N",
                        help="drop sessions with fewer events (default: the published 2)")
    parser.add_argument("--chunksize", type=int, default=DEFAULT_CHUNKSIZE, metavar="ROWS",
                        help=f"rows read at a time (default: {DEFAULT_CHUNKSIZE:,})")
    return parser


def _describe(parser: argparse.ArgumentParser, description: str, epilog: str | None = None) -> None:
    """Add our description (and epilog) to a parser that may already carry one."""
    parser.description = f"{parser.description}\n\n{description}" if parser.description else description
    if epilog:
        parser.epilog = f"{parser.epilog}\n\n{epilog}" if parser.epilog else epilog
    if parser.formatter_class is argparse.HelpFormatter:
        # keep the line breaks of the data-set list
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def run_preprocess(args: argparse.Namespace) -> int:
    """Run `gru4rec preprocess` from parsed arguments; prints the stats table; returns 0.

    User errors propagate as Gru4RecError subclasses for the CLI to print as one line.
    """
    stats = preprocess(
        args.dataset,
        args.raw_paths,
        args.out,
        fmt=args.fmt,
        force=args.force,
        progress=not args.quiet,
        chunksize=args.chunksize,
        min_item_support=args.min_item_support,
        min_session_length=args.min_session_length,
    )
    print(stats.to_string(index=False), file=sys.stdout)
    return 0


# the hook names gru4rec.cli looks up in a command's module
add_arguments = add_preprocess_arguments
run = run_preprocess
