"""Full-catalogue next-item evaluation (spec §8).

Every test event except a session's first is one prediction: the model has seen the session's
previous items (from a zero hidden state at the session start) and the target item is ranked
against all N training items on the raw scores ``out·Wyᵀ + By``.

How it runs (the fast path is the only path):

* Test events whose item is not in the model's item map are dropped *before* sessions are
  formed (A, X, B with X unknown predicts B from A); their number is reported. Sessions left
  with fewer than two events contribute nothing.
* Sessions run in parallel in ``batch_size`` slots (§3): when a slot's session ends, the next
  session takes the slot and the slot's hidden state is reset to zero. The whole schedule is
  computed once on the host (NumPy, no loop over events) and moved to the device in one
  transfer; the loop then makes one Python iteration per step, all slots advanced together with
  fixed shapes (idle slots at the end are masked). Sessions are handed out longest first (the
  LPT rule), which packs the slots almost perfectly, so hardly any masked row is computed.
* One matrix product per step scores all items (``net.score_all``); the rank of the target is a
  comparison count against its own score taken from that same matrix (so the target ties with
  itself exactly and duplicated items tie exactly) — no sorting on the rank path.
* Metrics for every cutoff are accumulated on the device and read once at the end: no host
  synchronisation per step.

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
"""
from __future__ import annotations

import inspect
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gru4rec.training.batching import assign_slots
from gru4rec.errors import ConfigError, DataError, Gru4RecError

__all__ = ["EvalResult", "evaluate", "evaluate_sessions", "TIE_MODES", "DEFAULT_BATCH_SIZE"]

TieMode = Literal["standard", "conservative", "median", "tiebreaking"]
TIE_MODES: tuple[str, ...] = ("standard", "conservative", "median", "tiebreaking")

#: Default number of sessions evaluated in parallel (chosen with benchmarks/eval_speed.py: on the
#: 2-core CPU, diginetica L=512 N=43,097, 256/512/1024 all take ≈21–22 s for 60,858 predictions,
#: ≈97 % of the matrix product's FLOP/s at the same shape; 128 is 35 % slower; on a GPU larger
#: batches only help).
DEFAULT_BATCH_SIZE = 512

# On the CPU the B×N score matrix does not fit in the caches; comparing and selecting in blocks
# of rows that do (about this many bytes of scores) avoids streaming it from memory once per
# operation and writing a B×N boolean intermediate (measured ≈5× faster for the comparison).
_CPU_BLOCK_BYTES = 4 << 20
# The CPU ranking path (see _Ranker); tests switch it off to check the generic path on the CPU.
_CPU_FAST = True


# ------------------------------------------------------------------------------------------
# Result
# ------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """Metrics of one evaluation; dicts are keyed by cutoff (see the module docstring).

    ``coverage`` and ``popularity`` are empty when the evaluation ran with
    ``beyond_accuracy=False``. ``ranks`` holds the rank of every prediction (float64, in the
    order of the test sessions and of the events inside them) when asked for with
    ``return_ranks=True``, else None.
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

    def __str__(self) -> str:
        """The original run.py's result lines: ``Recall@20: 0.123456 MRR@20: 0.123456``."""
        return "\n".join(
            f"Recall@{c}: {self.recall[c]:.6f} MRR@{c}: {self.mrr[c]:.6f}" for c in self.cutoffs
        )

    def summary(self) -> str:
        """Every metric and count, one cutoff per line, for logs and the command line."""
        lines = [str(self)]
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
        """A flat JSON-ready dict: ``{'recall@20': ..., 'mrr@20': ..., 'ndcg@20': ...,
        'coverage@20': ..., 'popularity@20': ..., 'n_predictions': ..., ...}`` (no ranks)."""
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
        return d


# ------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------


def _check_cutoffs(cutoffs: int | Iterable[int]) -> tuple[int, ...]:
    if isinstance(cutoffs, (int, np.integer)) and not isinstance(cutoffs, bool):
        cutoffs = (int(cutoffs),)
    try:
        values = list(cutoffs)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"cutoffs: expected an int or a list of ints, got {cutoffs!r}") from None
    bad = [c for c in values if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1]
    if not values or bad:
        raise ConfigError(f"cutoffs: expected positive integers, got {values!r}")
    return tuple(sorted({int(c) for c in values}))


def _check_args(mode: str, batch_size: int) -> None:
    if mode not in TIE_MODES:
        raise ConfigError(f"mode: expected one of {', '.join(TIE_MODES)}, got {mode!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size: expected a positive integer, got {batch_size!r}")


# ------------------------------------------------------------------------------------------
# Schedule
# ------------------------------------------------------------------------------------------


@dataclass
class _Schedule:
    """What every slot does at every step, as T×B arrays (host side)."""

    inputs: np.ndarray  # int64 [T, B] input item per cell (0 in idle cells)
    targets: np.ndarray  # int64 [T, B] target item per cell (0 in idle cells)
    valid: np.ndarray  # bool [T, B] the cell is a prediction
    reset: np.ndarray  # bool [T, B] the slot starts a new session at this step
    pred_index: np.ndarray  # int64 [T, B] index of the prediction in session order (P if idle)
    active: np.ndarray  # int64 [T] slots 0..active[t]-1 are busy at step t, the others idle
    n_predictions: int
    n_sessions: int


def _schedule(items: np.ndarray, offsets: np.ndarray, batch_size: int) -> _Schedule:
    """Assign sessions (≥ 2 events) to slots, longest first, each to the slot that frees first."""
    lengths = np.diff(offsets)
    used = np.flatnonzero(lengths >= 2)
    n_steps = lengths[used] - 1  # predictions per used session
    n_pred = int(n_steps.sum())
    n_sess = len(used)
    B = max(1, min(batch_size, n_sess))
    # Index of each used session's first prediction in session order (for per-prediction ranks).
    pred_start = np.zeros(n_sess, dtype=np.int64)
    np.cumsum(n_steps[:-1], out=pred_start[1:])

    # LPT: longest sessions first, each to the slot with the earliest free step (ties: lowest
    # slot). Metrics do not depend on the order of sessions, and this order leaves at most a few
    # partly idle steps at the end.
    order = np.argsort(-n_steps, kind="stable")
    slot = np.empty(n_sess, dtype=np.int64)
    start = np.empty(n_sess, dtype=np.int64)
    slot[order], start[order] = assign_slots(n_steps[order], B)
    T = int((start + n_steps).max()) if n_sess else 0
    # A slot is busy without a gap from step 0 until its last session ends (the next session
    # takes it at once). Numbering the slots by decreasing end step makes the busy slots of
    # every step a prefix, so the tail can run on fewer rows instead of masked ones.
    end = np.zeros(B, dtype=np.int64)
    np.maximum.at(end, slot, start + n_steps)
    by_end = np.argsort(-end, kind="stable")
    rename = np.empty(B, dtype=np.int64)
    rename[by_end] = np.arange(B)
    slot = rename[slot]
    active = B - np.cumsum(np.bincount(end, minlength=T + 1))[:T]

    # Expand to cells without a Python loop: prediction j of session s sits at step start[s] + j
    # in slot slot[s]; its input is event offsets[s] + j and its target the event after it.
    sess_of_pred = np.repeat(np.arange(n_sess, dtype=np.int64), n_steps)
    j = np.arange(n_pred, dtype=np.int64) - pred_start[sess_of_pred]
    cell = (start[sess_of_pred] + j) * B + slot[sess_of_pred]
    event = offsets[used][sess_of_pred] + j
    inputs = np.zeros(T * B, dtype=np.int64)
    targets = np.zeros(T * B, dtype=np.int64)
    valid = np.zeros(T * B, dtype=bool)
    reset = np.zeros(T * B, dtype=bool)
    pred_index = np.full(T * B, n_pred, dtype=np.int64)
    inputs[cell] = items[event]
    targets[cell] = items[event + 1]
    valid[cell] = True
    reset[cell[j == 0]] = True
    pred_index[cell] = np.arange(n_pred, dtype=np.int64)
    shape = (T, B)
    return _Schedule(
        inputs.reshape(shape),
        targets.reshape(shape),
        valid.reshape(shape),
        reset.reshape(shape),
        pred_index.reshape(shape),
        active,
        n_pred,
        n_sess,
    )


# ------------------------------------------------------------------------------------------
# Ranking
# ------------------------------------------------------------------------------------------


class _Ranker:
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
        self.block = max(1, min(batch, _CPU_BLOCK_BYTES // (4 * n_items))) if cpu_fast else batch
        self.sum_dtype = None if n_items < 2**24 else torch.float64
        self.gt = torch.zeros(batch, dtype=acc_dtype, device=device)
        self.ge = torch.zeros(batch, dtype=acc_dtype, device=device)
        self.work: Tensor | None = None
        # Two-stage top-k only pays when there are many more groups than k.
        self.groups = n_items // self.GROUP if cpu_fast and n_items >= 8 * self.GROUP * max(k, 1) else 0
        if self.groups:
            self.in_group = torch.arange(self.GROUP, device=device)
            self.rest = torch.arange(self.groups * self.GROUP, n_items, device=device)

    def __call__(self, scores: Tensor, t: Tensor, top_ids: Tensor | None) -> tuple[Tensor, Tensor]:
        """Fill ``gt`` = #{s > t} and/or ``ge`` = #{s ≥ t} for the A rows of ``scores`` (and the
        top-k ids into ``top_ids``); returns views (gt[:A], ge[:A])."""
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
        if self.work is None or self.work.dtype != scores.dtype:
            self.work = torch.empty(self.block, self.N, dtype=scores.dtype, device=scores.device)
        for i in range(0, A, self.block):
            j = min(i + self.block, A)
            s, tb = scores[i:j], t[i:j]
            self._count_block(s, tb, gt[i:j], ge[i:j], self.work[: j - i])
            if top_ids is not None:
                top_ids[i:j] = self._topk(s)
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


# ------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------


def evaluate(
    model: Any,
    test: Any,
    *,
    cutoffs: int | Sequence[int] = (20,),
    mode: TieMode = "standard",
    batch_size: int = DEFAULT_BATCH_SIZE,
    beyond_accuracy: bool = True,
    progress: bool = False,
    seed: int = 42,
    return_ranks: bool = False,
) -> EvalResult:
    """Evaluate ``model`` on ``test``: next-item prediction ranked against all items (§8).

    Args:
        model: a fitted model exposing ``config`` (with ``session_key``, ``item_key``,
            ``time_key``), ``item_map``, ``item_support``, ``net`` and ``device`` — a
            :class:`gru4rec.GRU4Rec`, a loaded model, or a baseline from
            :mod:`gru4rec.baselines`.
        test: the test events: a DataFrame, a path to an event file (read with the model's
            column keys), or a :class:`gru4rec.data.events.Sessions` already in dense item indices.
        cutoffs: one cutoff or a list; every metric is computed for each in the same pass.
        mode: tie handling: ``'standard'`` (default, as the original run.py),
            ``'conservative'`` (used by published comparisons), ``'median'`` or
            ``'tiebreaking'``.
        batch_size: sessions evaluated in parallel. Larger is faster up to the point where the
            B×N score matrix no longer fits comfortably in memory.
        beyond_accuracy: also compute item coverage and mean popularity (needs a top-k per step).
        progress: print the progress to stderr.
        seed: seed of the random tie positions of ``mode='tiebreaking'``.
        return_ranks: keep every prediction's rank in ``EvalResult.ranks``.

    Returns:
        An :class:`EvalResult`.

    Raises:
        ConfigError: bad cutoffs, mode or batch size.
        DataError: unreadable or invalid test data, or no session with two known events.
        Gru4RecError: the model is not fitted.
    """
    cut = _check_cutoffs(cutoffs)
    _check_args(mode, batch_size)
    net, item_map, support, device, cfg = _unpack_model(model)
    n_items = len(item_map)

    t0 = time.perf_counter()
    from gru4rec import data as _data  # pandas-heavy; imported on use

    keys = dict(session_key=cfg.session_key, item_key=cfg.item_key, time_key=cfg.time_key)
    if isinstance(test, _data.Sessions):
        sessions, n_dropped, source = test, 0, "test sessions"
    else:
        if isinstance(test, (str, os.PathLike)):
            source = str(test)
            df = _data.read_events(test, **keys)
        elif isinstance(test, pd.DataFrame):
            source = "test data"
            df = _data.validate_events(test, source=source, **keys)
        else:
            raise DataError(
                f"test: expected a DataFrame, a path to an event file or Sessions, got {type(test).__name__}"
            )
        sessions, n_dropped = _data.sessions_from_events(df, item_map, drop_unknown=True, **keys)
    result = evaluate_sessions(
        net,
        sessions.items,
        sessions.offsets,
        n_items=n_items,
        item_support=support,
        device=device,
        cutoffs=cut,
        mode=mode,
        batch_size=batch_size,
        beyond_accuracy=beyond_accuracy,
        progress=progress,
        seed=seed,
        return_ranks=return_ranks,
        n_dropped_events=n_dropped,
        source=source,
    )
    result.seconds = time.perf_counter() - t0
    return result


def _accepts_keyword(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _unpack_model(model: Any) -> tuple[Any, Any, Any, torch.device, Any]:
    missing = [a for a in ("config", "item_map", "item_support", "net", "device") if not hasattr(model, a)]
    if missing:
        raise Gru4RecError(
            f"evaluate: {type(model).__name__} is not a model (it lacks {', '.join(missing)})"
        )
    if model.net is None or model.item_map is None:
        raise Gru4RecError("evaluate: the model is not fitted; call fit() or load a model file first")
    return model.net, model.item_map, model.item_support, torch.device(model.device), model.config


def evaluate_sessions(
    net: Any,
    items: np.ndarray,
    offsets: np.ndarray,
    *,
    n_items: int,
    item_support: np.ndarray | None = None,
    device: torch.device | str = "cpu",
    cutoffs: int | Sequence[int] = (20,),
    mode: TieMode = "standard",
    batch_size: int = DEFAULT_BATCH_SIZE,
    beyond_accuracy: bool = True,
    progress: bool = False,
    seed: int = 42,
    return_ranks: bool = False,
    n_dropped_events: int = 0,
    source: str = "test sessions",
) -> EvalResult:
    """The evaluation core over sessions given as flat arrays (see :func:`evaluate`).

    ``items`` (int64 [E]) are dense item indices, session after session; session s is
    ``items[offsets[s]:offsets[s+1]]``. ``net`` exposes ``init_hidden(B)``, ``step(items,
    hidden)`` and ``score_all(out)`` (see docs/design.md). ``item_support`` (int [N]) is needed
    for ``popularity`` when ``beyond_accuracy``.
    """
    t0 = time.perf_counter()
    cut = _check_cutoffs(cutoffs)
    _check_args(mode, batch_size)
    device = torch.device(device)
    items = np.asarray(items)
    offsets = np.asarray(offsets)
    if items.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(items):
        raise DataError(f"{source}: offsets must start at 0 and end at the number of events")
    if np.any(np.diff(offsets) < 0):
        raise DataError(f"{source}: offsets must be non-decreasing")
    if len(items) and (items.min() < 0 or items.max() >= n_items):
        raise DataError(f"{source}: item indices must lie in [0, {n_items}), got [{items.min()}, {items.max()}]")
    items = items.astype(np.int64, copy=False)
    offsets = offsets.astype(np.int64, copy=False)
    if beyond_accuracy:
        if item_support is None:
            raise Gru4RecError("evaluate: popularity needs the model's item_support (or beyond_accuracy=False)")
        item_support = np.asarray(item_support)
        if item_support.shape != (n_items,):
            raise Gru4RecError(f"evaluate: item_support has shape {item_support.shape}, expected ({n_items},)")

    sched = _schedule(items, offsets, batch_size)
    if sched.n_predictions == 0:
        raise DataError(
            f"{source}: no session has two or more events with items known to the model "
            f"({n_dropped_events} event(s) dropped as unknown) — nothing to evaluate"
        )
    T, B = sched.inputs.shape
    N = n_items
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64

    # One transfer of the whole schedule.
    inputs = torch.from_numpy(sched.inputs).to(device)
    targets = torch.from_numpy(sched.targets).to(device)
    valid = torch.from_numpy(sched.valid).to(device)
    reset = torch.from_numpy(sched.reset).to(device)
    reset_any = sched.reset.any(axis=1)  # host copy: skip the reset op when no slot restarts
    pred_index = torch.from_numpy(sched.pred_index).to(device) if return_ranks else None

    cut_t = torch.tensor(cut, dtype=acc_dtype, device=device)
    K = len(cut)
    # acc[k] = (hits, Σ 1/rank, Σ 1/log2(rank + 1)) over predictions with rank ≤ cut[k].
    acc = torch.zeros(K, 3, dtype=acc_dtype, device=device)
    n_nan = torch.zeros((), dtype=torch.int64, device=device)
    gen: torch.Generator | None = None
    if mode == "tiebreaking":
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
    ranks_out = torch.zeros(sched.n_predictions + 1, dtype=acc_dtype, device=device) if return_ranks else None

    k = min(cut[-1], N)
    top_ids = None
    if beyond_accuracy:
        top_ids = torch.zeros(B, k, dtype=torch.int64, device=device)
        supp = torch.as_tensor(item_support, dtype=acc_dtype, device=device)
        pop_norm = supp / supp.max().clamp_min(1.0)
        # best_pos[i] = best (lowest) list position at which item i was recommended, k if never.
        best_pos = torch.full((N,), k, dtype=torch.int64, device=device)
        positions = torch.arange(k, device=device).expand(B, k)
        never = torch.full((B, k), k, dtype=torch.int64, device=device)
        cut_len = torch.tensor([min(c, k) for c in cut], dtype=torch.int64, device=device)
        pop_acc = torch.zeros(K, dtype=acc_dtype, device=device)

    ranker = _Ranker(mode, N, B, k, device, acc_dtype, cpu_fast=device.type == "cpu" and _CPU_FAST)
    # A net whose score_all writes into a given buffer saves a fresh B×N allocation per step
    # (on the CPU a large one is fresh memory from the OS every time: page faults and zeroing).
    use_buffer = _accepts_keyword(net.score_all, "buffer")
    score_buf: Tensor | None = None
    active = sched.active.tolist()
    was_training = bool(getattr(net, "training", False))
    if hasattr(net, "eval"):
        net.eval()
    report_every = max(1, T // 20)
    try:
        with torch.no_grad():
            hidden_full = net.init_hidden(B)
            hidden = hidden_full
            for step in range(T):
                A = active[step]
                if A < len(hidden[0]):
                    # The tail: only the first A slots are still busy (see _schedule).
                    hidden = [h[:A] for h in hidden_full]
                if step and reset_any[step]:
                    r = reset[step, :A].unsqueeze(1)
                    for h in hidden:
                        h.masked_fill_(r, 0.0)
                out = net.step(inputs[step, :A], hidden)
                if use_buffer:
                    if score_buf is None:
                        score_buf = torch.empty(B, N, dtype=out.dtype, device=device)
                    scores = net.score_all(out, buffer=score_buf[:A])
                else:
                    scores = net.score_all(out)
                tgt_scores = scores.gather(1, targets[step, :A].unsqueeze(1))
                g, e = ranker(scores, tgt_scores, None if top_ids is None else top_ids[:A])
                if mode == "standard":
                    rank = g + 1.0
                elif mode == "conservative":
                    rank = e.clone()
                elif mode == "median":
                    rank = (g + e + 1.0) * 0.5
                else:
                    u = torch.rand(A, generator=gen, device=device, dtype=acc_dtype)
                    rank = g + 1.0 + torch.floor(u * (e - g))
                v = valid[step, :A]
                nan = torch.isnan(tgt_scores.squeeze(1))
                n_nan += (nan & v).sum()
                rank = rank.masked_fill(nan, math.inf)
                if ranks_out is not None:
                    assert pred_index is not None
                    ranks_out.index_copy_(0, pred_index[step, :A], rank)
                # hit[b, k]: prediction b counts at cutoff k; one small product sums the three
                # metrics for every cutoff.
                hit = ((rank.unsqueeze(1) <= cut_t) & v.unsqueeze(1)).to(acc_dtype)  # A×K
                feats = torch.stack((torch.ones_like(rank), rank.reciprocal(), torch.log2(rank + 1.0).reciprocal()), 1)
                acc += hit.t() @ feats

                if beyond_accuracy:
                    assert top_ids is not None
                    ids = top_ids[:A]
                    pos = torch.where(v.unsqueeze(1), positions[:A], never[:A])
                    best_pos.scatter_reduce_(0, ids.reshape(-1), pos.reshape(-1), reduce="amin")
                    cum = pop_norm[ids].cumsum(1)  # A×k
                    mean_pop = cum[:, cut_len - 1] / cut_len.to(acc_dtype)  # A×K
                    pop_acc += v.to(acc_dtype) @ mean_pop

                if progress and ((step + 1) % report_every == 0 or step + 1 == T):
                    print(f"evaluation: step {step + 1}/{T} ({100.0 * (step + 1) / T:.0f}%)", file=sys.stderr, flush=True)
    finally:
        if was_training and hasattr(net, "train"):
            net.train()

    # The one read back of the whole evaluation.
    P = sched.n_predictions
    acc_h = acc.cpu().numpy()
    n_nan_h = int(n_nan.item())
    recall = {c: float(acc_h[i, 0] / P) for i, c in enumerate(cut)}
    mrr = {c: float(acc_h[i, 1] / P) for i, c in enumerate(cut)}
    ndcg = {c: float(acc_h[i, 2] / P) for i, c in enumerate(cut)}
    coverage: dict[int, float] = {}
    popularity: dict[int, float] = {}
    if beyond_accuracy:
        bp = best_pos.cpu().numpy()
        pa = pop_acc.cpu().numpy()
        for i, c in enumerate(cut):
            coverage[c] = float(np.count_nonzero(bp < min(c, k)) / N)
            popularity[c] = float(pa[i] / P)
    ranks = ranks_out[:P].cpu().numpy() if ranks_out is not None else None
    if n_nan_h:
        warnings.warn(
            f"evaluate: {n_nan_h} of {P} predictions had a NaN target score (diverged model?); counted as misses",
            RuntimeWarning,
            stacklevel=2,
        )
    return EvalResult(
        cutoffs=cut,
        mode=mode,
        recall=recall,
        mrr=mrr,
        ndcg=ndcg,
        coverage=coverage,
        popularity=popularity,
        n_predictions=P,
        n_sessions=sched.n_sessions,
        n_dropped_events=int(n_dropped_events),
        n_items=N,
        seconds=time.perf_counter() - t0,
        ranks=ranks,
    )
