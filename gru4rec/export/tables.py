"""Writing exported columns (ids, vectors, scalars) as one ``.parquet`` or ``.npy`` file.

Both formats keep the ids and the vectors of a row together in one file that loads without
pickle or gru4rec:

* **Parquet** (pyarrow): one row per item or session; a vector column is a
  ``fixed_size_list<float32>[L]``; the schema metadata ``gru4rec`` holds the JSON description
  of the columns. ``pyarrow.parquet.read_table(f)["output"].combine_chunks().flatten()
  .to_numpy().reshape(-1, L)`` gives the matrix; pandas and Spark read the file too.
* **NumPy** (``.npy``): one structured array; ``a = np.load(f)``, then ``a["output"]`` is the
  N×L float32 matrix that ``faiss.IndexFlatIP(L).add()`` takes (FAISS copies it to C order;
  ``np.ascontiguousarray`` does that explicitly), ``a["item_id"]`` the ids (int64, or fixed-width
  unicode for string ids), ``a["bias"]`` the biases. ``.npy`` has no room for a description;
  the field names say what is what.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from gru4rec.errors import Gru4RecError
from gru4rec.export.common import check_target, write_atomically

__all__ = ["PARQUET_HINT", "TABLE_SUFFIXES", "table_format", "write_table"]

PARQUET_HINT = "writing Parquet needs pyarrow: pip install 'gru4rec[parquet]' (or write .npy)"
TABLE_SUFFIXES = (".parquet", ".npy")


def table_format(path: str | os.PathLike[str], what: str) -> str:
    """``'parquet'`` or ``'npy'`` by the file name's extension; a Gru4RecError naming the file otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        shown = repr(suffix) if suffix else "no extension"
        raise Gru4RecError(f"{what} {path}: unknown extension ({shown}); use .parquet or .npy")
    return suffix[1:]


def _column_values(values: np.ndarray) -> np.ndarray:
    """A 1-D column as a NumPy array without objects: numbers keep their type, anything else
    (string ids) becomes fixed-width unicode."""
    values = np.asarray(values)
    if values.dtype.kind in "biuf":
        return values
    return values.astype(str)


def _as_structured(columns: dict[str, np.ndarray]) -> np.ndarray:
    n = len(next(iter(columns.values())))
    fields: list[tuple[Any, ...]] = []
    plain = {}
    for name, col in columns.items():
        if col.ndim == 2:
            fields.append((name, "<f4", (col.shape[1],)))
            plain[name] = col
        else:
            plain[name] = _column_values(col)
            fields.append((name, plain[name].dtype))
    out = np.empty(n, dtype=fields)
    for name, col in plain.items():
        out[name] = col
    return out


def _as_arrow(columns: dict[str, np.ndarray], description: dict[str, Any]) -> Any:
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise ImportError(PARQUET_HINT) from exc
    arrays = {}
    for name, col in columns.items():
        if col.ndim == 2:
            flat = pa.array(np.ascontiguousarray(col, dtype=np.float32).reshape(-1))
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat, col.shape[1])
        else:
            arrays[name] = pa.array(_column_values(col))
    table = pa.table(arrays)
    return table.replace_schema_metadata({b"gru4rec": json.dumps(description).encode("utf-8")})


def write_table(
    path: str | os.PathLike[str],
    columns: dict[str, np.ndarray],
    description: dict[str, Any],
    *,
    what: str = "output file",
    overwrite: bool = False,
) -> Path:
    """Write equally long ``columns`` (1-D values, or 2-D float vectors) to ``path`` atomically,
    as Parquet or ``.npy`` by its extension (see the module docstring for the layouts).

    Raises Gru4RecError naming ``path`` (and ``what`` it is) for an unknown extension, an
    existing file without ``overwrite``, a directory, a missing or unwritable folder; ImportError
    with the install hint when Parquet is asked for without pyarrow.
    """
    kind = table_format(path, what)
    target = check_target(path, what, overwrite=overwrite)
    lengths = {name: len(col) for name, col in columns.items()}
    if not columns or len(set(lengths.values())) != 1:
        raise ValueError(f"columns must be non-empty and equally long, got {lengths}")
    if kind == "parquet":
        table = _as_arrow(columns, description)  # first: it says how to install pyarrow
        import pyarrow.parquet as pq

        return write_atomically(target, lambda tmp: pq.write_table(table, tmp), what=what, overwrite=overwrite)
    array = _as_structured(columns)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.save would append .npy to the temporary name
            np.save(fh, array, allow_pickle=False)

    return write_atomically(target, write, what=what, overwrite=overwrite)
