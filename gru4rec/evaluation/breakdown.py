"""Where a model wins: the evaluation's metrics broken down by session length and by the
popularity of the target item (docs/behaviour.md §8).

Both breakdowns are computed on the host from the rank of every prediction (one read back of P
ranks at the end of the evaluation; nothing is added to the evaluation loop):

* **session length**: a prediction belongs to the group of its test session's length (the
  number of its events with known items, i.e. after unknown items were dropped), in the groups
  of :data:`LENGTH_EDGES` — 2, 3, 4, 5, 6–10, 11–20, 21+. A session of length n gives n − 1
  predictions, all in its group.
* **target popularity decile**: the training items are ranked by their support (number of
  training events), most popular first, and cut into ten deciles of the catalogue; decile 1 holds
  the 10 % most popular items (the head), decile 10 the least popular (the tail). Items with the
  same support share one decile — that of the highest position of their group — so that the
  decile is a function of the popularity alone; where many items tie (the long tail of items
  seen once), the deciles below them stay empty. A prediction belongs to the decile of its
  target item. Each decile reports the items it holds and their support range.

Each group reports its number of predictions and Recall@c, MRR@c and NDCG@c for every cutoff of
the evaluation (the same formulas as the whole evaluation; a group without predictions has None).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["LENGTH_EDGES", "N_DECILES", "TARGET_GROUPS", "Breakdown", "Group", "compute_breakdown", "plain_target_groups",
           "popularity_deciles", "target_groups"]

#: The groups of :func:`target_groups`, in order.
TARGET_GROUPS: tuple[str, ...] = ("all", "warm", "cold")

#: Lower edges of the session-length groups; the last group is open-ended.
LENGTH_EDGES: tuple[int, ...] = (2, 3, 4, 5, 6, 11, 21)
N_DECILES = 10


@dataclass
class Group:
    """One group of predictions and its metrics (dicts keyed by cutoff; None when empty)."""

    label: str
    n_predictions: int
    recall: dict[int, float | None]
    mrr: dict[int, float | None]
    ndcg: dict[int, float | None]
    info: dict[str, Any] = field(default_factory=dict)
    """What the group covers, e.g. ``{'n_items': 12, 'min_support': 3, 'max_support': 9}``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{'label', 'n_predictions', 'recall': {'20': ...}, 'mrr': ..., 'ndcg': ..., **info}``."""
        out: dict[str, Any] = {"label": self.label, "n_predictions": self.n_predictions}
        for name in ("recall", "mrr", "ndcg"):
            out[name] = {str(c): v for c, v in getattr(self, name).items()}
        out.update(self.info)
        return out


@dataclass
class Breakdown:
    """The evaluation by session length and by target-item popularity decile."""

    cutoffs: tuple[int, ...]
    session_length: list[Group]
    popularity: list[Group]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{'session_length': [group, ...], 'popularity': [group, ...]}``."""
        return {
            "session_length": [g.to_dict() for g in self.session_length],
            "popularity": [g.to_dict() for g in self.popularity],
        }


def popularity_deciles(item_support: np.ndarray) -> np.ndarray:
    """The decile (1 = most popular 10 % of the items … 10) of every item, int64 [N].

    Decile = 1 + ⌊10 · #{items with larger support} / N⌋: items with equal support share the
    decile of the first position of their group in the popularity order."""
    support = np.asarray(item_support, dtype=np.int64)
    n = len(support)
    ordered = np.sort(support)  # ascending
    larger = n - np.searchsorted(ordered, support, side="right")
    return 1 + (N_DECILES * larger) // max(n, 1)


def _length_labels() -> list[str]:
    labels = []
    for i, lo in enumerate(LENGTH_EDGES):
        if i + 1 == len(LENGTH_EDGES):
            labels.append(f"{lo}+")
        else:
            hi = LENGTH_EDGES[i + 1] - 1
            labels.append(str(lo) if hi == lo else f"{lo}-{hi}")
    return labels


def _group_metrics(ranks: np.ndarray, group: np.ndarray, n_groups: int, cutoffs: tuple[int, ...]) -> list[tuple[int, dict, dict, dict]]:
    """Per group (0..n_groups-1): predictions and Recall/MRR/NDCG at every cutoff (bincount, no loop over rows)."""
    counts = np.bincount(group, minlength=n_groups)
    per_cut = []
    reciprocal = 1.0 / ranks  # an infinite rank (a NaN target) gives 0
    gain = 1.0 / np.log2(ranks + 1.0)
    for c in cutoffs:
        hit = ranks <= c
        per_cut.append((
            np.bincount(group, weights=hit.astype(np.float64), minlength=n_groups),
            np.bincount(group, weights=np.where(hit, reciprocal, 0.0), minlength=n_groups),
            np.bincount(group, weights=np.where(hit, gain, 0.0), minlength=n_groups),
        ))
    out = []
    for g in range(n_groups):
        n = int(counts[g])
        recall, mrr, ndcg = {}, {}, {}
        for c, (h, rr, dg) in zip(cutoffs, per_cut):
            recall[c] = float(h[g] / n) if n else None
            mrr[c] = float(rr[g] / n) if n else None
            ndcg[c] = float(dg[g] / n) if n else None
        out.append((n, recall, mrr, ndcg))
    return out


def _prediction_targets(ranks: np.ndarray, items: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ranks (NaN -> inf) and the target item of every prediction, both in session order."""
    items = np.asarray(items, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    ranks = np.where(np.isnan(ranks), np.inf, np.asarray(ranks, dtype=np.float64))
    # Every event but a session's first is a target, in session order (as the ranks).
    is_target = np.ones(len(items), dtype=bool)
    is_target[offsets[:-1][np.diff(offsets) > 0]] = False
    targets = items[is_target]
    if len(targets) != len(ranks):
        raise ValueError(f"{len(ranks)} ranks for {len(targets)} predictions")
    return ranks, targets


def target_groups(ranks: np.ndarray, items: np.ndarray, offsets: np.ndarray, n_warm: int,
                  cutoffs: tuple[int, ...]) -> list[Group]:
    """Recall/MRR/NDCG on all targets, on warm targets (items ``< n_warm``: the training items)
    and on cold targets (items ``>= n_warm``: the cold items of a model with attributes), from
    the ranks of an evaluation (as :func:`compute_breakdown` takes them). An empty group reports
    0 (its ``n_predictions`` of 0 says it is empty): no target of it was recommended."""
    ranks, targets = _prediction_targets(ranks, items, offsets)
    cold = (targets >= n_warm).astype(np.int64)
    split = _group_metrics(ranks, cold, 2, cutoffs)
    whole = _group_metrics(ranks, np.zeros(len(ranks), dtype=np.int64), 1, cutoffs)
    return [Group(label, n, _zero_if_empty(recall), _zero_if_empty(mrr), _zero_if_empty(ndcg))
            for label, (n, recall, mrr, ndcg) in zip(TARGET_GROUPS, [whole[0], *split])]


def plain_target_groups(recall: dict[int, float], mrr: dict[int, float], ndcg: dict[int, float],
                        n_predictions: int) -> list[Group]:
    """:func:`target_groups` of a model without cold items: every target is warm (a plain model
    knows no cold item: its test events of items outside its item map are dropped as unknown),
    and the cold group is empty and reports 0."""
    cutoffs = tuple(recall)
    zero = dict.fromkeys(cutoffs, 0.0)
    return [Group("all", n_predictions, dict(recall), dict(mrr), dict(ndcg)),
            Group("warm", n_predictions, dict(recall), dict(mrr), dict(ndcg)),
            Group("cold", 0, dict(zero), dict(zero), dict(zero))]


def _zero_if_empty(values: dict[int, float | None]) -> dict[int, float | None]:
    return {c: 0.0 if v is None else v for c, v in values.items()}


def compute_breakdown(
    ranks: np.ndarray,
    items: np.ndarray,
    offsets: np.ndarray,
    item_support: np.ndarray,
    cutoffs: tuple[int, ...],
) -> Breakdown:
    """The breakdowns of one evaluation from its ranks.

    ``ranks`` (float [P]) are the ranks in session order, as ``EvalResult.ranks``; ``items`` and
    ``offsets`` are the evaluated sessions (dense item indices, unknown items already dropped);
    ``item_support`` (int [N]) the training supports. A NaN target counts as a miss (its rank
    is infinite), as in the whole evaluation.
    """
    items = np.asarray(items, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    ranks = np.where(np.isnan(ranks), np.inf, np.asarray(ranks, dtype=np.float64))
    lengths = np.diff(offsets)
    # Every event but a session's first is a target, in session order (as the ranks).
    is_target = np.ones(len(items), dtype=bool)
    is_target[offsets[:-1][lengths > 0]] = False
    targets = items[is_target]
    pred_length = np.repeat(lengths, np.maximum(lengths - 1, 0))
    if len(targets) != len(ranks):
        raise ValueError(f"{len(ranks)} ranks for {len(targets)} predictions")

    length_group = np.searchsorted(np.asarray(LENGTH_EDGES), pred_length, side="right") - 1
    length_groups = [
        Group(label, n, recall, mrr, ndcg)
        for label, (n, recall, mrr, ndcg) in zip(_length_labels(), _group_metrics(ranks, length_group, len(LENGTH_EDGES), cutoffs))
    ]

    support = np.asarray(item_support, dtype=np.int64)
    deciles = popularity_deciles(support)
    pop_groups = []
    for d, (n, recall, mrr, ndcg) in enumerate(_group_metrics(ranks, deciles[targets] - 1, N_DECILES, cutoffs), start=1):
        members = support[deciles == d]
        info: dict[str, Any] = {"n_items": len(members)}
        if len(members):
            info.update(min_support=int(members.min()), max_support=int(members.max()))
        pop_groups.append(Group(str(d), n, recall, mrr, ndcg, info))
    return Breakdown(tuple(cutoffs), length_groups, pop_groups)
