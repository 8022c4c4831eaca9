"""GPU fast paths, probed once; importing this module is safe (and cheap) on a CPU-only machine.

CUDA-graph replay of the training step
--------------------------------------
A GRU4Rec step is a few dozen small kernels; launched one by one from Python, the GPU waits on
the host (the official PyTorch port runs ≈320 mb/s whatever the batch or layer size — the mark
of launch overhead). The training step is written so that it can be captured once and replayed:

* fixed shapes: the batch never shrinks (inactive slots are masked, see
  ``gru4rec/training/batching.py``);
* no host sync: nothing in the step reads a device value on the host; duplicate rows of the
  item tables are merged through a scratch table (``gru4rec/training/optim.py``), not
  ``torch.unique``;
* inputs by position: the captured step reads its schedule row and its sample-store row through
  two device counters, filled before each replay (two tiny kernels, no copies);
* RNG: dropout draws from the trainer's own generator, registered with the graph so that each
  replay advances it like an eager step would;
* checkpoints (``gru4rec/training/resume.py``) are taken between two replays, at a step
  boundary: the registered generator's state already counts every replay, the sample store's
  cursor lives on the host, and a resumed epoch warms up and captures again from its first step.

The first steps of an epoch run eagerly on a side stream (CUDA libraries initialise their
workspaces there), then the step is captured; if anything about capture fails, the epoch simply
continues eagerly with a warning. Whether to replay at all is the training backend's choice
(``gru4rec.training.backend``: CUDA, unless ``GRU4REC_CUDA_GRAPHS=0``).

This module knows the trainer and the schedule only by what it uses of them (:class:`StepTrainer`,
:class:`StepSchedule`): it imports nothing of :mod:`gru4rec.training`.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

__all__ = ["StepSchedule", "StepTrainer", "counter_driven_step", "graphed_epoch_runner"]


class SampleRows(Protocol):
    """A store of negative samples read one row per step (``gru4rec.training.sampling.SampleStore``)."""

    @property
    def store(self) -> Tensor:
        """The rows (n_rows × S), redrawn in place: their storage never moves."""
        ...

    def advance(self) -> int:
        """The index of the row for the next step (redraws the store when it is used up)."""
        ...


class StepTrainer(Protocol):
    """What graph replay uses of a trainer (``gru4rec.training.trainer.Trainer``)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def sampler(self) -> SampleRows | None: ...

    @property
    def uses_dropout(self) -> bool: ...

    @property
    def dropout_gen(self) -> torch.Generator: ...

    def train_step_at(self, schedule: StepSchedule, t: Tensor, sample_row: Tensor) -> Tensor:
        """Step ``t`` (0-dim int64 device tensor) of ``schedule`` with row ``sample_row`` of the
        sample store, both read on the device; returns the loss (0-dim device tensor)."""
        ...


class StepSchedule(Protocol):
    """An epoch's steps as device tensors, row t for step t (``gru4rec.training.batching.Schedule``)."""

    @property
    def inputs(self) -> Tensor: ...

    @property
    def targets(self) -> Tensor: ...

    @property
    def active(self) -> Tensor: ...

    @property
    def keep(self) -> Tensor: ...

    @property
    def n_steps(self) -> int: ...

WARMUP_STEPS = 3


def counter_driven_step(
    trainer: StepTrainer,
    schedule: StepSchedule,
    accumulate: Callable[[Tensor, Tensor], None],
) -> tuple[Callable[[int], None], Callable[[], None]]:
    """The training step in the form a CUDA graph can capture: ``body()`` reads its schedule row
    and sample-store row through two device counters that ``prepare(t)`` fills (host side,
    including the sample store's redraws). ``prepare(t); body()`` for every t is an epoch;
    device-independent, so it is tested on the CPU against the plain loop."""
    device = trainer.device
    step_index = torch.zeros((), dtype=torch.int64, device=device)
    sample_row = torch.zeros((), dtype=torch.int64, device=device)
    sampler = trainer.sampler

    def body() -> None:
        accumulate(trainer.train_step_at(schedule, step_index, sample_row), step_index)

    def prepare(t: int) -> None:
        step_index.fill_(t)
        if sampler is not None:
            sample_row.fill_(sampler.advance())

    return prepare, body


def graphed_epoch_runner(
    trainer: StepTrainer,
    schedule: StepSchedule,
    accumulate: Callable[[Tensor, Tensor], None],
) -> Callable[[int], None] | None:
    """A function ``run(t)`` doing step ``t`` of the epoch by graph replay, or None when the step
    cannot be captured here. ``accumulate(loss, t_device)`` (device ops only) is captured too."""
    if trainer.device.type != "cuda" or not torch.cuda.is_available() or schedule.n_steps <= WARMUP_STEPS:
        return None
    if trainer.uses_dropout:
        if not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
            return None  # this torch cannot replay draws from the trainer's own dropout generator
    device = trainer.device
    prepare, body = counter_driven_step(trainer, schedule, accumulate)

    graph: torch.cuda.CUDAGraph | None = None
    failed = False
    warmed_up = 0  # counted, not read from t: an epoch resumed from a checkpoint starts at any t

    def run(t: int) -> None:
        nonlocal graph, failed, warmed_up
        prepare(t)
        if graph is not None:
            graph.replay()
        elif failed:
            body()
        elif warmed_up < WARMUP_STEPS:
            warmed_up += 1
            side = torch.cuda.Stream(device)  # warm-up off the capture stream, as CUDA graphs need
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                body()
            torch.cuda.current_stream(device).wait_stream(side)
        else:
            try:
                graph = _capture(body, trainer)
            except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager steps
                failed = True
                torch.cuda.synchronize(device)
                warnings.warn(f"CUDA-graph capture of the training step failed ({exc}); training continues without it", stacklevel=2)
                body()
                return
            graph.replay()  # capture only recorded step t: now run it

    return run


def _capture(body: Callable[[], None], trainer: StepTrainer) -> torch.cuda.CUDAGraph:
    """Capture ``body`` (which must not have side effects before replay: capture only records)."""
    torch.cuda.synchronize(trainer.device)
    graph = torch.cuda.CUDAGraph()
    if trainer.uses_dropout:
        graph.register_generator_state(trainer.dropout_gen)
    with torch.cuda.graph(graph):
        body()
    return graph
