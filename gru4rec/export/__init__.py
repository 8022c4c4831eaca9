"""Taking a trained GRU4Rec elsewhere: the one-click step as ONNX, item and session embeddings
as Parquet or NumPy files (for FAISS, ScaNN, a notebook).

* :func:`export_onnx` (:mod:`~gru4rec.export.onnx`) — the step with its state in and out, and a
  JSON sidecar with the item ids;
* :func:`item_embeddings`, :func:`session_embeddings` (:mod:`~gru4rec.export.embeddings`) — the
  vectors as columns;
* :func:`write_table` (:mod:`~gru4rec.export.tables`) — those columns as ``.parquet`` or ``.npy``.

Every writer checks its target first (:mod:`~gru4rec.export.common`), writes atomically and
replaces an existing file only with ``overwrite=True`` (``--force``).
"""
from gru4rec.export.embeddings import item_embeddings, session_embeddings
from gru4rec.export.onnx import export_onnx, sidecar_path
from gru4rec.export.tables import write_table

__all__ = ["export_onnx", "item_embeddings", "session_embeddings", "sidecar_path", "write_table"]
