"""GRU4Rec: session-based recommendation with recurrent neural networks (PyTorch).

Public API (imported lazily so that `import gru4rec` stays light):
    GRU4Rec      the recommender: fit / recommend / save / load
    Config       every hyperparameter, parsed and validated
    evaluate     full-catalogue next-item evaluation
    load         load a saved model file
"""
from __future__ import annotations

from typing import Any

from gru4rec import log as log  # installs the `gru4rec` logger's default handler (gru4rec/log.py)

__version__ = "0.1.0"

_LAZY = {
    "GRU4Rec": ("gru4rec.recommender", "GRU4Rec"),
    "EpochInfo": ("gru4rec.fitting", "EpochInfo"),
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
