"""Ranking a step's targets among all items: comparison counts (no sort) and the top-k ids, with
a CPU path that works in cache-sized blocks of rows (used by :mod:`gru4rec.evaluation.evaluator`)."""
from __future__ import annotations

import torch
from torch import Tensor

from gru4rec.machine.threads import RowWorkers

__all__ = ["CPU_BLOCK_BYTES", "Ranker"]

# On the CPU the B×N score matrix does not fit in the caches; comparing and selecting in blocks
# of rows that do (about this many bytes of scores) avoids streaming it from memory once per
# operation and writing a B×N boolean intermediate (measured ≈5× faster for the comparison).
CPU_BLOCK_BYTES = 4 << 20


class Ranker:
    """Ranks of the targets (and optionally every row's top-k ids) from one step's scores.

    Two implementations of the same counts, chosen once per evaluation:

    * generic (GPU and others): whole-matrix comparisons ``sum(s > t)`` / ``sum(s >= t)`` and
      ``torch.topk`` — a handful of kernels per step, no host synchronisation;
    * CPU: blocks of rows small enough to stay in the cache, and arithmetic instead of boolean
      comparisons, which the CPU kernels handle poorly (a bool B×N intermediate, then a
      conversion to int64 inside ``sum``): with ``d = sign(s − t)``, #{s > t} = Σ max(d, 0),
      #{s < t} = Σ max(−d, 0), and for the modes needing both, Σ d and Σ |d| give them in two
      sums. Float sums of ±1 are exact below 2^24 items (float64 sums above). A NaN anywhere in
      a block (which would poison the sums) sends that block through the comparisons instead.
      The top-k is taken in two stages: the maximum of every group of ``W`` consecutive items,
      the k best groups, then the top-k of those k·W candidates — the top k items always lie in
      the k groups with the highest maxima (up to ties, where any choice is a valid top-k).
    """

    GROUP = 64  # W: items per group of the two-stage top-k

    def __init__(self, mode: str, n_items: int, batch: int, k: int, device: torch.device, acc_dtype: torch.dtype, cpu_fast: bool) -> None:
        self.mode = mode
        self.N = n_items
        self.k = k
        self.acc_dtype = acc_dtype
        self.cpu_fast = cpu_fast
        self.block = max(1, min(batch, CPU_BLOCK_BYTES // (4 * n_items))) if cpu_fast else batch
        self.sum_dtype = None if n_items < 2**24 else torch.float64
        self.gt = torch.zeros(batch, dtype=acc_dtype, device=device)
        self.ge = torch.zeros(batch, dtype=acc_dtype, device=device)
        self.work: list[Tensor] = []  # the CPU path's block buffers, one per row range ranked side by side
        # Two-stage top-k only pays when there are many more groups than k.
        self.groups = n_items // self.GROUP if cpu_fast and n_items >= 8 * self.GROUP * max(k, 1) else 0
        if self.groups:
            self.in_group = torch.arange(self.GROUP, device=device)
            self.rest = torch.arange(self.groups * self.GROUP, n_items, device=device)

    def __call__(self, scores: Tensor, t: Tensor, top_ids: Tensor | None, rows: RowWorkers | None = None) -> tuple[Tensor, Tensor]:
        """Fill ``gt`` = #{s > t} and/or ``ge`` = #{s ≥ t} for the A rows of ``scores`` (and the
        top-k ids into ``top_ids``); returns views (gt[:A], ge[:A]). ``rows``: on the CPU path,
        rank row ranges side by side on these workers (each range with its own work buffer)."""
        A = scores.shape[0]
        gt, ge = self.gt[:A], self.ge[:A]
        if not self.cpu_fast:
            if self.mode != "conservative":
                torch.sum(scores > t, dim=1, out=gt)
            if self.mode != "standard":
                torch.sum(scores >= t, dim=1, out=ge)
            if top_ids is not None:
                top_ids.copy_(torch.topk(scores, self.k, dim=1, sorted=True).indices)
            return gt, ge
        parts = 1 if rows is None else rows.parts
        if len(self.work) < parts or self.work[0].dtype != scores.dtype:
            self.work = [torch.empty(self.block, self.N, dtype=scores.dtype, device=scores.device) for _ in range(parts)]

        def rank(part: int, lo: int, hi: int) -> None:
            for i in range(lo, hi, self.block):
                j = min(i + self.block, hi)
                s, tb = scores[i:j], t[i:j]
                self._count_block(s, tb, gt[i:j], ge[i:j], self.work[part][: j - i])
                if top_ids is not None:
                    top_ids[i:j] = self._topk(s)

        if rows is None:
            rank(0, 0, A)
        else:
            rows.run(rank, A)
        return gt, ge

    def _count_block(self, s: Tensor, t: Tensor, gt: Tensor, ge: Tensor, d: Tensor) -> None:
        N, sd = self.N, self.sum_dtype
        if self.mode == "standard":
            torch.sub(s, t, out=d).sign_().clamp_(min=0)
            gt.copy_(d.sum(1, dtype=sd))
        elif self.mode == "conservative":
            torch.sub(t, s, out=d).sign_().clamp_(min=0)
            ge.copy_(N - d.sum(1, dtype=sd))
        else:
            torch.sub(s, t, out=d).sign_()
            a = d.sum(1, dtype=sd)
            b = d.abs_().sum(1, dtype=sd)
            gt.copy_((a + b) * 0.5)
            ge.copy_(N - (b - a) * 0.5)
        out = gt if self.mode == "standard" else ge
        if bool(torch.isnan(out).any()):  # NaN scores in the block (CPU: no device to wait for)
            gt.copy_((s > t).sum(1))
            ge.copy_((s >= t).sum(1))

    def _topk(self, s: Tensor) -> Tensor:
        if not self.groups:
            return torch.topk(s, self.k, dim=1, sorted=True).indices
        R, W, G = s.shape[0], self.GROUP, self.groups
        best = torch.topk(s[:, : G * W].view(R, G, W).amax(2), self.k, dim=1, sorted=False).indices
        cand = (best.unsqueeze(2) * W + self.in_group).view(R, self.k * W)
        if len(self.rest):
            cand = torch.cat((cand, self.rest.expand(R, -1)), 1)
        j = torch.topk(s.gather(1, cand), self.k, dim=1, sorted=True).indices
        return cand.gather(1, j)
