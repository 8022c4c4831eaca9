"""Choosing repeat-aware scoring's coefficients on validation data (:mod:`gru4rec.inference.repeat`).

It evaluates, so it sits above both the inference layer and the evaluator (as ``validation.py``
does): nothing in the library imports it; ``gru4rec evaluate --fit-repeat`` and
``benchmarks/repeat_boost.py`` do.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gru4rec.evaluation import evaluate
from gru4rec.evaluation.metrics import TieMode
from gru4rec.inference.repeat import RepeatBoost
from gru4rec.validation import parse_metric

__all__ = ["fit_repeat_boost"]


def fit_repeat_boost(
    model: Any,
    valid: Any,
    *,
    weights: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
    decays: Sequence[float] = (0.3, 0.6, 0.9, 1.0),
    metric: str = "mrr@20",
    mode: TieMode = "conservative",
    batch_size: int = 512,
) -> tuple[RepeatBoost, list[dict[str, float]]]:
    """The grid point of (``weights`` × ``decays``) with the best ``metric`` on ``valid``, and
    every point's result (``weight``, ``decay``, the metric). The model's config is restored
    afterwards; set the winner with ``model.config = model.config.replace(repeat_weight=...,
    repeat_decay=...)`` (or ``-ps repeat_weight=...`` on the command line)."""
    chosen = parse_metric(metric)
    name, cutoff = chosen.name, chosen.cutoff
    original = model.config
    table: list[dict[str, float]] = []
    try:
        points = [(0.0, 1.0)] + [(w, d) for w in weights if w > 0 for d in decays]
        for w, d in points:
            model.config = original.replace(repeat_weight=w, repeat_decay=d)
            result = evaluate(model, valid, cutoffs=(cutoff,), mode=mode, batch_size=batch_size, beyond_accuracy=False)
            table.append({"weight": w, "decay": d, metric: float(getattr(result, name)[cutoff])})
    finally:
        model.config = original
    best = max(table, key=lambda row: (row[metric], -row["weight"]))
    return RepeatBoost(best["weight"], best["decay"]), table
