"""Serving GRU4Rec over HTTP: live next-item recommendations with micro-batching.

    gru4rec serve model.pt --port 8000                        # the command
    GRU4REC_MODEL=model.pt uvicorn --factory gru4rec.serve:create_app
    GRU4REC_MODEL=model.pt uvicorn gru4rec.serve:app          # the same, app built on first access

Modules, top to bottom: :mod:`~gru4rec.serve.app` (the FastAPI app and its routes),
:mod:`~gru4rec.serve.middleware` (body limit, request metrics), :mod:`~gru4rec.serve.schema`
(request bodies), :mod:`~gru4rec.serve.batcher` (the micro-batcher and its worker thread),
:mod:`~gru4rec.serve.protocol` (the session protocol: ``seq``, replays, compare-and-set retries),
:mod:`~gru4rec.serve.state` (session stores: memory, Redis), :mod:`~gru4rec.serve.reload` (a new
model on SIGHUP or when the file is replaced, switched between two batches), :mod:`~gru4rec.serve.metrics` (Prometheus),
:mod:`~gru4rec.serve.settings` (flags and ``GRU4REC_*`` variables).

Importing this package imports nothing heavy; ``create_app`` needs the ``serve`` extra
(``pip install 'gru4rec[serve]'``). The model's work — the batched GRU steps, scores,
exclusions and top-k (float32, or int8 candidates with certified bounds) — is
:class:`gru4rec.inference.Engine`'s: this package holds only HTTP, the micro-batcher and the
session stores.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ServeSettings", "app", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from gru4rec.serve.app import create_app

        return create_app
    if name == "app":
        # `uvicorn gru4rec.serve:app`: the app from the GRU4REC_* variables, built once.
        from gru4rec.serve.app import create_app

        value = create_app()
        globals()["app"] = value
        return value
    if name == "ServeSettings":
        from gru4rec.serve.settings import ServeSettings

        return ServeSettings
    raise AttributeError(f"module 'gru4rec.serve' has no attribute {name!r}")
