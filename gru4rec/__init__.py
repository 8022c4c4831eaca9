"""GRU4Rec: session-based recommendation with recurrent neural networks (PyTorch).

Public API (imported lazily so that `import gru4rec` stays light):
    GRU4Rec      the recommender: fit / recommend / save / load
    Config       every hyperparameter, parsed and validated
    evaluate     full-catalogue next-item evaluation
    load         load a saved model file
"""
from __future__ import annotations

from typing import Any

from gru4rec.threads import prefer_passive_waits

# Before anything loads torch (and its OpenMP runtime): idle threads sleep instead of spinning,
# so the default thread count does not collapse on a busy machine (gru4rec/threads.py).
prefer_passive_waits()

# Installs the `gru4rec` logger's default handler (gru4rec/log.py); after prefer_passive_waits() on purpose.
from gru4rec import log as log  # noqa: E402

__version__ = "0.1.0"

_LAZY = {
    "GRU4Rec": ("gru4rec.recommender", "GRU4Rec"),
    "EpochInfo": ("gru4rec.recommender", "EpochInfo"),
    "Config": ("gru4rec.config", "Config"),
    "evaluate": ("gru4rec.evaluation.evaluator", "evaluate"),
    "EvalResult": ("gru4rec.evaluation.metrics", "EvalResult"),
    "load": ("gru4rec.recommender", "load"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gru4rec' has no attribute {name!r}")
