"""REES46 multi-category e-commerce store, October + November 2019 (docs/datasets.md).

Raw files (comma-separated, header): `2019-Oct.csv`, `2019-Nov.csv` with columns event_time
(`2019-10-01 00:00:00 UTC`), event_type, product_id, category_id, category_code, brand, price,
user_id, user_session. Only `view` events; the given `user_session` is not used: sessions are
recomputed per user with a 1 hour gap. Time in seconds. Test window: the last day before the
fixed boundary T = 2019-12-01 00:00:00 UTC.
"""
from __future__ import annotations

from pathlib import Path

from gru4rec.datasets.pipeline import DatasetInfo
from gru4rec.datasets.progress import Progress, chunk_progress
from gru4rec.datasets.protocol import Protocol
from gru4rec.datasets.rawfiles import column_int64, column_timestamp, iter_csv_chunks, resolve_header
from gru4rec.datasets.sessionise import Accumulator, ItemCoder, RawEvents

NAME = "rees46"
BOUNDARY = 1_575_158_400  # 2019-12-01 00:00:00 UTC, in seconds
INFO = DatasetInfo(
    name=NAME,
    title="REES46 eCommerce behavior data from multi category store (Oct + Nov 2019)",
    raw_files=("2019-Oct.csv", "2019-Nov.csv"),
    download="Kaggle 'eCommerce behavior data from multi category store' (REES46): "
    "https://www.kaggle.com/datasets/mkechinov/ecommerce-behavior-data-from-multi-category-store",
    protocol=Protocol(days=1.0, ticks_per_second=1, session_gap_s=3600, boundary=BOUNDARY),
    min_files=1,
    max_files=None,
)

REQUIRED = {
    "event_time": ("event_time",),
    "event_type": ("event_type",),
    "product_id": ("product_id",),
    "user_id": ("user_id",),
}
TIMESTAMP_EXAMPLE = "2019-10-01 00:00:00 UTC"


def read_raw(paths: list[Path], chunksize: int, prog: Progress) -> RawEvents:
    """Read the monthly files, keeping view events: key = user_id, time in seconds."""
    coder = ItemCoder()
    acc = Accumulator()
    for path in paths:
        cols = resolve_header(path, ",", REQUIRED, NAME)
        rename = {v: k for k, v in cols.items()}
        for chunk in iter_csv_chunks(
            path,
            sep=",",
            usecols=list(cols.values()),
            dtype={cols["event_time"]: str, cols["event_type"]: str},
            chunksize=chunksize,
        ):
            acc.n_rows += len(chunk)
            chunk = chunk.rename(columns=rename)
            # filter first: most of the cost is parsing timestamps, and views are ~94 % of rows
            view = chunk[chunk["event_type"] == "view"]
            user = column_int64(view["user_id"], path, cols["user_id"], 1, "an integer user id")
            item = column_int64(view["product_id"], path, cols["product_id"], 1, "an integer product id")
            tm = column_timestamp(
                view["event_time"].str.removesuffix(" UTC"), path, cols["event_time"], 1,
                unit="s", example=TIMESTAMP_EXAMPLE,
            )
            acc.add(user, coder.encode(item), tm)
            chunk_progress(prog, path, acc.n_rows, acc.n_kept)
    return acc.finish(coder, [str(p) for p in paths])
