"""``gru4rec preprocess`` (a public data set's raw download -> the four split files) and
``gru4rec split`` (the same time split of a user's own event log), over
:func:`gru4rec.datasets.preprocess` and :func:`gru4rec.datasets.split_events`.

The stats table of the files written is the result (on standard output); the progress lines
are the library's messages, silenced by ``-q/--quiet``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from gru4rec.cli.common import EXIT_OK
from gru4rec.cli.console import result

__all__ = ["PreprocessSettings", "SplitSettings", "add_preprocess_arguments", "add_split_arguments", "run_preprocess",
           "run_split"]

# gru4rec.datasets (pandas) is imported inside the functions, when this command is used.


def _describe(parser: argparse.ArgumentParser, description: str, epilog: str | None = None) -> None:
    """Add our description (and epilog) to a parser that may already carry one."""
    parser.description = f"{parser.description}\n\n{description}" if parser.description else description
    if epilog:
        parser.epilog = f"{parser.epilog}\n\n{epilog}" if parser.epilog else epilog
    if parser.formatter_class is argparse.HelpFormatter:
        # keep the line breaks of the data-set list
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


@dataclass(frozen=True)
class PreprocessSettings:
    """The settings of ``gru4rec preprocess`` (one field per flag)."""

    dataset: str
    raw_paths: list[str]
    out: str
    chunksize: int  # its default lives with the pipelines (imported only when the command runs)
    fmt: str = "tsv"
    force: bool = False
    min_item_support: int | None = None
    min_session_length: int | None = None
    quiet: bool = False


@dataclass(frozen=True)
class SplitSettings:
    """The settings of ``gru4rec split`` (one field per flag)."""

    input: str
    out: str
    days: float = 1.0
    valid_days: float | None = None
    time_unit: Literal["s", "ms"] = "s"
    boundary: float | None = None
    min_item_support: int = 5
    min_session_length: int = 2
    dedup: bool = False
    session_key: str = "SessionId"
    item_key: str = "ItemId"
    time_key: str = "Time"
    fmt: str = "tsv"
    force: bool = False
    quiet: bool = False


def _progress(args: PreprocessSettings | SplitSettings) -> bool:
    """Progress lines unless ``-q/--quiet``."""
    return not args.quiet


# ----------------------------------------------------------------------------------- preprocess


def add_preprocess_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``gru4rec preprocess DATASET RAW_PATH... --out DIR``."""
    from gru4rec.datasets import DEFAULT_CHUNKSIZE, FORMATS, PIPELINES

    lines = [f"  {m.NAME:13s} {', '.join(m.INFO.raw_files)}" for m in PIPELINES.values()]
    _describe(
        parser,
        "Preprocess a public data set's raw download into train_full, test, train_tr and "
        "train_valid (the published protocol of each data set), plus stats.tsv.",
        "data sets and their raw files (see docs/datasets.md for the downloads and the "
        "protocols):\n" + "\n".join(lines),
    )
    parser.add_argument("dataset", metavar="DATASET", choices=list(PIPELINES), help="one of: " + ", ".join(PIPELINES))
    parser.add_argument("raw_paths", metavar="RAW_PATH", nargs="+", help="raw file(s), or one folder holding them")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    parser.add_argument("--format", dest="fmt", choices=list(FORMATS), default="tsv", help="output format (default: tsv)")
    parser.add_argument("-f", "--force", action="store_true", help="replace existing output files")
    parser.add_argument("--min-item-support", type=int, default=None, metavar="N",
                        help="drop items with fewer events (default: the published 5)")
    parser.add_argument("--min-session-length", type=int, default=None, metavar="N",
                        help="drop sessions with fewer events (default: the published 2)")
    parser.add_argument("--chunksize", type=int, default=DEFAULT_CHUNKSIZE, metavar="ROWS",
                        help=f"rows read at a time (default: {DEFAULT_CHUNKSIZE:,})")
    return parser


def run_preprocess(args: PreprocessSettings) -> int:
    """Run ``gru4rec preprocess`` from parsed arguments; writes the stats table; returns 0.

    User errors propagate as Gru4RecError subclasses for the CLI to print as one line.
    """
    from gru4rec.datasets import preprocess

    stats = preprocess(
        args.dataset,
        args.raw_paths,
        args.out,
        fmt=args.fmt,
        force=args.force,
        progress=_progress(args),
        chunksize=args.chunksize,
        min_item_support=args.min_item_support,
        min_session_length=args.min_session_length,
    )
    result(stats.to_string(index=False))
    return EXIT_OK


# ---------------------------------------------------------------------------------------- split


def add_split_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``gru4rec split INPUT --out DIR --days D ...``."""
    from gru4rec.datasets import FORMATS
    from gru4rec.datasets.split import TIME_UNITS

    _describe(
        parser,
        "Split your own event log by time: sessions starting in the last D days are the test "
        "set, earlier events train_full; the same on train_full gives train_tr / train_valid.",
    )
    parser.add_argument("input", metavar="INPUT", help="event file: TSV/CSV with a header, or Parquet")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    parser.add_argument("--days", type=float, default=1.0, help="test window in days (default: 1)")
    parser.add_argument("--valid-days", type=float, default=None, help="validation window in days (default: --days)")
    parser.add_argument("--time-unit", choices=list(TIME_UNITS), default="s", help="unit of the time column (default: s)")
    parser.add_argument("--boundary", type=float, default=None, metavar="T",
                        help="fixed end time T in the time unit (default: the latest event)")
    parser.add_argument("--min-item-support", type=int, default=5, metavar="N", help="default: 5 (1 disables)")
    parser.add_argument("--min-session-length", type=int, default=2, metavar="N", help="default: 2 (1 disables)")
    parser.add_argument("--dedup", action="store_true", help="drop consecutive repeats of an item in a session")
    parser.add_argument("-sk", "--session-key", default="SessionId", help="session id column (default: SessionId)")
    parser.add_argument("-ik", "--item-key", default="ItemId", help="item id column (default: ItemId)")
    parser.add_argument("-tk", "--time-key", default="Time", help="time column (default: Time)")
    parser.add_argument("--format", dest="fmt", choices=list(FORMATS), default="tsv", help="output format (default: tsv)")
    parser.add_argument("-f", "--force", action="store_true", help="replace existing output files")
    return parser


def run_split(args: SplitSettings) -> int:
    """Run ``gru4rec split`` from parsed arguments; writes the stats table; returns 0."""
    from gru4rec.datasets import split_events

    stats = split_events(
        args.input,
        args.out,
        days=args.days,
        valid_days=args.valid_days,
        time_unit=args.time_unit,
        min_item_support=args.min_item_support,
        min_session_length=args.min_session_length,
        dedup=args.dedup,
        boundary=args.boundary,
        session_key=args.session_key,
        item_key=args.item_key,
        time_key=args.time_key,
        fmt=args.fmt,
        force=args.force,
        progress=_progress(args),
    )
    result(stats.to_string(index=False))
    return EXIT_OK
