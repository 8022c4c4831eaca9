"""Full-catalogue next-item evaluation (docs/behaviour.md §8): the batched session-parallel loop.

Every test event except a session's first is one prediction: the model has seen the session's
previous items (from a zero hidden state at the session start) and the target item is ranked
against all N training items on the raw scores ``out·Wyᵀ + By``. The tie modes and the metrics
are defined in :mod:`gru4rec.evaluation.metrics`.

How it runs (the fast path is the only path):

* Test events whose item is not in the model's item map are dropped *before* sessions are
  formed (A, X, B with X unknown predicts B from A); their number is reported. Sessions left
  with fewer than two events contribute nothing.
* Sessions run in parallel in ``batch_size`` slots, on a schedule computed once on the host and
  moved to the device in one transfer (:mod:`gru4rec.evaluation.schedule`); the loop then makes
  one Python iteration per step, all slots advanced together with fixed shapes (idle slots at
  the end are masked).
* One matrix product per step scores all items (``net.score_all``); the rank of the target is a
  comparison count against its own score taken from that same matrix (so the target ties with
  itself exactly and duplicated items tie exactly) — no sorting on the rank path.
* Metrics for every cutoff are accumulated on the device and read once at the end: no host
  synchronisation per step.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gru4rec.data import Sessions, read_events, sessions_from_events, validate_events
from gru4rec.data.overlap import warn_overlap
from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.evaluation.metrics import (
    TIE_MODES,
    EvalResult,
    MetricAccumulator,
    TieMode,
    check_cutoffs,
    check_mode,
)
from gru4rec.evaluation.schedule import schedule_sessions
from gru4rec.inference import SessionModel, check_session_model, require_fitted
from gru4rec.inference.repeat import RepeatBoost
from gru4rec.log import progress_bar

__all__ = ["DEFAULT_BATCH_SIZE", "TIE_MODES", "EvalResult", "evaluate", "evaluate_sessions"]

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


def _check_args(mode: str, batch_size: int) -> None:
    check_mode(mode)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size: expected a positive integer, got {batch_size!r}")


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
    breakdown: bool = False,
) -> EvalResult:
    """Evaluate ``model`` on ``test``: next-item prediction ranked against all items
    (docs/behaviour.md §8).

    Args:
        model: a fitted model exposing ``config`` (with ``session_key``, ``item_key``,
            ``time_key``), ``item_map``, ``item_support``, ``net`` and ``device`` — a
            :class:`gru4rec.GRU4Rec`, a loaded model, or a baseline from
            :mod:`gru4rec.baselines`.
        test: the test events: a DataFrame, a path to an event file (read with the model's
            column keys), or a :class:`gru4rec.data.Sessions` already in dense item indices.
        cutoffs: one cutoff or a list; every metric is computed for each in the same pass.
        mode: tie handling: ``'standard'`` (default, as the original run.py),
            ``'conservative'`` (used by published comparisons), ``'median'`` or
            ``'tiebreaking'``.
        batch_size: sessions evaluated in parallel. Larger is faster up to the point where the
            B×N score matrix no longer fits comfortably in memory.
        beyond_accuracy: also compute item coverage and mean popularity (needs a top-k per step).
        progress: show a progress bar (predictions done / total) on standard error, where that
            is a terminal (:func:`gru4rec.log.progress_bar`).
        seed: seed of the random tie positions of ``mode='tiebreaking'``.
        return_ranks: keep every prediction's rank in ``EvalResult.ranks``.
        breakdown: also break the metrics down by session length and by the target item's
            popularity decile (``EvalResult.breakdown``, :mod:`gru4rec.evaluation.breakdown`);
            costs one read back of every rank at the end.

    Returns:
        An :class:`EvalResult`.

    Raises:
        ConfigError: bad cutoffs, mode or batch size.
        DataError: unreadable or invalid test data, or no session with two known events.
        Gru4RecError: the model is not fitted.
    """
    cut = check_cutoffs(cutoffs)
    _check_args(mode, batch_size)
    model = check_session_model(model, "evaluate")
    item_map, _ = require_fitted(model)
    cfg = model.config

    t0 = time.perf_counter()
    keys = dict(session_key=cfg.session_key, item_key=cfg.item_key, time_key=cfg.time_key)
    if isinstance(test, Sessions):
        sessions, n_dropped, source = test, 0, "test sessions"
    else:
        if isinstance(test, (str, os.PathLike)):
            source = str(test)
            df = read_events(test, **keys)
        elif isinstance(test, pd.DataFrame):
            source = "test data"
            df = validate_events(test, source=source, **keys)
        else:
            raise DataError(
                f"test: expected a DataFrame, a path to an event file or Sessions, got {type(test).__name__}"
            )
        sessions, n_dropped = sessions_from_events(df, item_map, drop_unknown=True, **keys)
        # Data the model was trained on (a GRU4Rec with its training fingerprint) is a leak.
        warn_overlap(getattr(model, "train_fingerprint", None), sessions, source)
    result = evaluate_sessions(
        model,
        sessions.items,
        sessions.offsets,
        cutoffs=cut,
        mode=mode,
        batch_size=batch_size,
        beyond_accuracy=beyond_accuracy,
        progress=progress,
        seed=seed,
        return_ranks=return_ranks or breakdown,
        n_dropped_events=n_dropped,
        source=source,
    )
    if breakdown:
        from gru4rec.evaluation.breakdown import compute_breakdown

        assert result.ranks is not None
        result.breakdown = compute_breakdown(result.ranks, sessions.items, sessions.offsets, model.item_support, cut)
        if not return_ranks:
            result.ranks = None
    result.seconds = time.perf_counter() - t0
    return result


class _History:
    """Each slot's clicks in its current session, for repeat-aware scoring
    (:mod:`gru4rec.inference.repeat`): item indices and their weights ``decay^age`` (B×W, W the
    longest session), updated on the device at every step — no host synchronisation."""

    def __init__(self, boost: RepeatBoost, batch: int, longest: int, device: torch.device) -> None:
        self.boost = boost
        if boost.active:
            self.items = torch.zeros(batch, max(longest, 1), dtype=torch.int64, device=device)
            self.weights = torch.zeros(batch, max(longest, 1), dtype=torch.float32, device=device)
            self.position = torch.zeros(batch, 1, dtype=torch.int64, device=device)

    def add(self, items: Tensor, reset: Tensor | None) -> None:
        """The first ``len(items)`` slots click ``items``; ``reset`` marks the slots whose session starts here."""
        A = len(items)
        weights, position = self.weights[:A], self.position[:A]
        if reset is not None:
            weights.masked_fill_(reset.unsqueeze(1), 0.0)
            position.masked_fill_(reset.unsqueeze(1), 0)
        weights.mul_(self.boost.decay)
        self.items[:A].scatter_(1, position, items.unsqueeze(1))
        weights.scatter_(1, position, 1.0)
        # A slot idle at the end of the schedule keeps stepping: it stays in the last column.
        position.add_(1).clamp_(max=self.items.shape[1] - 1)

    def apply(self, scores: Tensor) -> None:
        """Boost each row's scores by its slot's history (in place)."""
        A = scores.shape[0]
        scores.scatter_add_(1, self.items[:A], self.boost.scale(scores) * self.weights[:A].to(scores.dtype))


def evaluate_sessions(
    model: SessionModel,
    items: np.ndarray,
    offsets: np.ndarray,
    *,
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

    ``model`` is a fitted :class:`~gru4rec.inference.SessionModel`; ``items`` (int64 [E]) are
    its dense item indices, session after session; session s is ``items[offsets[s]:offsets[s+1]]``.
    """
    t0 = time.perf_counter()
    cut = check_cutoffs(cutoffs)
    _check_args(mode, batch_size)
    model = check_session_model(model, "evaluate")
    item_map, item_support = require_fitted(model)
    n_items = len(item_map)
    device = model.device
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
    item_support = np.asarray(item_support)
    if item_support.shape != (n_items,):
        raise Gru4RecError(f"evaluate: item_support has shape {item_support.shape}, expected ({n_items},)")

    sched = schedule_sessions(items, offsets, batch_size)
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

    metrics = MetricAccumulator(
        cut,
        mode,
        n_items=N,
        batch=B,
        n_predictions=sched.n_predictions,
        device=device,
        acc_dtype=acc_dtype,
        beyond_accuracy=beyond_accuracy,
        item_support=item_support,
        seed=seed,
        return_ranks=return_ranks,
    )
    k, top_ids = metrics.k, metrics.top_ids
    ranker = _Ranker(mode, N, B, k, device, acc_dtype, cpu_fast=device.type == "cpu" and _CPU_FAST)
    # Scores are written into one B×N buffer: a fresh allocation per step would be fresh memory
    # from the OS every time on the CPU (page faults and zeroing).
    score_buf: Tensor | None = None
    active = sched.active.tolist()
    history = _History(RepeatBoost.of(model), B, int(np.diff(offsets).max()), device)
    # Progress counts predictions (host-side counts per step: no device synchronisation).
    per_step = sched.valid.sum(axis=1).tolist()
    bar = progress_bar(sched.n_predictions, "evaluation", enabled=progress, unit="pred")
    with bar, torch.no_grad():
        hidden_full = model.init_state(B)
        hidden = hidden_full
        for step in range(T):
            A = active[step]
            if A < len(hidden[0]):
                # The tail: only the first A slots are still busy (see schedule_sessions).
                hidden = [h[:A] for h in hidden_full]
            if step and reset_any[step]:
                r = reset[step, :A].unsqueeze(1)
                for h in hidden:
                    h.masked_fill_(r, 0.0)
            out = model.step(inputs[step, :A], hidden)
            if score_buf is None:
                score_buf = torch.empty(B, N, dtype=out.dtype, device=device)
            scores = model.scores(out, buffer=score_buf[:A])
            if history.boost.active:
                history.add(inputs[step, :A], reset[step, :A] if step and reset_any[step] else None)
                history.apply(scores)
            tgt_scores = scores.gather(1, targets[step, :A].unsqueeze(1))
            g, e = ranker(scores, tgt_scores, None if top_ids is None else top_ids[:A])
            metrics.add(g, e, tgt_scores, valid[step, :A], None if pred_index is None else pred_index[step, :A])
            bar.update(per_step[step])

    totals = metrics.read()  # the one read back of the whole evaluation
    P = sched.n_predictions
    if totals.n_nan:
        warnings.warn(
            f"evaluate: {totals.n_nan} of {P} predictions had a NaN target score (diverged model?); counted as misses",
            RuntimeWarning,
            stacklevel=2,
        )
    return EvalResult(
        cutoffs=cut,
        mode=mode,
        recall=totals.recall,
        mrr=totals.mrr,
        ndcg=totals.ndcg,
        coverage=totals.coverage,
        popularity=totals.popularity,
        n_predictions=P,
        n_sessions=sched.n_sessions,
        n_dropped_events=int(n_dropped_events),
        n_items=N,
        seconds=time.perf_counter() - t0,
        ranks=totals.ranks,
    )
