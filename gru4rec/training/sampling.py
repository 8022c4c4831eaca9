"""Shared negative samples drawn with probability ∝ support^alpha, and the logQ correction of
their scores (docs/behaviour.md §4).

Drawing a few thousand ids per step is cheap on its own, but the call overhead is not, so the
store pre-draws ``sample_store_size // n_sample`` rows of ``n_sample`` ids at once on the training
device, hands out one row per step and redraws the whole store (in place, so that a captured
CUDA graph can keep reading it) when it is used up. Draws are inverse-CDF: for each uniform
number u, the first item whose cumulative probability exceeds u (``torch.searchsorted``; on the
CPU with the fused kernels the same answer from a guide table,
:class:`gru4rec.kernels.cpu.GuidedSearch`: the lookups of a 10M-id store take 19-23 ms instead of
230-460, the whole redraw 75-150 ms). The generator is the store's own, so sampling is
reproducible from ``seed`` and its state can be checkpointed.

logQ (training only, ``logq > 0``): before the final activation, ``logq·log supp`` is subtracted
from the in-batch target columns and ``logq·alpha·log supp`` from the sampled ones (:class:`LogQ`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["CdfSearch", "LogQ", "SampleStore", "make_logq", "sampling_cdf", "torch_cdf_search"]

#: Fills ``out`` (int64) with the item of each uniform number ``u`` (float64): the first index
#: whose cumulative probability exceeds it (``searchsorted(cdf, u, right=True)``).
CdfSearch = Callable[[Tensor, Tensor], None]
#: Uniform numbers drawn at a time on the CPU (float64: 512 kB, in the cache while they are searched).
DRAW_CHUNK = 1 << 16


def sampling_cdf(item_support: np.ndarray, alpha: float) -> np.ndarray:
    """Cumulative distribution of support^alpha, normalised to end at exactly 1 (float64)."""
    weights = np.asarray(item_support, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    cdf[-1] = 1.0  # searchsorted of u < 1 then never runs past the last item
    return cdf


def torch_cdf_search(cdf: Tensor) -> CdfSearch:
    """The inverse-CDF lookup in ``cdf`` by ``torch.searchsorted`` (any device)."""

    def search(u: Tensor, out: Tensor) -> None:
        torch.searchsorted(cdf, u, right=True, out=out)

    return search


class SampleStore:
    """Pre-drawn negative samples on ``device``; ``next()`` returns the next row of ``n_sample`` ids.
    ``search``: builds the inverse-CDF lookup for the distribution (default :func:`torch_cdf_search`)."""

    def __init__(
        self,
        item_support: np.ndarray,
        alpha: float,
        n_sample: int,
        store_size: int,
        device: torch.device | str,
        generator: torch.Generator | None = None,
        seed: int = 0,
        search: Callable[[Tensor], CdfSearch] = torch_cdf_search,
    ) -> None:
        self.n_sample = n_sample
        self.device = torch.device(device)
        self.cdf = torch.as_tensor(sampling_cdf(item_support, alpha), device=self.device)
        self._search = search(self.cdf)
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        self.generator = generator
        # One row per step; a store smaller than one row means "draw every step".
        self.n_rows = max(1, store_size // n_sample) if n_sample > 0 else 0
        self._store: Tensor | None = None  # drawn on first use (or by prepare())
        self._u: Tensor | None = None  # the CPU's buffer of uniform numbers (_fill)
        self._cursor = 0
        self.n_redraws = 0  # full redraws after the first draw

    def draw(self, n_rows: int) -> Tensor:
        """``n_rows`` × ``n_sample`` fresh item indices (int64)."""
        out = torch.empty((n_rows, self.n_sample), dtype=torch.int64, device=self.device)
        self._fill(out)
        return out

    def _fill(self, out: Tensor) -> None:
        """Draw ``out`` (contiguous int64) in place. On the CPU the uniform numbers come
        :data:`DRAW_CHUNK` at a time into one small buffer — the generator's stream is the same as
        one call's, and a 10M-id store needs 512 kB of them instead of 80 MB; on a GPU (whose
        generator's stream depends on the call's size) in one call."""
        if self.device.type != "cpu":
            self._search(torch.rand(out.shape, device=self.device, dtype=self.cdf.dtype, generator=self.generator), out)
            return
        flat = out.view(-1)
        if self._u is None:
            self._u = torch.empty(DRAW_CHUNK, dtype=self.cdf.dtype)
        for start in range(0, flat.numel(), DRAW_CHUNK):
            n = min(DRAW_CHUNK, flat.numel() - start)
            u = self._u[:n]
            torch.rand(n, generator=self.generator, out=u)
            self._search(u, flat[start: start + n])

    @property
    def store(self) -> Tensor:
        """The store (n_rows × n_sample); redrawn in place, so its storage never moves."""
        self.prepare()
        assert self._store is not None
        return self._store

    def prepare(self) -> None:
        """Draw the store now unless it has been drawn (set-up: a trainer's first epoch then
        times training only, as the later ones do)."""
        if self._store is None:
            self._store = self.draw(self.n_rows)
            self._cursor = 0

    def advance(self) -> int:
        """Index of the store row to use for the next step; redraws the store (in place) when
        every row has been used."""
        store = self.store
        if self._cursor >= self.n_rows:
            self._fill(store)
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
        """The terms of the C = B + S columns [targets | samples] (gathered into one new tensor:
        no concatenation's copy)."""
        n_in = targets.shape[0]
        out = self.in_batch.new_empty(n_in + samples.shape[0])
        torch.index_select(self.in_batch, 0, targets, out=out[:n_in])
        torch.index_select(self.sampled, 0, samples, out=out[n_in:])
        return out


def make_logq(item_support: np.ndarray, logq: float, alpha: float, device: torch.device, dtype: torch.dtype) -> LogQ | None:
    """The logQ terms on ``device`` in ``dtype`` (log taken in float64), or None when ``logq`` is 0."""
    if logq <= 0:
        return None
    support = torch.as_tensor(np.asarray(item_support, dtype=np.float64), device=device)
    log_support = torch.log(support).to(dtype)
    return LogQ(logq * log_support, logq * alpha * log_support)
