"""The metrics of the full-catalogue next-item evaluation: tie modes, the formulas, their
accumulation on the device, and the result (docs/behaviour.md §8).

Tie modes, with t the target's score and counts over all N items including the target:
``standard`` rank = #{s > t} + 1 (optimistic; the original's default), ``conservative``
rank = #{s ≥ t}, ``median`` rank = #{s > t} + (#{s = t} − 1)/2 + 1, ``tiebreaking``: the target
takes a uniformly random position among the items tied with it (seeded). The last is exactly what
adding infinitesimally small i.i.d. noise to every score and then ranking ``standard`` gives; it
is done on the counts because real noise in float32 either vanishes below the rounding step or
reorders items that are not tied, and drawing B×N random numbers per step would cost as much as
the comparison itself.

A target whose score is NaN (a diverged model) counts as a miss at every cutoff, and a warning
says how many there were; NaN scores of other items never rank above the target.

Metrics, for each cutoff c (means over all predictions unless said otherwise):

* ``recall[c]``  = mean 1[rank ≤ c] (the GNN papers' P@c / HR@c);
* ``mrr[c]``     = mean 1[rank ≤ c] / rank;
* ``ndcg[c]``    = mean 1[rank ≤ c] / log2(rank + 1) (one relevant item, so IDCG = 1);
* ``coverage[c]`` = |⋃ top-c lists| / N: the fraction of the catalogue that appears in at least
  one recommended list of length c;
* ``popularity[c]`` = mean over predictions of the mean, over the top-c list, of
  ``support[i] / max(support)``, where support is the item's number of training events
  (``model.item_support``); 1 means every list holds only the most popular item's popularity,
  values near 0 mean long-tail lists.

Coverage and popularity need the top-c item ids, i.e. a top-k selection per step; they are
computed when ``beyond_accuracy=True`` (default) and skipped otherwise, which leaves the pure
rank path (a little faster). Lists of cutoffs c > N are truncated to N items.

Every sum is kept on the device (:class:`MetricAccumulator`) and read back once at the end: no
host synchronisation per step.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch
from torch import Tensor

from gru4rec.errors import ConfigError

if TYPE_CHECKING:  # typing only: the breakdown is imported by the evaluator when asked for
    from gru4rec.evaluation.breakdown import Breakdown, Group

__all__ = ["TIE_MODES", "EvalResult", "MetricAccumulator", "MetricTotals", "TieMode", "check_cutoffs", "check_mode"]

TieMode = Literal["standard", "conservative", "median", "tiebreaking"]
TIE_MODES: tuple[TieMode, ...] = ("standard", "conservative", "median", "tiebreaking")


# ------------------------------------------------------------------------------------------
# Result
# ------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """Metrics of one evaluation; dicts are keyed by cutoff (see the module docstring).

    ``coverage`` and ``popularity`` are empty when the evaluation ran with
    ``beyond_accuracy=False``. ``ranks`` holds the rank of every prediction (float64, in the
    order of the test sessions and of the events inside them) when asked for with
    ``return_ranks=True``, else None. ``breakdown`` holds the metrics by session length and
    by target-popularity decile when asked for with ``breakdown=True``
    (:mod:`gru4rec.evaluation.breakdown`), else None.
    """

    cutoffs: tuple[int, ...]
    mode: str
    recall: dict[int, float]
    mrr: dict[int, float]
    ndcg: dict[int, float]
    coverage: dict[int, float]
    popularity: dict[int, float]
    n_predictions: int
    n_sessions: int
    n_dropped_events: int
    n_items: int
    seconds: float
    ranks: np.ndarray | None = field(default=None, repr=False)
    breakdown: Breakdown | None = field(default=None, repr=False)
    #: Recall/MRR/NDCG on all targets, on warm targets and on cold targets (groups ``'all'``,
    #: ``'warm'``, ``'cold'``, :func:`gru4rec.evaluation.breakdown.target_groups`). Cold targets
    #: are the cold items of a model with attributes (kept and ranked among its whole catalogue);
    #: a plain model has none (its unknown test items are dropped): its cold group is empty and
    #: reports 0. Empty for results built without them.
    target_groups: list[Group] = field(default_factory=list, repr=False)
    #: Cold items in the catalogue the targets were ranked among (``n_items`` counts them too).
    n_cold_items: int = 0

    def __str__(self) -> str:
        """The original run.py's result lines: ``Recall@20: 0.123456 MRR@20: 0.123456``."""
        return "\n".join(
            f"Recall@{c}: {self.recall[c]:.6f} MRR@{c}: {self.mrr[c]:.6f}" for c in self.cutoffs
        )

    def target_lines(self) -> list[str]:
        """One line per target group (all, warm, cold): ``cold (n=12): Recall@20: ... MRR@20: ...``."""
        return [f"{g.label} (n={g.n_predictions}): "
                + " ".join(f"Recall@{c}: {g.recall[c] or 0.0:.6f} MRR@{c}: {g.mrr[c] or 0.0:.6f}" for c in self.cutoffs)
                for g in self.target_groups]

    def summary(self) -> str:
        """Every metric and count, one cutoff per line, for logs and the command line; with the
        all/warm/cold target lines when the model ranked cold items."""
        lines = [str(self)]
        if self.n_cold_items:
            lines.extend(self.target_lines())
        for c in self.cutoffs:
            parts = [f"NDCG@{c}: {self.ndcg[c]:.6f}"]
            if c in self.coverage:
                parts.append(f"Coverage@{c}: {self.coverage[c]:.6f}")
                parts.append(f"Popularity@{c}: {self.popularity[c]:.6f}")
            lines.append(" ".join(parts))
        lines.append(
            f"{self.n_predictions} predictions in {self.n_sessions} sessions over {self.n_items} items "
            f"({self.mode} ties), {self.n_dropped_events} test events dropped (item not in the "
            f"training data), {self.seconds:.2f} s"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{'recall@20': ..., 'mrr@20': ..., 'ndcg@20': ...,
        'coverage@20': ..., 'popularity@20': ..., 'n_predictions': ..., ...}`` (no ranks), with
        ``'breakdown'`` (see :meth:`Breakdown.to_dict`) when the evaluation computed one."""
        d: dict[str, Any] = {}
        for name in ("recall", "mrr", "ndcg", "coverage", "popularity"):
            for c, v in getattr(self, name).items():
                d[f"{name}@{c}"] = v
        d.update(
            mode=self.mode,
            cutoffs=list(self.cutoffs),
            n_predictions=self.n_predictions,
            n_sessions=self.n_sessions,
            n_dropped_events=self.n_dropped_events,
            n_items=self.n_items,
            seconds=self.seconds,
        )
        if self.breakdown is not None:
            d["breakdown"] = self.breakdown.to_dict()
        if self.n_cold_items:
            d["n_cold_items"] = self.n_cold_items
            d["targets"] = {g.label: g.to_dict() for g in self.target_groups}
        return d



# ------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------


def check_cutoffs(cutoffs: int | Iterable[int]) -> tuple[int, ...]:
    """The cutoffs as a sorted tuple of distinct positive ints; ConfigError naming them otherwise."""
    values: list[Any]
    if isinstance(cutoffs, (int, np.integer)) and not isinstance(cutoffs, bool):
        values = [int(cutoffs)]
    else:
        try:
            values = list(cast("Iterable[Any]", cutoffs))  # a bool is not iterable: TypeError
        except TypeError:
            raise ConfigError(f"cutoffs: expected an int or a list of ints, got {cutoffs!r}") from None
    bad = [c for c in values if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1]
    if not values or bad:
        raise ConfigError(f"cutoffs: expected positive integers, got {values!r}")
    return tuple(sorted({int(c) for c in values}))



def check_mode(mode: str) -> TieMode:
    """``mode`` as a :data:`TieMode`; ConfigError unless it is one of :data:`TIE_MODES`."""
    for known in TIE_MODES:
        if mode == known:
            return known
    raise ConfigError(f"mode: expected one of {', '.join(TIE_MODES)}, got {mode!r}")


# ------------------------------------------------------------------------------------------
# Accumulation
# ------------------------------------------------------------------------------------------


@dataclass
class MetricTotals:
    """The metrics of one evaluation, read back from the device (dicts keyed by cutoff)."""

    recall: dict[int, float]
    mrr: dict[int, float]
    ndcg: dict[int, float]
    coverage: dict[int, float]
    popularity: dict[int, float]
    ranks: np.ndarray | None
    n_nan: int
    """Predictions whose target score was NaN (counted as misses)."""


class MetricAccumulator:
    """Device-side sums of every metric for every cutoff, fed one step of predictions at a time.

    ``add`` turns the ranker's counts into ranks (the tie mode) and adds them to the sums;
    ``read`` reads everything back once. ``top_ids`` (rows × ``k``, or None without
    ``beyond_accuracy``) is the buffer the ranker fills with each row's top-k item ids.
    """

    def __init__(
        self,
        cutoffs: tuple[int, ...],
        mode: str,
        *,
        n_items: int,
        batch: int,
        n_predictions: int,
        device: torch.device,
        acc_dtype: torch.dtype,
        beyond_accuracy: bool,
        item_support: np.ndarray | None,
        seed: int,
        return_ranks: bool,
    ) -> None:
        """Allocate every buffer once. ``item_support`` (int [N]) is needed for the popularity
        when ``beyond_accuracy`` (coverage and popularity) is asked for."""
        self.cut = cutoffs
        self.mode = mode
        self.N = n_items
        self.P = n_predictions
        self.device = device
        self.acc_dtype = acc_dtype
        self.cut_t = torch.tensor(cutoffs, dtype=acc_dtype, device=device)
        K = len(cutoffs)
        # acc[k] = (hits, Σ 1/rank, Σ 1/log2(rank + 1)) over predictions with rank ≤ cut[k].
        self.acc = torch.zeros(K, 3, dtype=acc_dtype, device=device)
        self.n_nan = torch.zeros((), dtype=torch.int64, device=device)
        self.gen: torch.Generator | None = None
        if mode == "tiebreaking":
            self.gen = torch.Generator(device=device)
            self.gen.manual_seed(int(seed))
        self.ranks_out = torch.zeros(n_predictions + 1, dtype=acc_dtype, device=device) if return_ranks else None

        self.k = k = min(cutoffs[-1], n_items)
        self.top_ids: Tensor | None = None
        if beyond_accuracy:
            assert item_support is not None  # checked by the caller, with a message
            self.top_ids = torch.zeros(batch, k, dtype=torch.int64, device=device)
            supp = torch.as_tensor(item_support, dtype=acc_dtype, device=device)
            self.pop_norm = supp / supp.max().clamp_min(1.0)
            # best_pos[i] = best (lowest) list position at which item i was recommended, k if never.
            self.best_pos = torch.full((n_items,), k, dtype=torch.int64, device=device)
            self.positions = torch.arange(k, device=device).expand(batch, k)
            self.never = torch.full((batch, k), k, dtype=torch.int64, device=device)
            self.cut_len = torch.tensor([min(c, k) for c in cutoffs], dtype=torch.int64, device=device)
            self.pop_acc = torch.zeros(K, dtype=acc_dtype, device=device)

    def add(self, g: Tensor, e: Tensor, tgt_scores: Tensor, v: Tensor, pred_index: Tensor | None) -> None:
        """Add the A rows of one step: ``g`` = #{s > t}, ``e`` = #{s ≥ t} (from the ranker),
        the target scores (A×1), ``v`` whether each row is a prediction, and (for
        ``return_ranks``) each row's index in session order; ``top_ids[:A]`` holds the rows'
        top-k ids when coverage and popularity are computed."""
        A = len(v)
        mode, acc_dtype = self.mode, self.acc_dtype
        if mode == "standard":
            rank = g + 1.0
        elif mode == "conservative":
            rank = e.clone()
        elif mode == "median":
            rank = (g + e + 1.0) * 0.5
        else:
            u = torch.rand(A, generator=self.gen, device=self.device, dtype=acc_dtype)
            rank = g + 1.0 + torch.floor(u * (e - g))
        nan = torch.isnan(tgt_scores.squeeze(1))
        self.n_nan += (nan & v).sum()
        rank = rank.masked_fill(nan, math.inf)
        if self.ranks_out is not None:
            assert pred_index is not None
            self.ranks_out.index_copy_(0, pred_index, rank)
        # hit[b, k]: prediction b counts at cutoff k; one small product sums the three
        # metrics for every cutoff.
        hit = ((rank.unsqueeze(1) <= self.cut_t) & v.unsqueeze(1)).to(acc_dtype)  # A×K
        feats = torch.stack((torch.ones_like(rank), rank.reciprocal(), torch.log2(rank + 1.0).reciprocal()), 1)
        self.acc += hit.t() @ feats

        if self.top_ids is not None:
            ids = self.top_ids[:A]
            pos = torch.where(v.unsqueeze(1), self.positions[:A], self.never[:A])
            self.best_pos.scatter_reduce_(0, ids.reshape(-1), pos.reshape(-1), reduce="amin")
            cum = self.pop_norm[ids].cumsum(1)  # A×k
            mean_pop = cum[:, self.cut_len - 1] / self.cut_len.to(acc_dtype)  # A×K
            self.pop_acc += v.to(acc_dtype) @ mean_pop

    def read(self) -> MetricTotals:
        """The one read back of the whole evaluation: every metric as host floats."""
        P, N, k, cut = self.P, self.N, self.k, self.cut
        acc_h = self.acc.cpu().numpy()
        n_nan_h = int(self.n_nan.item())
        recall = {c: float(acc_h[i, 0] / P) for i, c in enumerate(cut)}
        mrr = {c: float(acc_h[i, 1] / P) for i, c in enumerate(cut)}
        ndcg = {c: float(acc_h[i, 2] / P) for i, c in enumerate(cut)}
        coverage: dict[int, float] = {}
        popularity: dict[int, float] = {}
        if self.top_ids is not None:
            bp = self.best_pos.cpu().numpy()
            pa = self.pop_acc.cpu().numpy()
            for i, c in enumerate(cut):
                coverage[c] = float(np.count_nonzero(bp < min(c, k)) / N)
                popularity[c] = float(pa[i] / P)
        ranks = self.ranks_out[:P].cpu().numpy() if self.ranks_out is not None else None
        return MetricTotals(recall, mrr, ndcg, coverage, popularity, ranks, n_nan_h)
