"""``gru4rec recommend``: top-k next items for every session of an event file, written to a file."""
from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gru4rec.cli.common import (
    EXIT_OK,
    ColumnFlags,
    MachineFlags,
    add_flags,
    check_readable,
    check_writable_target,
    column_flags,
    flag,
    load_model,
    positive_int,
    uses_threads,
)

__all__ = ["DESCRIPTION", "FLAGS", "RecommendSettings", "add_arguments", "run"]

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Top-k next items for every session in SESSIONS, given all its events.\n\n"
    "Output columns: the session column, Rank (1..k), the item column, Score\n"
    "(the score it was ranked by: the model's, plus the repeat boost when the\n"
    "model has one, see gru4rec evaluate --repeat-weight) and Fallback. Items\n"
    "the model does not know are skipped with a counted warning; a session with\n"
    "no known item gets the most popular items, with Fallback = True and an empty\n"
    "Score (no model score exists for them). -o - writes TSV to standard output."
)


#: The column flags' help: their default is the model's.
FLAGS = column_flags("the model's")


@dataclass(frozen=True, kw_only=True)
class RecommendSettings(ColumnFlags, MachineFlags):
    """The settings of ``gru4rec recommend``: a field per flag, declared with it."""

    model: str = flag(metavar="MODEL", help="a model file saved by train --save")
    input: str = flag("-i", "--input", metavar="SESSIONS",
                      help="events of the sessions to recommend for (session, item, time "
                           "columns; each session's items in time order)")
    output: str = flag("-o", "--output", metavar="RECS",
                       help="where to write the recommendations: .tsv/.csv (optionally .gz) or "
                            ".parquet, or - for TSV on standard output; one row per session and rank")
    k: int = flag("-k", "--k", type=positive_int, default=20, help="items per session (default: 20)")
    exclude_seen: bool = flag("--exclude-seen", action="store_true", default=False,
                              help="never recommend an item the session already contains")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec recommend`` (:class:`RecommendSettings`)."""
    add_flags(parser, RecommendSettings, FLAGS)


@uses_threads
def run(args: RecommendSettings) -> int:
    """Run ``gru4rec recommend``: one row per session and rank in ``--output``, written chunk by
    chunk as the engine answers (memory bounded by a chunk, not by the number of sessions)."""
    import numpy as np
    import pandas as pd

    from gru4rec.data import ColumnKeys, index_sessions, read_events, write_event_chunks
    from gru4rec.inference.protocol import catalogue_of

    to_stdout = args.output == "-"
    if not to_stdout:
        check_writable_target(args.output, args.force, "output file")
    check_readable([args.input], "input file")
    model = load_model(args.model, args.device)
    names = ColumnKeys.resolve(model.config, session_key=args.session_key, item_key=args.item_key, time_key=args.time_key)
    sk, ik, tk = names.session_key, names.item_key, names.time_key
    events = read_events(args.input, session_key=sk, item_key=ik, time_key=tk)
    # Stable sort: events with equal times keep their file order; a session's events are contiguous.
    events = events.sort_values([sk, tk], kind="stable")
    session_of, session_ids = pd.factorize(events[sk], sort=False)
    n_sessions = len(session_ids)
    # The items the engine ranks: with item attributes the catalogue's cold items are known
    # clicks and recommendable (their indices come after the training items').
    item_map = catalogue_of(model)
    # A model with click context reads the known clicks' times (their context: docs/attributes.md).
    items, offsets, n_unknown, times = index_sessions(item_map, events[ik], session_of, n_sessions,
                                                      events[tk] if model.click_context else None)
    if n_unknown.any():
        log.warning("%d unknown item id(s) skipped in %d session(s)", int(n_unknown.sum()), int((n_unknown > 0).sum()))
    del events, session_of
    item_ids = item_map.ids
    counts = {"rows": 0, "fallback": 0}

    def frames() -> Iterator[pd.DataFrame]:
        for chunk in model.engine().recommend(items, offsets, args.k, exclude_seen=args.exclude_seen, times=times):
            answered = chunk.indices >= 0
            per_row = answered.sum(axis=1)
            counts["rows"] += int(per_row.sum())
            counts["fallback"] += int(chunk.fallback.sum())
            rows = np.arange(chunk.start, chunk.start + len(per_row))
            yield pd.DataFrame({
                sk: np.repeat(session_ids[rows], per_row),
                "Rank": (np.cumsum(answered, axis=1))[answered],
                ik: item_ids[chunk.indices[answered]],
                # Fallback rows have no model score: NaN, written as an empty field (a null in Parquet).
                "Score": chunk.scores[answered].astype(np.float64),
                "Fallback": np.repeat(chunk.fallback, per_row),
            })

    start = time.perf_counter()
    write_event_chunks(frames(), None if to_stdout else args.output, force=args.force)
    if counts["fallback"]:
        log.warning("%d session(s) had no item known to the model and got the most popular items "
                    "(Fallback=True)", counts["fallback"])
    log.info("Wrote %d recommendations for %d sessions to %s (%.2fs)",
             counts["rows"], n_sessions, "standard output" if to_stdout else args.output, time.perf_counter() - start)
    return EXIT_OK
