"""Choosing repeat-aware scoring's coefficients on validation data (:mod:`gru4rec.inference.repeat`).

It evaluates, so it sits above both the inference layer and the evaluator (as ``validation.py``
does): nothing in the library imports it; ``gru4rec evaluate --fit-repeat`` and
``benchmarks/repeats/repeat_boost.py`` do. The network runs once over the validation sessions: every
step's scores are ranked under every grid point (:func:`gru4rec.evaluation.evaluate_boosts`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gru4rec.evaluation import evaluate_boosts
from gru4rec.evaluation.metrics import TieMode
from gru4rec.fitting.validation import parse_metric
from gru4rec.inference.repeat import RepeatBoost

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
    """The grid point of (``weights`` × ``decays``, and no boost) with the best ``metric`` on
    ``valid`` (ties: the smaller weight), and every point's result (``weight``, ``decay``, the
    metric) — each equal to an evaluation of the model with that boost. The model is not
    changed; ``model.with_repeat_boost(best.weight, best.decay)`` is the model with the winner
    (``-ps repeat_weight=...,repeat_decay=...`` on the command line)."""
    chosen = parse_metric(metric)
    name, cutoff = chosen.name, chosen.cutoff
    points = [RepeatBoost()] + [RepeatBoost(w, d) for w in weights if w > 0 for d in decays]
    results = evaluate_boosts(model, valid, points, cutoffs=(cutoff,), mode=mode, batch_size=batch_size)
    table = [{"weight": p.weight, "decay": p.decay, metric: float(getattr(r, name)[cutoff])} for p, r in zip(points, results)]
    best = max(table, key=lambda row: (row[metric], -row["weight"]))
    return RepeatBoost(best["weight"], best["decay"]), table
