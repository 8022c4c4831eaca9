"""RetailRocket e-commerce data set (docs/datasets.md).

Raw file (comma-separated, header): `events.csv` with columns timestamp (epoch ms), visitorid,
event (view / addtocart / transaction), itemid, transactionid. Only `view` events; sessions
per visitor with a 1 hour gap. Time in milliseconds. Test window: the last 7 days before the
fixed boundary T = 1442545200000 (2015-09-18 03:00:00 UTC).
"""
from __future__ import annotations

from pathlib import Path

from gru4rec.datasets.pipeline import DatasetInfo
from gru4rec.datasets.progress import Progress, chunk_progress
from gru4rec.datasets.protocol import Protocol
from gru4rec.datasets.rawfiles import column_int64, iter_csv_chunks, resolve_header
from gru4rec.datasets.sessionise import Accumulator, ItemCoder, RawEvents

NAME = "retailrocket"
BOUNDARY = 1_442_545_200_000  # ms
INFO = DatasetInfo(
    name=NAME,
    title="RetailRocket recommender system data set (events)",
    raw_files=("events.csv",),
    download="Kaggle 'Retailrocket recommender system dataset': "
    "https://www.kaggle.com/datasets/retailrocket/ecommerce-dataset",
    protocol=Protocol(days=7.0, ticks_per_second=1000, session_gap_s=3600, boundary=BOUNDARY),
    min_files=1,
    max_files=1,
)

REQUIRED = {
    "timestamp": ("timestamp",),
    "visitorid": ("visitorid",),
    "event": ("event",),
    "itemid": ("itemid",),
}


def read_raw(paths: list[Path], chunksize: int, prog: Progress) -> RawEvents:
    """Read `events.csv`, keeping view events: key = visitorid, time in ms."""
    coder = ItemCoder()
    acc = Accumulator()
    for path in paths:
        cols = resolve_header(path, ",", REQUIRED, NAME)
        rename = {v: k for k, v in cols.items()}
        for chunk in iter_csv_chunks(
            path, sep=",", usecols=list(cols.values()), dtype={cols["event"]: str}, chunksize=chunksize
        ):
            acc.n_rows += len(chunk)
            chunk = chunk.rename(columns=rename)
            view = chunk[chunk["event"] == "view"]
            visitor = column_int64(view["visitorid"], path, cols["visitorid"], 1, "an integer visitor id")
            item = column_int64(view["itemid"], path, cols["itemid"], 1, "an integer item id")
            tm = column_int64(view["timestamp"], path, cols["timestamp"], 1, "integer epoch milliseconds")
            acc.add(visitor, coder.encode(item), tm)
            chunk_progress(prog, path, acc.n_rows, acc.n_kept)
    return acc.finish(coder, [str(p) for p in paths])
