"""YOOCHOOSE (RecSys Challenge 2015) clicks, the common protocol of docs/datasets.md.

Raw files (no header, comma-separated): `yoochoose-clicks.dat` and `yoochoose-test.dat`, each row
`SessionId,Timestamp,ItemId,Category` with an ISO-8601 UTC timestamp such as
`2014-04-07T10:51:09.277Z`. Both files are used (the challenge's test sessions are ordinary
click sessions); sessions are given; time is written in float seconds (millisecond precision);
the test window is the last day.
"""
from __future__ import annotations

from pathlib import Path

from gru4rec.datasets.pipeline import DatasetInfo
from gru4rec.datasets.progress import Progress, chunk_progress
from gru4rec.datasets.protocol import Protocol
from gru4rec.datasets.rawfiles import check_field_count, column_int64, column_timestamp, iter_csv_chunks
from gru4rec.datasets.sessionise import Accumulator, ItemCoder, RawEvents

NAME = "yoochoose"
INFO = DatasetInfo(
    name=NAME,
    title="YOOCHOOSE clicks (RecSys Challenge 2015), clicks + test files",
    raw_files=("yoochoose-clicks.dat", "yoochoose-test.dat"),
    download="RecSys Challenge 2015 data set (YOOCHOOSE), e.g. https://www.kaggle.com/datasets/chadgostopp/recsys-challenge-2015",
    # sessions given; ms ticks written as float seconds; last day is the test window
    protocol=Protocol(days=1.0, ticks_per_second=1000, output_time_divisor=1000),
    min_files=2,
    max_files=2,
)

RAW_COLUMNS = ["SessionId", "Timestamp", "ItemId", "Category"]
TIMESTAMP_EXAMPLE = "2014-04-07T10:51:09.277Z"


def read_clicks(paths: list[Path], chunksize: int, prog: Progress, dataset: str = NAME) -> RawEvents:
    """Read YOOCHOOSE click files (header-less `SessionId,Timestamp,ItemId,Category`)."""
    coder = ItemCoder()
    acc = Accumulator()
    for path in paths:
        check_field_count(path, ",", len(RAW_COLUMNS), dataset)
        for chunk in iter_csv_chunks(
            path,
            sep=",",
            names=RAW_COLUMNS,
            usecols=RAW_COLUMNS[:3],
            dtype={"Timestamp": str},
            chunksize=chunksize,
        ):
            acc.n_rows += len(chunk)
            session = column_int64(chunk["SessionId"], path, "SessionId", 0, "an integer session id")
            item = column_int64(chunk["ItemId"], path, "ItemId", 0, "an integer item id")
            tm = column_timestamp(
                chunk["Timestamp"], path, "Timestamp", 0, unit="ms", example=TIMESTAMP_EXAMPLE
            )
            acc.add(session, coder.encode(item), tm)
            chunk_progress(prog, path, acc.n_rows, acc.n_kept)
    return acc.finish(coder, [str(p) for p in paths])


def read_raw(paths: list[Path], chunksize: int, prog: Progress) -> RawEvents:
    """Read the clicks and test files."""
    return read_clicks(paths, chunksize, prog, NAME)
