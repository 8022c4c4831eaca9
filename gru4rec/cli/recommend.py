"""``gru4rec recommend``: top-k next items for every session of an event file, written to a file."""
from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

from gru4rec.cli.common import (
    EXIT_OK,
    add_column_keys,
    add_device,
    add_force,
    add_threads,
    check_readable,
    check_writable_target,
    load_model,
    positive_int,
    uses_threads,
)

__all__ = ["DESCRIPTION", "add_arguments", "run"]

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Top-k next items for every session in SESSIONS, given all its events.\n\n"
    "Output columns: the session column, Rank (1..k), the item column, Score\n"
    "(the model's raw score) and Fallback. Items the model does not know are\n"
    "skipped with a counted warning; a session with no known item gets the\n"
    "most popular items, with Fallback = True and an empty Score (no model\n"
    "score exists for them). -o - writes TSV to standard output."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec recommend``."""
    parser.add_argument("model", metavar="MODEL", help="a model file saved by train --save")
    parser.add_argument("-i", "--input", metavar="SESSIONS", required=True,
                        help="events of the sessions to recommend for (session, item, time "
                             "columns; each session's items in time order)")
    parser.add_argument("-o", "--output", metavar="RECS", required=True,
                        help="where to write the recommendations: .tsv/.csv (optionally .gz) or "
                             ".parquet, or - for TSV on standard output; one row per session and rank")
    parser.add_argument("-k", "--k", type=positive_int, default=20, help="items per session (default: 20)")
    parser.add_argument("--exclude-seen", action="store_true",
                        help="never recommend an item the session already contains")
    add_column_keys(parser, default_from="the model's")
    add_device(parser)
    add_threads(parser)
    add_force(parser)


@uses_threads
def run(args: argparse.Namespace) -> int:
    """Run ``gru4rec recommend``: one row per session and rank in ``--output``."""
    import numpy as np
    import pandas as pd

    from gru4rec.data import read_events, write_events

    to_stdout = args.output == "-"
    if not to_stdout:
        check_writable_target(args.output, args.force, "output file")
    check_readable([args.input], "input file")
    model = load_model(args.model, args.device)
    config = model.config
    sk = args.session_key or config.session_key
    ik = args.item_key or config.item_key
    tk = args.time_key or config.time_key
    events = read_events(args.input, session_key=sk, item_key=ik, time_key=tk)
    # Stable sort: events with equal times keep their file order.
    events = events.sort_values([sk, tk], kind="stable")
    sessions = events.groupby(sk, sort=False)[ik].agg(list)
    start = time.perf_counter()
    # The API warns its caller about skipped unknown items; here the user reads them as warnings.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = model.recommend_batch(sessions.tolist(), k=args.k, exclude_seen=args.exclude_seen)
    for w in caught:
        log.warning("%s", w.message)
    elapsed = time.perf_counter() - start
    counts = [len(r.item_ids) for r in recs]
    recs_frame = pd.DataFrame({
        sk: np.repeat(sessions.index.to_numpy(), counts),
        "Rank": np.concatenate([np.arange(1, n + 1) for n in counts]) if counts else np.zeros(0, np.int64),
        ik: np.concatenate([np.asarray(r.item_ids) for r in recs]) if recs else [],
        # Fallback rows have no model score: NaN, written as an empty field (a null in Parquet).
        "Score": np.concatenate([np.asarray(r.scores, dtype=np.float64) for r in recs]) if recs else [],
        "Fallback": np.repeat([r.fallback for r in recs], counts).astype(bool),
    })
    n_fallback = sum(r.fallback for r in recs)
    if n_fallback:
        log.warning("%d session(s) had no item known to the model and got the most popular items "
                    "(Fallback=True)", n_fallback)
    if to_stdout:
        recs_frame.to_csv(sys.stdout, sep="\t", index=False)
        sys.stdout.flush()
    else:
        write_events(recs_frame, args.output, force=args.force)
    log.info("Wrote %d recommendations for %d sessions to %s (%.2fs)",
             len(recs_frame), len(sessions), "standard output" if to_stdout else args.output, elapsed)
    return EXIT_OK
