"""The evaluation's schedule: which session each of the ``batch_size`` slots predicts at each step.

Sessions run in parallel in ``batch_size`` slots (docs/behaviour.md §3): when a slot's session
ends, the next session takes the slot and the slot's hidden state is reset to zero. The whole
schedule is computed once on the host (NumPy, no loop over events), so that the evaluation loop
moves it to the device in one transfer and then advances every slot together with fixed shapes.
Sessions are handed out longest first (the LPT rule), which packs the slots almost perfectly,
so hardly any masked row is computed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gru4rec.training.batching import assign_slots

__all__ = ["EvalSchedule", "schedule_sessions"]


@dataclass
class EvalSchedule:
    """What every slot does at every step, as T×B arrays (host side)."""

    inputs: np.ndarray  # int64 [T, B] input item per cell (0 in idle cells)
    targets: np.ndarray  # int64 [T, B] target item per cell (0 in idle cells)
    valid: np.ndarray  # bool [T, B] the cell is a prediction
    reset: np.ndarray  # bool [T, B] the slot starts a new session at this step
    pred_index: np.ndarray  # int64 [T, B] index of the prediction in session order (P if idle)
    active: np.ndarray  # int64 [T] slots 0..active[t]-1 are busy at step t, the others idle
    n_predictions: int
    n_sessions: int
    #: int64 [T, B] the event (index into the session arrays) of each cell's input (0 in idle
    #: cells): where a model with click context reads the input click's context.
    input_events: np.ndarray | None = None


def schedule_sessions(items: np.ndarray, offsets: np.ndarray, batch_size: int) -> EvalSchedule:
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
    input_events = np.zeros(T * B, dtype=np.int64)
    input_events[cell] = event
    targets[cell] = items[event + 1]
    valid[cell] = True
    reset[cell[j == 0]] = True
    pred_index[cell] = np.arange(n_pred, dtype=np.int64)
    shape = (T, B)
    return EvalSchedule(
        inputs.reshape(shape),
        targets.reshape(shape),
        valid.reshape(shape),
        reset.reshape(shape),
        pred_index.reshape(shape),
        active,
        n_pred,
        n_sess,
        input_events.reshape(shape),
    )
