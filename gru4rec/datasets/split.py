"""Time-based split of a user's own event log into the four files (the public data sets' rule).

Test = the sessions that start in the last `days` days (T = the latest event, or a fixed
`boundary`); train_full = the events before T - days, without sessions left shorter than
`min_session_length`. The same rule on train_full with `valid_days` gives train_tr /
train_valid. Before the split, optionally drop consecutive repeats of an item within a session
(`dedup`) and iteratively drop sessions shorter than `min_session_length` and items with fewer
than `min_item_support` events until nothing changes (pass 1 to disable either).

Events with equal timestamps in a session keep their input order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from gru4rec.datasets.outputs import PathLike, prepare_out_dir, write_outputs
from gru4rec.datasets.progress import Progress
from gru4rec.datasets.protocol import Protocol, run_protocol
from gru4rec.datasets.rawfiles import first_line
from gru4rec.datasets.sessionise import Events
from gru4rec.errors import ConfigError, DataError, Gru4RecError

TIME_UNITS: dict[str, int] = {"s": 1, "ms": 1000}


def _read_table(path: Path, columns: list[str]) -> pd.DataFrame:
    """Read a TSV/CSV (separator from the header line) or Parquet event file."""
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a file")
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow  # noqa: F401
        except ImportError as exc:  # pragma: no cover
            raise Gru4RecError("reading Parquet needs pyarrow: pip install 'gru4rec[parquet]'") from exc
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises many types for a broken file
            raise DataError(f"{path}: cannot read the Parquet file ({exc})") from exc
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(map(repr, missing))} (has {list(df.columns)})")
        return df[columns]
    header = first_line(path)
    counts = {sep: len(header.split(sep)) for sep in ("\t", ",", ";")}
    sep = max(counts, key=lambda s: counts[s])
    names = [n.strip() for n in header.split(sep)]
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(map(repr, missing))} (header split by {sep!r}: {names})"
        )
    try:
        return pd.read_csv(path, sep=sep, usecols=columns, compression="infer")
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{path}: cannot parse the file: {str(exc).strip().splitlines()[-1]}") from exc


def _time_ticks(col: pd.Series, unit: str, source: str, name: str) -> np.ndarray:
    """Numeric times as they are; datetimes as int64 ticks of `unit` since the epoch."""
    if pd.api.types.is_datetime64_any_dtype(col):
        if col.isna().any():
            raise DataError(f"{source}: column {name!r} has missing times (row {int(col.isna().to_numpy().argmax())})")
        ts = col if getattr(col.dt, "tz", None) is not None else col.dt.tz_localize("UTC")
        return ((ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, unit)).to_numpy(dtype=np.int64)
    if col.dtype.kind in "iu":
        return col.to_numpy(dtype=np.int64)
    if col.dtype.kind == "f":
        values = col.to_numpy(dtype=np.float64)
    else:
        num = pd.to_numeric(col, errors="coerce")
        bad = num.isna() & col.notna()
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise DataError(
                f"{source}: column {name!r} must be numeric time in {unit} (row {row}: {col.iloc[row]!r})"
            )
        values = num.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        row = int((~np.isfinite(values)).argmax())
        raise DataError(f"{source}: column {name!r} has a missing or infinite time (row {row})")
    return values


def split_events(
    data: pd.DataFrame | PathLike,
    out_dir: PathLike,
    *,
    days: float = 1.0,
    valid_days: float | None = None,
    time_unit: Literal["s", "ms"] = "s",
    min_item_support: int = 5,
    min_session_length: int = 2,
    dedup: bool = False,
    boundary: float | None = None,
    session_key: str = "SessionId",
    item_key: str = "ItemId",
    time_key: str = "Time",
    fmt: str = "tsv",
    force: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Split an event log (DataFrame, or TSV/CSV/Parquet path) into train_full, test, train_tr
    and train_valid under `out_dir`; returns the stats table (as `preprocess`).

    days / valid_days: test and validation windows (valid_days defaults to days).
    time_unit: the unit of numeric times ('s' or 'ms'); datetime columns are converted to it.
    boundary: a fixed end time T in that unit (default: the latest event after filtering).
    progress: log one line per step (INFO records; see gru4rec.datasets.progress).
    The files keep the given column names' values under SessionId, ItemId, Time.
    Raises DataError for bad data or an empty split, ConfigError for bad options.
    """
    if time_unit not in TIME_UNITS:
        raise ConfigError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
    protocol = Protocol(
        days=days,
        valid_days=valid_days,
        ticks_per_second=TIME_UNITS[time_unit],
        boundary=boundary,
        dedup=bool(dedup),
        min_item_support=min_item_support,
        min_session_length=min_session_length,
    )
    protocol.validate()
    prog = Progress("split", progress)
    paths = prepare_out_dir(out_dir, fmt, force)
    keys = [session_key, item_key, time_key]
    if isinstance(data, pd.DataFrame):
        source = "input DataFrame"
        missing = [c for c in keys if c not in data.columns]
        if missing:
            raise DataError(f"{source}: missing column(s) {', '.join(map(repr, missing))} (has {list(data.columns)})")
        df = data[keys]
    else:
        source = str(data)
        df = _read_table(Path(data), keys)
    if len(df) == 0:
        raise DataError(f"{source}: no events")
    for key in (session_key, item_key):
        if df[key].isna().any():
            row = int(df[key].isna().to_numpy().argmax())
            raise DataError(f"{source}: column {key!r} has a missing id (row {row})")
    tm = _time_ticks(df[time_key], time_unit, source, time_key)
    # sessions in id order; items in order of first appearance
    session, session_ids = pd.factorize(df[session_key], sort=True)
    item, item_ids = pd.factorize(df[item_key], sort=False)
    order = np.lexsort((tm, session))  # stable: equal times keep the input order
    prog(f"{len(df):,} events, {len(session_ids):,} sessions, {len(item_ids):,} items")
    try:
        ev, masks = run_protocol(
            Events(
                session=session[order].astype(np.int64),
                item=item[order].astype(np.int32),
                time=tm[order],
                session_ids=np.asarray(session_ids),
                item_ids=np.asarray(item_ids),
            ),
            protocol,
            prog,
        )
    except DataError as exc:
        raise DataError(f"{source}: {exc}") from None
    return write_outputs(ev, masks, paths, protocol, fmt, prog)
