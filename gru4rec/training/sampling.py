"""Shared negative samples drawn with probability ∝ support^alpha, and the logQ correction of
their scores (docs/behaviour.md §4).

Drawing a few thousand ids per step is cheap on its own, but the call overhead is not, so the
store pre-draws ``sample_store_size // n_sample`` rows of ``n_sample`` ids at once on the training
device, hands out one row per step and redraws the whole store (in place, so that a captured
CUDA graph can keep reading it) when it is used up. Draws are inverse-CDF: uniform numbers
binary-searched in the cumulative distribution. The generator is the store's own, so sampling is
reproducible from ``seed`` and its state can be checkpointed.

logQ (training only, ``logq > 0``): before the final activation, ``logq·log supp`` is subtracted
from the in-batch target columns and ``logq·alpha·log supp`` from the sampled ones (:class:`LogQ`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["LogQ", "SampleStore", "make_logq", "sampling_cdf"]


def sampling_cdf(item_support: np.ndarray, alpha: float) -> np.ndarray:
    """Cumulative distribution of support^alpha, normalised to end at exactly 1 (float64)."""
    weights = np.asarray(item_support, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    cdf[-1] = 1.0  # searchsorted of u < 1 then never runs past the last item
    return cdf


class SampleStore:
    """Pre-drawn negative samples on ``device``; ``next()`` returns the next row of ``n_sample`` ids."""

    def __init__(
        self,
        item_support: np.ndarray,
        alpha: float,
        n_sample: int,
        store_size: int,
        device: torch.device | str,
        generator: torch.Generator | None = None,
        seed: int = 0,
    ) -> None:
        self.n_sample = n_sample
        self.device = torch.device(device)
        self.cdf = torch.as_tensor(sampling_cdf(item_support, alpha), device=self.device)
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        self.generator = generator
        # One row per step; a store smaller than one row means "draw every step".
        self.n_rows = max(1, store_size // n_sample) if n_sample > 0 else 0
        self._store: Tensor | None = None  # drawn on first use
        self._cursor = 0
        self.n_redraws = 0  # full redraws after the first draw

    def draw(self, n_rows: int) -> Tensor:
        """``n_rows`` × ``n_sample`` fresh item indices (int64)."""
        u = torch.rand(n_rows, self.n_sample, device=self.device, dtype=self.cdf.dtype, generator=self.generator)
        return torch.searchsorted(self.cdf, u, right=True)

    @property
    def store(self) -> Tensor:
        """The store (n_rows × n_sample); redrawn in place, so its storage never moves."""
        if self._store is None:
            self._store = self.draw(self.n_rows)
            self._cursor = 0
        return self._store

    def advance(self) -> int:
        """Index of the store row to use for the next step; redraws the store (in place) when
        every row has been used."""
        store = self.store
        if self._cursor >= self.n_rows:
            u = torch.rand(store.shape, device=self.device, dtype=self.cdf.dtype, generator=self.generator)
            torch.searchsorted(self.cdf, u, right=True, out=store)
            self._cursor = 0
            self.n_redraws += 1
        self._cursor += 1
        return self._cursor - 1

    def next(self) -> Tensor:
        """The next row of samples: a view of the store, valid until the store is redrawn (in
        place) — clone it to keep it longer."""
        return self.store[self.advance()]

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same stream of samples."""
        return {
            "generator": self.generator.get_state(),
            "store": self._store.cpu() if self._store is not None else torch.empty(0, dtype=torch.int64),
            "cursor": self._cursor,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        store = state["store"]
        self._store = store.to(self.device) if store.numel() else None
        self._cursor = int(state["cursor"]) if self._store is not None else 0


# ---------------------------------------------------------------------------------------------
# logQ correction


class LogQ(NamedTuple):
    """The logQ terms of every item (N each), subtracted from the scores of the columns."""

    in_batch: Tensor  # logq · log supp: the in-batch target columns
    sampled: Tensor  # logq · alpha · log supp: the sampled columns

    def columns(self, targets: Tensor, samples: Tensor) -> Tensor:
        """The terms of the C = B + S columns [targets | samples]."""
        return torch.cat((self.in_batch.index_select(0, targets), self.sampled.index_select(0, samples)))


def make_logq(item_support: np.ndarray, logq: float, alpha: float, device: torch.device, dtype: torch.dtype) -> LogQ | None:
    """The logQ terms on ``device`` in ``dtype`` (log taken in float64), or None when ``logq`` is 0."""
    if logq <= 0:
        return None
    support = torch.as_tensor(np.asarray(item_support, dtype=np.float64), device=device)
    log_support = torch.log(support).to(dtype)
    return LogQ(logq * log_support, logq * alpha * log_support)
