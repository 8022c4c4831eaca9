"""The session-parallel schedule of an epoch (docs/behaviour.md §3), computed once and held on the device.

B slots each step through one session; a session of length n occupies its slot for n − 1 steps
(input = item k, target = item k + 1). When a slot's session ends, the next unused session (in
session order) takes the slot at the next step and the slot's hidden state is reset. Slots that
free at the same step are refilled in slot order. When no unused session remains, finished slots
become inactive; the epoch ends when none is active, or — with ``n_sample == 0`` — as soon as fewer
than two are (a row needs a negative). Sessions of length 1 take no step.

Instead of shrinking the batch at the tail, the schedule keeps B columns and marks inactive slots
(the training step masks them out of the loss and of the candidates). An inactive slot carries the
items of the step's first active slot: rows the step uses anyway, so that its (zero) gradient
touches no other row of the item tables — the step then needs no per-step fix-up.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["Schedule", "assign_slots", "build_schedule", "schedule_positions"]


def assign_slots(steps: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Slot and first step of each session, taken in the given order, for sessions occupying
    their slot for ``steps[k]`` consecutive steps: the first ``batch_size`` sessions start at
    step 0 in slots 0, 1, …; each next one takes the slot that frees first, ties in slot order
    (exactly the order in which the original refills the slots freed at one step)."""
    n = len(steps)
    slot = np.empty(n, dtype=np.int64)
    begin = np.zeros(n, dtype=np.int64)
    first = min(batch_size, n)
    slot[:first] = np.arange(first)
    # Event-driven: a heap of (step at which the slot is free, slot).
    heap = [(int(steps[k]), k) for k in range(first)]
    heapq.heapify(heap)
    steps_list = np.asarray(steps).tolist()
    for k in range(first, n):
        free_at, b = heap[0]
        slot[k] = b
        begin[k] = free_at
        heapq.heapreplace(heap, (free_at + steps_list[k], b))
    return slot, begin


def schedule_positions(offsets: np.ndarray, batch_size: int, n_sample: int) -> np.ndarray:
    """Event index of each slot's input at each step: int64 [T, B], −1 where the slot is inactive.

    ``offsets`` (n_sessions + 1) delimit the sessions in training order; the target of a step is
    the event right after its input.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    keep = np.flatnonzero(lengths >= 2)
    starts, steps = offsets[keep], lengths[keep] - 1
    if len(keep) == 0:
        return np.empty((0, batch_size), dtype=np.int64)
    slot_of, begin = assign_slots(steps, batch_size)
    n_steps = int((begin + steps).max())
    positions = np.full((n_steps, batch_size), -1, dtype=np.int64)
    ramp = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
    positions[np.repeat(begin, steps) + ramp, np.repeat(slot_of, steps)] = np.repeat(starts, steps) + ramp
    if n_sample == 0:
        too_few = np.flatnonzero((positions >= 0).sum(1) < 2)
        if len(too_few):
            positions = positions[: too_few[0]]
    return positions


@dataclass
class Schedule:
    """One epoch's steps as device tensors (row t is step t)."""

    inputs: Tensor  # int64 [T, B] item index fed to each slot (inactive: the first active slot's)
    targets: Tensor  # int64 [T, B] item index to predict (inactive: the first active slot's)
    active: Tensor  # float [T, B] 1 for active slots
    keep: Tensor  # float [T, B, 1] 0 where the slot starts a new session (its hidden state → 0), else 1
    n_active: np.ndarray  # int64 [T] active slots per step (host copy, for the epoch's statistics)
    #: float [T, B, 5] the context of each slot's input click (inactive: the first active slot's),
    #: for a network with click context; None otherwise.
    context: Tensor | None = None

    @property
    def n_steps(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def n_events(self) -> int:
        """Number of predictions (input → target pairs) in the epoch."""
        return int(self.n_active.sum())


def build_schedule(
    items: np.ndarray,
    offsets: np.ndarray,
    batch_size: int,
    n_sample: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    context: np.ndarray | None = None,
) -> Schedule:
    """The epoch's schedule for sessions ``items[offsets[k]:offsets[k+1]]`` in that order,
    computed on the host with vectorised numpy and moved to ``device`` in one transfer each.
    ``context`` (float32 [E × 5], aligned with ``items``): every event's click context, gathered
    here once per epoch for the steps' input clicks (``Schedule.context``)."""
    positions = schedule_positions(offsets, batch_size, n_sample)
    active = positions >= 0
    n_active = active.sum(1)
    first_active = positions[np.arange(len(positions)), active.argmax(1)]  # every step has one
    filled = np.where(active, positions, first_active[:, None])
    items = np.asarray(items, dtype=np.int64)
    is_start = np.zeros(len(items) + 1, dtype=bool)
    is_start[np.asarray(offsets[:-1], dtype=np.int64)] = True
    reset = is_start[filled] & active

    def put(array: np.ndarray, kind: torch.dtype) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=kind)

    return Schedule(
        inputs=put(items[filled], torch.int64),
        targets=put(items[filled + 1], torch.int64),
        active=put(active, dtype),
        keep=put(~reset[:, :, None], dtype),
        n_active=n_active.astype(np.int64),
        context=None if context is None else put(np.asarray(context)[filled], dtype),
    )
