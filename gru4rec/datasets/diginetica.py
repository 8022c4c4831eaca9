"""DIGINETICA (CIKM Cup 2016 Personalized E-Commerce Search Challenge) item views (docs/datasets.md).

Raw file (semicolon-separated, header): `train-item-views.csv` with columns
sessionId;userId;itemId;timeframe;eventdate (some copies spell them session_id;user_id;item_id;
the header match ignores case and underscores). eventdate is the session's date (`2016-05-09`),
timeframe the milliseconds since the session's first query. Time = the session's (earliest)
eventdate at 00:00 UTC in ms + timeframe. All events are kept; sessions are given. Test window:
the last 7 days before the latest event.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gru4rec.datasets.pipeline import DatasetInfo
from gru4rec.datasets.progress import Progress, chunk_progress
from gru4rec.datasets.protocol import Protocol
from gru4rec.datasets.rawfiles import column_int64, column_timestamp, iter_csv_chunks, resolve_header
from gru4rec.datasets.sessionise import Accumulator, ItemCoder, RawEvents

NAME = "diginetica"
INFO = DatasetInfo(
    name=NAME,
    title="DIGINETICA item views (CIKM Cup 2016, track 2)",
    raw_files=("train-item-views.csv",),
    download="CIKM Cup 2016 Track 2 (DIGINETICA) data: https://competitions.codalab.org/competitions/11161 "
    "(dataset-train-diginetica.zip)",
    protocol=Protocol(days=7.0, ticks_per_second=1000),
    min_files=1,
    max_files=1,
)

REQUIRED = {
    "session": ("sessionId", "session_id"),
    "item": ("itemId", "item_id"),
    "timeframe": ("timeframe",),
    "eventdate": ("eventdate", "event_date"),
}
DATE_EXAMPLE = "2016-05-09"


def read_raw(paths: list[Path], chunksize: int, prog: Progress) -> RawEvents:
    """Read `train-item-views.csv`: key = sessionId, time = session date (ms) + timeframe."""
    coder = ItemCoder()
    acc = Accumulator()  # time: the row's eventdate (ms) until every chunk is read
    frames: list[np.ndarray] = []
    for path in paths:
        cols = resolve_header(path, ";", REQUIRED, NAME)
        rename = {v: k for k, v in cols.items()}
        for chunk in iter_csv_chunks(
            path, sep=";", usecols=list(cols.values()), dtype={cols["eventdate"]: str}, chunksize=chunksize
        ):
            acc.n_rows += len(chunk)
            chunk = chunk.rename(columns=rename)
            session = column_int64(chunk["session"], path, cols["session"], 1, "an integer session id")
            item = coder.encode(column_int64(chunk["item"], path, cols["item"], 1, "an integer item id"))
            frames.append(column_int64(chunk["timeframe"], path, cols["timeframe"], 1, "integer milliseconds"))
            date = column_timestamp(chunk["eventdate"], path, cols["eventdate"], 1, unit="ms", example=DATE_EXAMPLE)
            acc.add(session, item, date)
            chunk_progress(prog, path, acc.n_rows, acc.n_kept)
    raw = acc.finish(coder, [str(p) for p in paths])
    # a session's events normally share one date; should they not, the earliest date anchors
    # all of them, so that timeframe keeps ordering the session's events
    session_date = pd.Series(raw.time).groupby(raw.key).transform("min").to_numpy(dtype=np.int64)
    raw.time = session_date + (np.concatenate(frames) if frames else np.empty(0, np.int64))
    # Accumulator keeps 32-bit keys; the written SessionId stays int64 (the Parquet schema)
    raw.key = raw.key.astype(np.int64, copy=False)
    return raw
