"""Exact top-k of a session model's scores for a batch of sessions, with exclusions.

Two ways to the same answer:

* :class:`Float32TopK` — the model's full scores (for GRU4Rec the float32 product
  ``out·Wyᵀ + By``) and ``torch.topk``. Used on a GPU, for large batches (where the product is
  compute-bound and the matrix is read once for many rows) and for every model without an
  output layer (the baselines).
* :class:`CertifiedTopK` — for small batches on the CPU, where one product row reads the whole
  float32 matrix (88 MB at the DIGINETICA size) and memory bandwidth sets the latency. An int8
  copy of the matrix (4× smaller, :mod:`gru4rec.kernels.int8_scores`) yields ``m`` candidates per
  row with rigorous upper bounds on every item's float32 score; the candidates are rescored from
  the float32 matrix with lower bounds. A row is *certified* when its k-th best lower bound is
  above the largest upper bound left outside the candidates: then no other item can be in its
  float32 top k, and the top k of the rescored candidates is the answer. Rows that are not
  certified (a flat score distribution, many exclusions, k close to m) are scored by
  :class:`Float32TopK`. The answer never differs from the float32 one; the counters say how often
  each path ran.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from gru4rec.inference.clicks import Clicks
from gru4rec.inference.protocol import SessionModel
from gru4rec.kernels.int8_scores import Int8Table, int8_kernels

__all__ = ["AUTO_INT8_WEIGHTS", "CertifiedTopK", "Float32TopK", "TopK", "TopKResult", "make_topk", "SCORING_CHOICES"]

log = logging.getLogger(__name__)

SCORING_CHOICES = ("auto", "float32", "int8")
#: ``scoring='auto'`` uses int8 candidates from this many entries of Wy up (4 MB of float32).
AUTO_INT8_WEIGHTS = 1 << 20


@dataclass
class TopKResult:
    """Item indices and scores per row (B×kmax, CPU, best first); row b's first ``k[b]`` count."""

    indices: np.ndarray
    scores: np.ndarray


class TopK(Protocol):
    """What the engine needs from a scorer."""

    name: str
    counts: dict[str, int]

    def __call__(self, out: Tensor, ks: Sequence[int], exclude: Clicks | None = None,
                 adjust: Callable[[Tensor], Tensor] | None = None) -> TopKResult:
        """Top ``ks[b]`` of row b of the scores after ``out``, without row b's items of
        ``exclude``; ``adjust(scores)``, when given, changes the full scores in place first (the
        repeat boost)."""
        ...


def _exclusion_pairs(exclude: Clicks | None, device: torch.device) -> tuple[Tensor, Tensor] | None:
    """The (row, item) pairs to exclude as two index tensors, straight from the flat clicks."""
    if exclude is None or not len(exclude.items):
        return None
    return torch.from_numpy(exclude.rows()).to(device), torch.from_numpy(exclude.items).to(device)


class Float32TopK:
    """The model's full scores (``scores(out)``), exclusions set to −inf, ``torch.topk``."""

    name = "float32"

    def __init__(self, scores: Callable[[Tensor], Tensor]) -> None:
        self.scores = scores
        self.counts = {"float32": 0}

    @classmethod
    def linear(cls, wy: Tensor, by: Tensor) -> Float32TopK:
        """The top-k of ``out·Wyᵀ + By``."""
        wy, by = wy.detach(), by.detach()
        return cls(lambda out: torch.addmm(by, out, wy.t()))

    def __call__(self, out: Tensor, ks: Sequence[int], exclude: Clicks | None = None,
                 adjust: Callable[[Tensor], Tensor] | None = None) -> TopKResult:
        scores = self.scores(out)
        if adjust is not None:
            adjust(scores)
        pairs = _exclusion_pairs(exclude, scores.device)
        if pairs is not None:
            scores[pairs] = -torch.inf
        top = torch.topk(scores, max(ks), dim=1)
        self.counts["float32"] += out.shape[0]
        return TopKResult(top.indices.cpu().numpy(), top.values.cpu().numpy())


class CertifiedTopK:
    """int8 candidates, float32 rescoring, certification; uncertified rows in float32.

    ``n_candidates`` is m, the candidates per row (at least 3k are taken for a request's k).
    ``max_batch``: larger batches go to float32 as a whole (the int8 products are compute-bound
    at large batches, where a float32 product reads its matrix once for many rows; on the 2-core
    machines measured, int8 stayed 2x (AVX2) and 4.6x (AVX-512 VNNI) faster at 64 rows, see
    benchmarks/README.md).
    """

    name = "int8"

    def __init__(self, table: Int8Table, exact: Float32TopK, *, n_candidates: int = 128, max_batch: int = 64) -> None:
        self.table, self.exact = table, exact
        self.n_candidates, self.max_batch = n_candidates, max_batch
        self.counts = {"certified": 0, "float32": 0}

    def __call__(self, out: Tensor, ks: Sequence[int], exclude: Clicks | None = None,
                 adjust: Callable[[Tensor], Tensor] | None = None) -> TopKResult:
        B, kmax = out.shape[0], max(ks)
        if exclude is None:
            exclude = Clicks.none(B)
        m = max(self.n_candidates, 3 * kmax)
        # Adjusted scores (the repeat boost) have no int8 bounds: they take the float32 path.
        if B > self.max_batch or m >= self.table.n_items or adjust is not None:
            result = self.exact(out, ks, exclude, adjust)
            self.counts["float32"] += B
            return result
        rows = self.table.topk(out, ks, exclude.items, exclude.offsets, m)  # one kernel call for the whole batch
        indices, values = rows.indices, rows.scores
        n_cert = int(rows.certified.sum())
        if n_cert < B:
            redo_rows = np.flatnonzero(~rows.certified)
            redo = self.exact(out[torch.from_numpy(redo_rows)], [ks[int(r)] for r in redo_rows], exclude.take(redo_rows))
            width = redo.indices.shape[1]
            indices[redo_rows, :width] = redo.indices
            values[redo_rows, :width] = redo.scores
        self.counts["certified"] += n_cert
        self.counts["float32"] += B - n_cert
        return TopKResult(indices, values)


def make_topk(model: SessionModel, scoring: str = "auto", *, n_candidates: int = 128, max_batch: int = 64) -> TopK:
    """The scorer of ``model`` for ``scoring``: ``'float32'``; ``'int8'`` (certified candidates,
    an error where the kernel cannot be built, the matrix is not on the CPU or the model has no
    output layer); ``'auto'`` — int8 on the CPU when the kernel builds and the matrix has at
    least :data:`AUTO_INT8_WEIGHTS` entries (a smaller one stays in the CPU's caches, where
    float32 is as fast), else float32."""
    if scoring not in SCORING_CHOICES:
        raise ValueError(f"scoring must be one of {', '.join(SCORING_CHOICES)}, got {scoring!r}")
    exact = Float32TopK(model.scores)
    if scoring == "float32":
        return exact
    layer = model.output_layer()
    why = None
    if layer is None:
        why = f"a {type(model).__name__} has no output layer to quantise"
        if getattr(getattr(model, "net", None), "attributes", None) is not None:
            why += " (it was trained with item attributes: it scores rows composed from them, not one table)"
        if scoring == "int8":
            raise ValueError(f"scoring='int8' is not available: {why}")
        return exact
    wy, by = (t.detach() for t in layer)
    if wy.device.type != "cpu":
        why = f"the model is on {wy.device} (int8 candidates are a CPU path)"
    elif wy.shape[0] <= n_candidates:
        why = f"the catalogue ({wy.shape[0]} items) is not larger than the candidates ({n_candidates})"
    elif scoring == "auto" and wy.numel() < AUTO_INT8_WEIGHTS:
        why = f"the item matrix is small ({wy.shape[0]} x {wy.shape[1]})"
    else:
        kernels, reason = int8_kernels()
        if kernels is None:
            why = f"the int8 kernel could not be built ({reason})"
    if why is not None:
        if scoring == "int8":
            raise ValueError(f"scoring='int8' is not available: {why}")
        log.info("Scoring in float32: %s", why)
        return exact
    assert kernels is not None
    return CertifiedTopK(Int8Table(kernels, wy, by), exact, n_candidates=n_candidates, max_batch=max_batch)
