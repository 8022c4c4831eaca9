"""Shared negative samples drawn with probability ∝ support^alpha (spec §4).

Drawing a few thousand ids per step is cheap on its own, but the call overhead is not, so the
store pre-draws ``sample_store_size // n_sample`` rows of ``n_sample`` ids at once on the training
device, hands out one row per step (a view: nothing is allocated) and redraws the whole store
when it is used up. Draws are inverse-CDF: uniform numbers binary-searched in the cumulative
distribution. The generator is the store's own, so sampling is reproducible from ``seed`` and its
state can be checkpointed.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["SampleStore", "sampling_cdf"]


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
        self._store: Tensor | None = None
        self._cursor = self.n_rows  # empty: the first next() draws
        self.n_redraws = 0

    def draw(self, n_rows: int) -> Tensor:
        """``n_rows`` × ``n_sample`` fresh item indices (int64)."""
        u = torch.rand(n_rows, self.n_sample, device=self.device, dtype=self.cdf.dtype, generator=self.generator)
        return torch.searchsorted(self.cdf, u, right=True)

    def next(self) -> Tensor:
        """The next row of samples (a view into the store); redraws the store when used up."""
        if self._cursor >= self.n_rows:
            self._store = self.draw(self.n_rows)
            self._cursor = 0
            self.n_redraws += 1
        assert self._store is not None
        row = self._store[self._cursor]
        self._cursor += 1
        return row

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
        self._cursor = int(state["cursor"]) if self._store is not None else self.n_rows
