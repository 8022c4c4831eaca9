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

from gru4rec.cli.common import EXIT_OK, add_flags, declared_flag, flag
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


_OUT_HELP = "output folder (created if missing)"
_FORMAT_HELP = "output format (default: tsv)"
_FORCE_HELP = "replace existing output files"


@dataclass(frozen=True)
class PreprocessSettings:
    """The settings of ``gru4rec preprocess``: a field per flag, declared with it (the data sets,
    the formats and the chunk size's default live with the pipelines: see the ``add_`` function)."""

    dataset: str = flag(metavar="DATASET", help="one of the data sets")
    raw_paths: list[str] = flag(metavar="RAW_PATH", nargs="+", help="raw file(s), or one folder holding them")
    out: str = flag("--out", metavar="DIR", help=_OUT_HELP)
    chunksize: int = flag("--chunksize", type=int, metavar="ROWS", help="rows read at a time")
    fmt: str = flag("--format", default="tsv", help=_FORMAT_HELP)
    force: bool = flag("-f", "--force", action="store_true", default=False, help=_FORCE_HELP)
    min_item_support: int | None = flag("--min-item-support", type=int, metavar="N", default=None,
                                        help="drop items with fewer events (default: the published 5)")
    min_session_length: int | None = flag("--min-session-length", type=int, metavar="N", default=None,
                                          help="drop sessions with fewer events (default: the published 2)")
    quiet: bool = False  # -q, the flag every command has


@dataclass(frozen=True)
class SplitSettings:
    """The settings of ``gru4rec split``: a field per flag, declared with it."""

    input: str = flag(metavar="INPUT", help="event file: TSV/CSV with a header, or Parquet")
    out: str = flag("--out", metavar="DIR", help=_OUT_HELP)
    days: float = flag("--days", type=float, default=1.0, help="test window in days (default: 1)")
    valid_days: float | None = flag("--valid-days", type=float, default=None, help="validation window in days (default: --days)")
    time_unit: Literal["s", "ms"] = flag("--time-unit", default="s", help="unit of the time column (default: s)")
    boundary: float | None = flag("--boundary", type=float, metavar="T", default=None,
                                  help="fixed end time T in the time unit (default: the latest event)")
    min_item_support: int = flag("--min-item-support", type=int, metavar="N", default=5, help="default: 5 (1 disables)")
    min_session_length: int = flag("--min-session-length", type=int, metavar="N", default=2, help="default: 2 (1 disables)")
    dedup: bool = flag("--dedup", action="store_true", default=False, help="drop consecutive repeats of an item in a session")
    session_key: str = flag("-sk", "--session-key", default="SessionId", help="session id column (default: SessionId)")
    item_key: str = flag("-ik", "--item-key", default="ItemId", help="item id column (default: ItemId)")
    time_key: str = flag("-tk", "--time-key", default="Time", help="time column (default: Time)")
    fmt: str = flag("--format", default="tsv", help=_FORMAT_HELP)
    force: bool = flag("-f", "--force", action="store_true", default=False, help=_FORCE_HELP)
    quiet: bool = False  # -q, the flag every command has


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
    formats = list(FORMATS)
    add_flags(parser, PreprocessSettings, {
        "dataset": declared_flag(PreprocessSettings, "dataset", choices=list(PIPELINES), help="one of: " + ", ".join(PIPELINES)),
        "chunksize": declared_flag(PreprocessSettings, "chunksize", default=DEFAULT_CHUNKSIZE,
                                   help=f"rows read at a time (default: {DEFAULT_CHUNKSIZE:,})"),
        "fmt": declared_flag(PreprocessSettings, "fmt", choices=formats),
    })
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
    add_flags(parser, SplitSettings, {"fmt": declared_flag(SplitSettings, "fmt", choices=list(FORMATS)),
                                      "time_unit": declared_flag(SplitSettings, "time_unit", choices=list(TIME_UNITS))})
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
