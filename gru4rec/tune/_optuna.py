"""Optuna, the optional dependency of the search: imported on first use, with an install hint.

Every module of :mod:`gru4rec.tune` imports Optuna through :func:`import_optuna` inside the
functions that need it, so that ``import gru4rec.tune`` works (and ``gru4rec --help`` lists the
command) without Optuna installed.
"""
from __future__ import annotations

from typing import Any

from gru4rec.errors import Gru4RecError

__all__ = ["OPTUNA_HINT", "import_optuna"]

OPTUNA_HINT = "hyperparameter optimisation needs optuna: pip install 'gru4rec[tune]' (or pip install optuna)"


def import_optuna() -> Any:
    """The ``optuna`` module; raises :class:`~gru4rec.errors.Gru4RecError` saying how to install
    it when it is missing."""
    try:
        import optuna
    except ImportError as exc:  # optional dependency
        raise Gru4RecError(OPTUNA_HINT) from exc
    return optuna
