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

The two coefficients are chosen on validation data (:func:`gru4rec.fitting.repeat_fit.fit_repeat_boost`:
a small grid, every point ranked from the same scores). The boost is part of the inference path —
``recommend*``, the evaluator, ``run.py``/``gru4rec evaluate``, ``paropt`` (as
``repeat_weight``/``repeat_decay``, searched like any parameter) and ``serve`` — for a model that
says it wants one (:class:`RepeatAware`: ``GRU4Rec.repeat_boost``, from its config fields
``repeat_weight`` and ``repeat_decay``; ``GRU4Rec.with_repeat_boost`` gives a model that shares
the weights with other coefficients). ``score_sessions`` and ``predict_next_batch`` return the
model's scores without it, and the ONNX export's one-click step holds no session history, so it
has no boost.

One formula, :meth:`RepeatBoost.add`, over clicks given as (row, item, age) triples, serves both
forms a history takes: :class:`~gru4rec.inference.clicks.Clicks` (the engine's flat batches,
:meth:`RepeatBoost.apply`) and :class:`SlotHistory` (the evaluator's fixed-shape slots, updated on
the device at every step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from gru4rec.inference.clicks import Clicks

__all__ = ["RepeatAware", "RepeatBoost", "SlotHistory"]


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
        """The boost ``model`` asks for: its ``repeat_boost`` when it is :class:`RepeatAware`,
        else none (a baseline)."""
        return model.repeat_boost if isinstance(model, RepeatAware) else NO_BOOST

    @property
    def active(self) -> bool:
        """Whether the boost changes any score (``weight > 0``)."""
        return self.weight > 0.0

    @staticmethod
    def spread(scores: Tensor) -> Tensor:
        """σ of each row of ``scores`` (B×1; 0 where it is not finite): the model's score scale."""
        return scores.std(dim=1, keepdim=True).nan_to_num_(0.0)

    def add(self, scores: Tensor, rows: Tensor, items: Tensor, ages: Tensor, spread: Tensor | None = None) -> Tensor:
        """Add the boost to ``scores`` (B×N, contiguous) in place: click c is item ``items[c]`` of
        row ``rows[c]``, ``ages[c]`` clicks before the row's last one (0 for the last); a negative
        age is no click (a fixed-shape history's empty place: it adds 0). ``spread``: the rows'
        :meth:`spread` when the caller has it already (it must be that of these ``scores``).
        Returns ``scores``."""
        if not self.active or rows.numel() == 0:
            return scores
        sigma = self.spread(scores) if spread is None else spread
        per_click = torch.pow(self.decay, ages.clamp(min=0).to(scores.dtype)).mul_(ages >= 0)
        weights = (self.weight * sigma[:, 0]).index_select(0, rows).mul_(per_click)
        scores.view(-1).index_add_(0, rows * scores.shape[1] + items, weights)
        return scores

    def apply(self, scores: Tensor, clicks: Clicks) -> Tensor:
        """:meth:`add` for the rows' clicks given as :class:`~gru4rec.inference.clicks.Clicks`
        (row b of ``scores`` is row b of ``clicks``)."""
        if not self.active or not len(clicks.items):
            return scores
        device = scores.device
        return self.add(scores, torch.from_numpy(clicks.rows()).to(device), torch.from_numpy(clicks.items).to(device),
                        torch.from_numpy(clicks.ages()).to(device))


#: No boost.
NO_BOOST = RepeatBoost()


@runtime_checkable
class RepeatAware(Protocol):
    """A session model that can ask for repeat-aware scoring (``GRU4Rec``); a model without
    ``repeat_boost`` gets none."""

    @property
    def repeat_boost(self) -> RepeatBoost: ...


class SlotHistory:
    """Each slot's clicks in its current session, for a session-parallel loop (the evaluator's):
    item indices by position (B×W, W the longest session) and the number of clicks per slot,
    updated on the device at every step with fixed shapes — no host synchronisation. Any
    :class:`RepeatBoost` applies to it (several, one after the other, from the same scores)."""

    def __init__(self, batch: int, longest: int, device: torch.device) -> None:
        width = max(longest, 1)
        self.items = torch.zeros(batch, width, dtype=torch.int64, device=device)
        self.count = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.rows = torch.arange(batch, device=device).unsqueeze(1).expand(batch, width).contiguous()
        self.columns = torch.arange(width, device=device)

    def add(self, items: Tensor, reset: Tensor | None) -> None:
        """The first ``len(items)`` slots click ``items``; ``reset`` marks the slots whose session starts here."""
        A = len(items)
        count = self.count[:A]
        if reset is not None:
            count.masked_fill_(reset.unsqueeze(1), 0)
        # A slot idle at the end of the schedule keeps stepping: it stays in the last column.
        self.items[:A].scatter_(1, count.clamp(max=self.items.shape[1] - 1), items.unsqueeze(1))
        count.add_(1)

    def clicks(self, rows: int) -> tuple[Tensor, Tensor, Tensor]:
        """The first ``rows`` slots' history as :meth:`RepeatBoost.add` takes it: rows, items and
        ages (negative past a slot's last click), rows·W entries each."""
        ages = self.count[:rows] - 1 - self.columns
        return self.rows[:rows].reshape(-1), self.items[:rows].reshape(-1), ages.reshape(-1)
