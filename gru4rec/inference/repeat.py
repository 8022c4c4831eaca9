"""Repeat-aware scoring: an option (off by default) that boosts the items a session already holds.

GRU4Rec must learn from its hidden state alone that people come back to what they clicked; in
some data sets a large share of next clicks are such repeats (Tmall: ~43 % of the validation
targets, DIGINETICA: ~20 %; docs/results.md). The boost adds to the raw score of every item the
session clicked before

    boost_i = weight · σ · Σ_{j : x_j = i} decay^(n − j)

where x_1 … x_n are the session's clicks (oldest first), so the last click counts 1, the one
before ``decay`` and so on — the sum grows with how often and how recently the item occurred —
and σ is the standard deviation of the row's scores over all items: the model's own score
scale, so that one ``weight`` means the same for every model and loss. ``weight = 0`` (the
default) is faithful GRU4Rec, bit for bit: no boost is computed at all.

The two coefficients are chosen on validation data (:func:`gru4rec.repeat_fit.fit_repeat_boost`:
a small grid, each point one evaluation). The boost is part of the inference path — ``recommend*``, the
evaluator, ``run.py``/``gru4rec evaluate``, ``paropt`` (as ``repeat_weight``/``repeat_decay``,
searched like any parameter) and ``serve`` — through the model's config fields
``repeat_weight`` and ``repeat_decay``. The ONNX export's one-click step holds no session history,
so it has no boost.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["RepeatBoost"]


@dataclass(frozen=True)
class RepeatBoost:
    """The boost's two coefficients (see the module); ``weight = 0`` is no boost."""

    weight: float = 0.0
    decay: float = 1.0

    def __post_init__(self) -> None:
        if not np.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"repeat_weight must be a number >= 0, got {self.weight!r}")
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"repeat_decay must be in [0, 1], got {self.decay!r}")

    @classmethod
    def of(cls, model: Any) -> RepeatBoost:
        """The boost a model's config asks for (none for a model without the fields: a baseline)."""
        config = getattr(model, "config", None)
        return cls(float(getattr(config, "repeat_weight", 0.0)), float(getattr(config, "repeat_decay", 1.0)))

    @property
    def active(self) -> bool:
        return self.weight > 0.0

    def scale(self, scores: Tensor) -> Tensor:
        """``weight · σ`` of each row of ``scores`` (B×1): the boost of one click of age 0."""
        return self.weight * scores.std(dim=1, keepdim=True).nan_to_num_(0.0)

    def apply(self, scores: Tensor, rows: Tensor, items: Tensor, ages: Tensor) -> Tensor:
        """Add the boost to ``scores`` (B×N) in place: click c of the batch is item ``items[c]``
        of row ``rows[c]``, ``ages[c]`` clicks before the row's last one (0 for the last).
        Returns ``scores``."""
        if not self.active or rows.numel() == 0:
            return scores
        weights = self.scale(scores)[:, 0].index_select(0, rows) * torch.pow(self.decay, ages.to(scores.dtype))
        return scores.index_put_((rows, items), weights.to(scores.dtype), accumulate=True)

    def apply_to_histories(self, scores: Tensor, histories: Sequence[np.ndarray]) -> Tensor:
        """:meth:`apply` for rows whose clicks are given as arrays of item indices, oldest first."""
        if not self.active:
            return scores
        lengths = np.array([len(h) for h in histories], dtype=np.int64)
        if not lengths.sum():
            return scores
        rows = np.repeat(np.arange(len(histories)), lengths)
        ages = np.repeat(np.cumsum(lengths), lengths) - np.arange(lengths.sum()) - 1
        items = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories])
        device = scores.device
        return self.apply(scores, torch.from_numpy(rows).to(device), torch.from_numpy(items).to(device),
                          torch.from_numpy(ages).to(device))
