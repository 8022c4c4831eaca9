"""Full-catalogue next-item evaluation (docs/behaviour.md §8): the batched session-parallel loop.

Every test event except a session's first is one prediction: the model has seen the session's
previous items (from a fresh state at the session start) and the target item is ranked against
all N training items on the model's scores (for GRU4Rec ``out·Wyᵀ + By``), with the model's repeat
boost when it has one (:mod:`gru4rec.inference.repeat`). The tie modes and the metrics are
defined in :mod:`gru4rec.evaluation.metrics`.

How it runs (the fast path is the only path):

* Test events whose item is not in the model's item map are dropped *before* sessions are
  formed (A, X, B with X unknown predicts B from A); their number is reported. Sessions left
  with fewer than two events contribute nothing.
* Sessions run in parallel in ``batch_size`` slots, on a schedule computed once on the host and
  moved to the device in one transfer (:mod:`gru4rec.evaluation.schedule`); the loop then makes
  one Python iteration per step, all slots advanced together with fixed shapes (idle slots at
  the end are masked).
* One call per step scores all items (the model's ``scores``: for GRU4Rec one matrix product);
  the repeat boost adds to it from each slot's history kept on the device
  (:class:`~gru4rec.inference.repeat.SlotHistory`); the rank of the target is a comparison count
  (:class:`~gru4rec.evaluation.ranking.Ranker`) against its own score taken from that same matrix
  (so the target ties with itself exactly and duplicated items tie exactly) — no sorting on the rank path.
* :func:`evaluate_boosts` ranks the same scores under several repeat boosts in one pass (each
  boost added, ranked and taken off again, the scores computed once per step): the grid of
  :func:`gru4rec.fitting.repeat_fit.fit_repeat_boost`.
* Metrics for every cutoff are accumulated on the device and read once at the end: no host
  synchronisation per step.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gru4rec.data import Sessions, read_events, sessions_from_events, validate_events
from gru4rec.data.overlap import warn_overlap
from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.evaluation.breakdown import plain_target_groups, target_groups
from gru4rec.evaluation.metrics import (
    TIE_MODES,
    EvalResult,
    MetricAccumulator,
    TieMode,
    check_cutoffs,
    check_mode,
)
from gru4rec.evaluation.ranking import Ranker
from gru4rec.evaluation.schedule import schedule_sessions
from gru4rec.inference import SessionModel, catalogue_of, catalogue_support, check_session_model, require_fitted, uses_context
from gru4rec.inference.protocol import advance
from gru4rec.inference.repeat import RepeatBoost, SlotHistory
from gru4rec.items.context import sessions_context
from gru4rec.log import progress_bar
from gru4rec.machine.threads import RowWorkers, online_choice

__all__ = ["DEFAULT_BATCH_SIZE", "TIE_MODES", "EvalResult", "evaluate", "evaluate_boosts", "evaluate_sessions"]

#: Default number of sessions evaluated in parallel (chosen with benchmarks/eval/eval_speed.py: on the
#: 2-core CPU, diginetica L=512 N=43,097, 256/512/1024 all take ≈21–22 s for 60,858 predictions,
#: ≈97 % of the matrix product's FLOP/s at the same shape; 128 is 35 % slower; on a GPU larger
#: batches only help).
DEFAULT_BATCH_SIZE = 512
#: Steps with fewer active rows than this are not split into row ranges (the hand-off would cost
#: more than it saves).
MIN_SPLIT_ROWS = 64

# The CPU ranking path (see ranking.Ranker); tests switch it off to check the generic path on the CPU.
_CPU_FAST = True


def _check_args(mode: str, batch_size: int) -> None:
    check_mode(mode)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size: expected a positive integer, got {batch_size!r}")


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

    A model with item attributes ranks against its whole catalogue (the training items, then
    the cold items of its attribute table: ``GRU4Rec.catalogue``): test events of its cold items
    are kept, as targets and as clicks, and ``EvalResult.target_groups`` reports the metrics on
    all, warm and cold targets (docs/attributes.md). A plain model drops them as unknown, as
    always; its cold group is empty and reports 0.

    Args:
        model: a fitted :class:`~gru4rec.inference.SessionModel` (its ``config`` names the
            test data's columns) — a :class:`gru4rec.GRU4Rec`, a loaded model, or a baseline
            from :mod:`gru4rec.baselines`; its scores are ranked with its repeat boost
            (``repeat_boost``) when it has one.
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
    t0 = time.perf_counter()
    sessions, n_dropped, source = _test_sessions(model, test)
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
        times=sessions.times,
    )
    if breakdown:
        from gru4rec.evaluation.breakdown import compute_breakdown

        assert result.ranks is not None
        result.breakdown = compute_breakdown(result.ranks, sessions.items, sessions.offsets, catalogue_support(model), cut)
        if not return_ranks:
            result.ranks = None
    result.seconds = time.perf_counter() - t0
    return result


def _step_by_rows(model: SessionModel, items: Tensor, state: list[Tensor], rows: RowWorkers, context: Tensor | None = None) -> Tensor:
    """:func:`~gru4rec.inference.protocol.advance` in row ranges side by side (a row's state depends on its own items only:
    :class:`~gru4rec.inference.SessionModel`); returns ``state[-1]``."""

    def step(part: int, lo: int, hi: int) -> None:  # its output is (equal to) state[-1][lo:hi]
        advance(model, items[lo:hi], [s[lo:hi] for s in state], None if context is None else context[lo:hi])

    rows.run(step, items.shape[0])
    return state[-1]


def _scores_by_rows(model: SessionModel, out: Tensor, buffer: Tensor, rows: RowWorkers) -> Tensor:
    """``model.scores(out, buffer)`` computed in row ranges side by side (a row's scores depend
    on its own output only: :class:`~gru4rec.inference.SessionModel`)."""

    def score(part: int, lo: int, hi: int) -> None:
        s = model.scores(out[lo:hi], buffer=buffer[lo:hi])
        if s.data_ptr() != buffer[lo:hi].data_ptr():  # a model that returned a new tensor after all
            buffer[lo:hi].copy_(s)

    rows.run(score, out.shape[0])
    return buffer


def _test_sessions(model: SessionModel, test: Any) -> tuple[Sessions, int, str]:
    """The test sessions in the model's catalogue indices (events of unknown items dropped), their
    number of dropped events and the name of their source."""
    require_fitted(model)
    cfg = model.config
    keys = dict(session_key=cfg.session_key, item_key=cfg.item_key, time_key=cfg.time_key)
    if isinstance(test, Sessions):
        return test, 0, "test sessions"
    if isinstance(test, (str, os.PathLike)):
        source = str(test)
        df = read_events(test, **keys)
    elif isinstance(test, pd.DataFrame):
        source = "test data"
        df = validate_events(test, source=source, **keys)
    else:
        raise DataError(f"test: expected a DataFrame, a path to an event file or Sessions, got {type(test).__name__}")
    # A model with attributes ranks its cold items too: their test events are kept (catalogue_of).
    sessions, n_dropped = sessions_from_events(df, catalogue_of(model), drop_unknown=True, **keys)
    # Data the model was trained on (a GRU4Rec with its training fingerprint) is a leak.
    warn_overlap(getattr(model, "train_fingerprint", None), sessions, source)
    return sessions, n_dropped, source


def evaluate_boosts(
    model: Any,
    test: Any,
    boosts: Sequence[RepeatBoost],
    *,
    cutoffs: int | Sequence[int] = (20,),
    mode: TieMode = "standard",
    batch_size: int = DEFAULT_BATCH_SIZE,
    beyond_accuracy: bool = False,
    seed: int = 42,
) -> list[EvalResult]:
    """:func:`evaluate` of ``model`` under each of ``boosts`` instead of its own repeat boost,
    in one pass: every step's scores are computed once and ranked under every boost. Result i
    equals ``evaluate`` of the model with boost i (the same scores, boosted by the same
    operations); memory grows by one set of metric counters per boost, never by a copy of the
    scores."""
    cut = check_cutoffs(cutoffs)
    _check_args(mode, batch_size)
    model = check_session_model(model, "evaluate")
    if not boosts:
        raise ValueError("evaluate_boosts needs at least one boost")
    sessions, n_dropped, source = _test_sessions(model, test)
    return _evaluate(model, sessions.items, sessions.offsets, list(boosts), cutoffs=cut, mode=mode, batch_size=batch_size,
                     beyond_accuracy=beyond_accuracy, progress=False, seed=seed, return_ranks=False,
                     n_dropped_events=n_dropped, source=source, times=sessions.times)


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
    times: np.ndarray | None = None,
) -> EvalResult:
    """The evaluation core over sessions given as flat arrays (see :func:`evaluate`).

    ``model`` is a fitted :class:`~gru4rec.inference.SessionModel`; ``items`` (int64 [E]) are
    its dense item indices, session after session; session s is ``items[offsets[s]:offsets[s+1]]``.
    ``times`` (float [E], unix seconds, aligned with ``items``): the clicks' times, which a model
    with click context needs (each input click's context is computed from them).
    """
    model = check_session_model(model, "evaluate")
    return _evaluate(model, items, offsets, [RepeatBoost.of(model)], cutoffs=cutoffs, mode=mode, batch_size=batch_size,
                     beyond_accuracy=beyond_accuracy, progress=progress, seed=seed, return_ranks=return_ranks,
                     n_dropped_events=n_dropped_events, source=source, times=times)[0]


def _evaluate(
    model: SessionModel,
    items: np.ndarray,
    offsets: np.ndarray,
    boosts: list[RepeatBoost],
    *,
    cutoffs: int | Sequence[int],
    mode: TieMode,
    batch_size: int,
    beyond_accuracy: bool,
    progress: bool,
    seed: int,
    return_ranks: bool,
    n_dropped_events: int,
    source: str,
    times: np.ndarray | None = None,
) -> list[EvalResult]:
    """The evaluation loop: one :class:`EvalResult` per boost, from the same scores."""
    t0 = time.perf_counter()
    cut = check_cutoffs(cutoffs)
    _check_args(mode, batch_size)
    item_map, _ = require_fitted(model)
    n_warm = len(item_map)
    n_items = len(catalogue_of(model))  # the training items, then a model with attributes' cold items
    item_support = catalogue_support(model)
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
    # The cold/warm split is computed from every prediction's rank (one read back at the end).
    split = n_items > n_warm
    want_ranks = return_ranks
    return_ranks = return_ranks or split

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
    reset_any: list[bool] = np.any(sched.reset, axis=1).tolist()  # host copy: skip the reset op when no slot restarts
    pred_index = torch.from_numpy(sched.pred_index).to(device) if return_ranks else None
    # A model with click context: each cell's input click's context, moved with the schedule.
    context = None
    if uses_context(model):
        if times is None or len(times) != len(items):
            raise DataError(f"{source}: the model takes click context (click_context), but the test sessions have no "
                            f"times (column {model.config.time_key!r})")
        assert sched.input_events is not None
        context = torch.from_numpy(sessions_context(times, offsets)[sched.input_events]).to(device=device)

    metrics = [
        MetricAccumulator(
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
        for _ in boosts
    ]
    ranker = Ranker(mode, N, B, metrics[0].k, device, acc_dtype, cpu_fast=device.type == "cpu" and _CPU_FAST)
    # Scores are written into one B×N buffer: a fresh allocation per step would be fresh memory
    # from the OS every time on the CPU (page faults and zeroing).
    score_buf: Tensor | None = None
    active = sched.active.tolist()
    boosted = any(boost.active for boost in boosts)
    history = SlotHistory(B, int(np.diff(offsets).max()), device) if boosted else None
    # With several boosts each one's additions are taken off again before the next: the scores
    # at the boosted places are kept (a few per row) instead of a copy of the whole B×N matrix.
    restore = boosted and len(boosts) > 1
    # Progress counts predictions (host-side counts per step: no device synchronisation).
    per_step = sched.valid.sum(axis=1).tolist()
    bar = progress_bar(sched.n_predictions, "evaluation", enabled=progress, unit="pred")
    # On the CPU the thread count is chosen from the times of the steps with every slot busy
    # (gru4rec/machine/threads.py): the bulk of the work, alike in size (a tail step's few rows cost mostly
    # overhead). Too few of them to compare: the most threads, or one after a collapse just seen.
    # While it runs one OpenMP thread (a busy machine), the model's step, the scores and the ranks
    # are computed in row ranges side by side on Python threads (RowWorkers: their waits sleep,
    # so they get the CPU share that spinning OpenMP threads lose there).
    n_full = int((sched.active == B).sum())
    threads = None
    workers: RowWorkers | None = None
    if device.type == "cpu":
        threads = online_choice("evaluation", trial_steps=max(3, min(50, n_full // 10)), warmup_steps=1,
                                compare_first=n_full >= 40)
        if len(threads.candidates) > 1:  # chosen online (a fixed count, --threads N, is exactly that)
            workers = RowWorkers(threads.candidates[-1])
    with bar, torch.no_grad(), threads if threads is not None else contextlib.nullcontext(), \
            workers if workers is not None else contextlib.nullcontext():
        hidden_full = model.init_state(B)
        hidden = hidden_full
        step_start = time.perf_counter()
        for step in range(T):
            A = active[step]
            if A < len(hidden[0]):
                # The tail: only the first A slots are still busy (see schedule_sessions).
                hidden = [h[:A] for h in hidden_full]
            if step and reset_any[step]:
                r = reset[step, :A].unsqueeze(1)
                for h in hidden:
                    h.masked_fill_(r, 0.0)
            rows = workers if workers is not None and threads is not None and threads.row_parts > 1 and A >= MIN_SPLIT_ROWS else None
            ctx = None if context is None else context[step, :A]
            x = inputs[step, :A]
            out = advance(model, x, hidden, ctx) if rows is None else _step_by_rows(model, x, hidden, rows, ctx)
            if score_buf is None:
                score_buf = torch.empty(B, N, dtype=out.dtype, device=device)
            scores = model.scores(out, buffer=score_buf[:A]) if rows is None else _scores_by_rows(model, out, score_buf[:A], rows)
            if history is not None:
                history.add(inputs[step, :A], reset[step, :A] if step and reset_any[step] else None)
                clicks = history.clicks(A)
                spread = RepeatBoost.spread(scores) if restore else None
                if restore:
                    places = clicks[0] * N + clicks[1]
                    kept = scores.view(-1).index_select(0, places)
            targets_now = targets[step, :A].unsqueeze(1)
            for boost, counts in zip(boosts, metrics):
                if boost.active:
                    boost.add(scores, *clicks, spread=spread)
                tgt_scores = scores.gather(1, targets_now)
                g, e = ranker(scores, tgt_scores, None if counts.top_ids is None else counts.top_ids[:A], rows)
                counts.add(g, e, tgt_scores, valid[step, :A], None if pred_index is None else pred_index[step, :A])
                if boost.active and restore:
                    scores.view(-1).index_copy_(0, places, kept)  # duplicates write the same kept value
            bar.update(per_step[step])
            if threads is not None:
                now = time.perf_counter()
                if A == B:
                    threads.observe(now - step_start)
                step_start = now

    P = sched.n_predictions
    seconds = time.perf_counter() - t0
    results = []
    for counts in metrics:
        totals = counts.read()  # the one read back of the whole evaluation
        if split:
            assert totals.ranks is not None
            groups = target_groups(totals.ranks, items, offsets, n_warm, cut)
        else:
            groups = plain_target_groups(totals.recall, totals.mrr, totals.ndcg, P)
        if totals.n_nan:
            warnings.warn(
                f"evaluate: {totals.n_nan} of {P} predictions had a NaN target score (diverged model?); counted as misses",
                RuntimeWarning,
                stacklevel=3,
            )
        results.append(EvalResult(
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
            seconds=seconds,
            ranks=totals.ranks if want_ranks else None,
            target_groups=groups,
            n_cold_items=n_items - n_warm,
        ))
    return results
