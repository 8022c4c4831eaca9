"""Coveo SIGIR eCom 2021 Data Challenge browsing events (docs/datasets.md).

Raw file (comma-separated, header): `browsing_train.csv` with columns session_id_hash,
event_type, product_action, product_sku_hash, server_timestamp_epoch_ms, hashed_url (an
earlier release spells the item column `product_skus_hash`; both are accepted). Only
`product_action == detail` events; sessions = the given session hash, cut again after a
1 hour gap. Time in milliseconds. Test window: the last day before the latest event.

Detail events without a product hash (none are expected) are skipped and counted in the
progress output. Session hashes are reduced to 64-bit hashes while reading (bounded memory);
the written SessionId is a new integer id.
"""
from __future__ import annotations

from pathlib import Path

from gru4rec.datasets.pipeline import DatasetInfo
from gru4rec.datasets.progress import Progress, chunk_progress
from gru4rec.datasets.protocol import Protocol
from gru4rec.datasets.rawfiles import column_int64, iter_csv_chunks, resolve_header
from gru4rec.datasets.sessionise import Accumulator, ItemCoder, RawEvents, hash_keys
from gru4rec.errors import DataError

NAME = "coveo"
INFO = DatasetInfo(
    name=NAME,
    title="Coveo SIGIR eCom 2021 Data Challenge, browsing events",
    raw_files=("browsing_train.csv",),
    download="Coveo SIGIR eCom 2021 Data Challenge data set (free for research after sign-up): "
    "https://www.coveo.com/en/ailabs/sigir-ecom-data-challenge (see github.com/coveooss/SIGIR-ecom-data-challenge)",
    protocol=Protocol(days=1.0, ticks_per_second=1000, session_gap_s=3600),
    min_files=1,
    max_files=1,
)

REQUIRED = {
    "session": ("session_id_hash",),
    "action": ("product_action",),
    "item": ("product_sku_hash", "product_skus_hash"),
    "time": ("server_timestamp_epoch_ms",),
}


def read_raw(paths: list[Path], chunksize: int, prog: Progress) -> RawEvents:
    """Read `browsing_train.csv`, keeping detail events: key = hashed session hash, time in ms."""
    coder = ItemCoder()
    acc = Accumulator()
    skipped = 0
    for path in paths:
        cols = resolve_header(path, ",", REQUIRED, NAME)
        rename = {v: k for k, v in cols.items()}
        for chunk in iter_csv_chunks(
            path,
            sep=",",
            usecols=list(cols.values()),
            dtype={cols["session"]: str, cols["action"]: str, cols["item"]: str},
            chunksize=chunksize,
        ):
            acc.n_rows += len(chunk)
            chunk = chunk.rename(columns=rename)
            detail = chunk[chunk["action"] == "detail"]
            no_item = detail["item"].isna() | (detail["item"] == "")
            if no_item.any():
                skipped += int(no_item.sum())
                detail = detail[~no_item]
            no_session = detail["session"].isna()
            if no_session.any():
                row = int(no_session.idxmax())
                raise DataError(f"{path}, line {row + 2}: column {cols['session']!r} is empty")
            tm = column_int64(detail["time"], path, cols["time"], 1, "integer epoch milliseconds")
            acc.add(hash_keys(detail["session"]), coder.encode(detail["item"]), tm)
            chunk_progress(prog, path, acc.n_rows, acc.n_kept)
    if skipped:
        prog(f"skipped {skipped:,} detail events without a product hash")
    raw = acc.finish(coder, [str(p) for p in paths])
    raw.notes.append(f"skipped {skipped} detail events without a product hash")
    return raw
