"""rsc15: the YOOCHOOSE clicks under the 2016/2018 GRU4Rec papers' protocol (docs/datasets.md).

Only `yoochoose-clicks.dat` (header-less `SessionId,Timestamp,ItemId,Category`). No
de-duplication; one filtering pass: sessions of length 1 dropped, then items with support < 5,
then sessions shorter than 2. Test = whole sessions whose LAST event is within the final day
(T = the latest click); test events whose item is not in train are removed, then test sessions
shorter than 2. train_tr / train_valid: the same on train_full with its own latest click as T.
Time is written in float seconds (millisecond precision).
"""
from __future__ import annotations

from pathlib import Path

from gru4rec.datasets.pipeline import DatasetInfo
from gru4rec.datasets.progress import Progress
from gru4rec.datasets.protocol import Protocol
from gru4rec.datasets.sessionise import RawEvents
from gru4rec.datasets.yoochoose import read_clicks

NAME = "rsc15"
INFO = DatasetInfo(
    name=NAME,
    title="YOOCHOOSE clicks, GRU4Rec 2016/2018 papers' protocol",
    raw_files=("yoochoose-clicks.dat",),
    download="RecSys Challenge 2015 data set (YOOCHOOSE), e.g. https://www.kaggle.com/datasets/chadgostopp/recsys-challenge-2015",
    protocol=Protocol(kind="rsc15", days=1.0, ticks_per_second=1000, output_time_divisor=1000, dedup=False),
    min_files=1,
    max_files=1,
)


def read_raw(paths: list[Path], chunksize: int, prog: Progress) -> RawEvents:
    """Read `yoochoose-clicks.dat`."""
    return read_clicks(paths, chunksize, prog, NAME)
