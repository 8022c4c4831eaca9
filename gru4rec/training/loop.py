"""The epoch loop: :func:`train_epochs` runs a :class:`~gru4rec.training.trainer.Trainer` over the
training sessions, epoch after epoch, and yields each epoch's :class:`EpochStats`.

An epoch: (re)order the sessions if asked, build the session-parallel schedule on the device,
zero the hidden states, run every step of the schedule (replayed from a CUDA graph on a GPU,
:mod:`gru4rec.kernels.gpu`), and log the original's per-epoch line. Step losses are accumulated
on the device; the host reads them at most twice a second — for the progress bar and to stop a
diverged run — and once at the end of the epoch.

Divergence: a NaN or infinite step loss stops training (:class:`~gru4rec.errors.TrainingDivergedError`).
A loss that stays finite but explodes — an epoch loss above :data:`EXPLOSION_FACTOR` times the
untrained level, :func:`loss_bound` — is warned about once (:class:`~gru4rec.errors.LossExplodedWarning`,
naming the epoch and the loss), and training goes on; ``paropt`` turns that warning into a pruned
trial. The untrained level is the larger of the run's first step loss (the untrained network's
loss on the first mini-batch, for a fresh run) and the loss of all-zero scores (log(B + n_sample)
for the softmax losses, 1 for the others: log 2 for bpr and bpr-max, 1 for top1 and top1-max).
A network that learns ends its first epoch below that level; on the rsc15 sample a diverging
learning rate ends the first epoch at 3.9x-7.5x it with cross-entropy and at ~1,000x-10,000x
with bpr-max, and on synthetic data a learning rate of 0.195 that halves the MRR at 2.3x: 3x
stops the broken runs and leaves the merely poor ones to the pruner (docs/tuning.md, "Divergence").

Checkpoints (:mod:`gru4rec.training.resume`): at every step boundary the loop asks its
``checkpoints`` whether one is due (a clock and a flag, no device sync) and hands it the
:class:`~gru4rec.training.resume.EpochPosition`; it also hands it every epoch's end. A run
started from a position redraws that epoch's session order from the position's generator
state, takes the slots' hidden states and the step losses so far, and skips the steps done.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.config.values import SOFTMAX_LOSSES
from gru4rec.errors import LossExplodedWarning, TrainingDivergedError
from gru4rec.kernels.gpu import graphed_epoch_runner
from gru4rec.log import progress_bar
from gru4rec.machine.threads import ThreadChoice, online_choice
from gru4rec.training.batching import Schedule, build_schedule
from gru4rec.training.resume import EpochPosition
from gru4rec.training.trainer import Trainer

__all__ = ["EXPLOSION_FACTOR", "EpochStats", "StepCheckpoints", "loss_bound", "reorder", "train_epochs", "untrained_loss"]

log = logging.getLogger(__name__)

#: Seconds between two looks at the step losses (progress bar, NaN check).
CHECK_INTERVAL = 0.5
#: An epoch loss above this many times the untrained level has exploded (:func:`loss_bound`).
EXPLOSION_FACTOR = 3.0


def untrained_loss(config: Config) -> float:
    """The loss of all-zero scores (every column alike): log(batch_size + n_sample) for the
    softmax losses (a uniform guess over the step's columns), else 1 (bpr and bpr-max: log 2;
    top1 and top1-max: 1)."""
    if config.loss in SOFTMAX_LOSSES:
        return math.log(config.batch_size + config.n_sample)
    return 1.0


def loss_bound(config: Config, first_step_loss: float) -> float:
    """The epoch loss above which training has exploded: :data:`EXPLOSION_FACTOR` times the larger
    of the run's first step loss and :func:`untrained_loss`."""
    first = first_step_loss if math.isfinite(first_step_loss) else 0.0
    return EXPLOSION_FACTOR * max(first, untrained_loss(config))


@dataclass
class EpochStats:
    """What one epoch measured."""

    epoch: int
    loss: float
    seconds: float
    n_steps: int
    n_events: int
    first_step_loss: float = math.nan
    """The loss of the epoch's first step this run trained (NaN if none)."""

    @property
    def mb_per_s(self) -> float:
        """Steps (mini-batches) per second."""
        return self.n_steps / self.seconds if self.seconds > 0 else math.inf

    @property
    def events_per_s(self) -> float:
        """Predictions (input → target pairs) per second."""
        return self.n_events / self.seconds if self.seconds > 0 else math.inf

    def line(self) -> str:
        """The original's per-epoch line."""
        return (
            f"Epoch{self.epoch} --> loss: {self.loss:.6f} \t({self.seconds:.2f}s) "
            f"\t[{self.mb_per_s:.2f} mb/s | {self.events_per_s:.0f} e/s]"
        )


class StepCheckpoints(Protocol):
    """Where the loop hands its positions (:class:`gru4rec.training.resume.TrainingCheckpoint`)."""

    def due(self, now: float) -> bool:
        """Whether to write a checkpoint at this step boundary (cheap: called at every step)."""
        ...

    def write(self, position: EpochPosition) -> None:
        """Write the checkpoint of ``position``; may raise to stop training."""
        ...


def reorder(items: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items and offsets with the sessions rearranged in ``order`` (vectorised)."""
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    take = np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
    return items[take], new_offsets


def train_epochs(
    trainer: Trainer,
    items: np.ndarray,
    offsets: np.ndarray,
    *,
    first_epoch: int = 1,
    n_epochs: int | None = None,
    rng: np.random.Generator | None = None,
    progress: bool = True,
    start: EpochPosition | None = None,
    checkpoints: StepCheckpoints | None = None,
    on_epoch_end: Callable[[EpochStats], None] | None = None,
    context: np.ndarray | None = None,
) -> Iterator[EpochStats]:
    """Train epoch after epoch, yielding each epoch's statistics (the caller may stop early).

    ``first_epoch``/``n_epochs``: the epochs to run (default: 1 to ``config.n_epochs``); ``rng``:
    the generator of the random session orders (``train_random_order``); ``progress``: a
    progress bar on a terminal. ``start``: continue from a checkpoint's position instead (its
    epoch and step; ``rng`` is set to its state). ``checkpoints``: asked at every step boundary
    and told every epoch's end. ``on_epoch_end(stats)`` runs after each epoch and before its
    checkpoint (validation: the checkpoint of epoch e then holds e's validation). Each epoch's
    line is logged at INFO. Raises
    :class:`TrainingDivergedError` when the loss becomes NaN or infinite; warns once
    (:class:`~gru4rec.errors.LossExplodedWarning`, before ``on_epoch_end``) at the first epoch whose
    loss is above :func:`loss_bound` of the first step this call trains. ``context`` (float32
    [E × 5], aligned with ``items``): the events' click context, for a network with click
    context (it follows the sessions' order and reaches each step as ``Schedule.context``).
    """
    config = trainer.config
    last = config.n_epochs if n_epochs is None else n_epochs
    rng = rng if rng is not None else np.random.default_rng(config.seed + 3)
    if start is not None:
        first_epoch = start.epoch
        rng.bit_generator.state = start.rng_state
    schedule: Schedule | None = None
    # On the CPU the thread count is chosen from the steps' own times (gru4rec/machine/threads.py),
    # across the epochs of this call; on a GPU the host's threads do not set the pace.
    threads = online_choice("training") if trainer.device.type == "cpu" else None
    bound: float | None = None
    warned = False
    if trainer.sampler is not None:
        trainer.sampler.prepare()  # the store's first draw is set-up, outside the first epoch's time
    for epoch in range(first_epoch, last + 1):
        rng_state = dict(rng.bit_generator.state)  # a mid-epoch checkpoint redraws this epoch's order from it
        if schedule is None or config.train_random_order:
            ep_context = context
            if config.train_random_order and context is not None:
                # The events' positions reordered once, then both arrays gathered by them.
                moved, ep_offsets = reorder(np.arange(len(items)), offsets, rng.permutation(len(offsets) - 1))
                ep_items, ep_context = items[moved], context[moved]
            elif config.train_random_order:
                ep_items, ep_offsets = reorder(items, offsets, rng.permutation(len(offsets) - 1))
            else:
                ep_items, ep_offsets = items, offsets
            schedule = build_schedule(ep_items, ep_offsets, config.batch_size, config.n_sample, trainer.device, trainer.dtype,
                                      context=ep_context)
        if schedule.n_steps == 0:
            raise TrainingDivergedError("the training data has no session of length 2 or more: nothing to train on")
        resumed = start if start is not None and start.epoch == epoch and start.step > 0 else None
        if resumed is not None:
            assert resumed.hidden is not None
            for h, saved in zip(trainer.hidden, resumed.hidden):
                h.copy_(saved)  # in place: a captured CUDA graph reads these buffers
        else:
            trainer.reset_hidden()
        stats = _run_epoch(trainer, schedule, epoch, progress, rng_state, resumed, checkpoints, threads)
        log.info(stats.line())
        if bound is None:
            bound = loss_bound(config, stats.first_step_loss)
        if not warned and stats.loss > bound:
            warned = True
            warnings.warn(LossExplodedWarning(
                f"the training loss exploded in epoch {epoch}: {stats.loss:.6g}, above {bound:.6g} "
                f"({EXPLOSION_FACTOR:g}x the untrained level); lower learning_rate or momentum (or set grad_cap)"
            ), stacklevel=2)
        if on_epoch_end is not None:
            on_epoch_end(stats)  # before the epoch's checkpoint, which then holds what it did
        if checkpoints is not None:
            checkpoints.write(EpochPosition(epoch + 1, 0, 0, 0.0, None, dict(rng.bit_generator.state)))
        yield stats


def _run_epoch(
    trainer: Trainer,
    schedule: Schedule,
    epoch: int,
    progress: bool,
    rng_state: dict[str, Any],
    resumed: EpochPosition | None,
    checkpoints: StepCheckpoints | None,
    threads: ThreadChoice | None = None,
) -> EpochStats:
    """One epoch of ``schedule``'s steps (from ``resumed``'s step when given); the epoch loss is
    the step losses' mean weighted by their active rows. ``threads`` is told every step's time
    (CPU steps are synchronous: the clock the loop reads anyway measures them, no sync added);
    checkpoint writes and the loss checks are left out of those times."""
    device = trainer.device
    weights = torch.as_tensor(schedule.n_active, device=device, dtype=torch.float64)
    step_ids = torch.arange(schedule.n_steps, device=device)
    step_losses = torch.zeros(schedule.n_steps, device=device, dtype=torch.float64)
    first_step, seconds_before = 0, 0.0
    if resumed is not None:
        assert resumed.step_losses is not None
        if resumed.n_steps != schedule.n_steps:
            raise TrainingDivergedError(  # the data fingerprint matched, so this is not the user's doing
                f"the checkpoint's epoch {epoch} has {resumed.n_steps} steps, this one {schedule.n_steps}"
            )
        first_step, seconds_before = resumed.step, resumed.seconds
        step_losses[:first_step].copy_(resumed.step_losses)

    def accumulate(loss: Tensor, t: Tensor) -> None:
        """Device-side bookkeeping of step ``t``: its loss goes into the epoch's loss vector."""
        step_losses.index_copy_(0, t.view(1), loss.view(1).to(torch.float64))

    def check(done: int) -> float:
        """The epoch loss so far — the mean of the step losses weighted by their active rows —
        and the NaN check (one host sync)."""
        losses = step_losses[:done]
        bad = ~torch.isfinite(losses)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise TrainingDivergedError(
                f"the loss became NaN or infinite in epoch {epoch} at step {first + 1} of {schedule.n_steps}; "
                "lower learning_rate or momentum (or set grad_cap)"
            )
        return float((losses * weights[:done]).sum()) / max(float(schedule.n_active[:done].sum()), 1.0)

    # Trainer.train_step_at takes the Schedule that StepSchedule describes (a protocol's parameter
    # cannot be narrower than its own): the one place where the two meet.
    # A captured step reads the schedule's items only: a step with click context runs as it is.
    replay = trainer.backend.graph_replay and not trainer.reference and schedule.context is None
    run = graphed_epoch_runner(trainer, schedule, accumulate) if replay else None  # type: ignore[arg-type]  # see above
    if run is None:
        inputs, targets, active, keep = schedule.inputs, schedule.targets, schedule.active, schedule.keep
        ctx = schedule.context

        def run(t: int) -> None:
            accumulate(trainer.train_step(inputs[t], targets[t], active[t], keep[t], context=None if ctx is None else ctx[t]),
                       step_ids[t])

    bar = progress_bar(schedule.n_steps, f"Epoch{epoch}", enabled=progress, unit="mb", initial=first_step)
    with bar, threads if threads is not None else contextlib.nullcontext():
        start = last = step_start = time.perf_counter()
        paused = 0.0  # seconds spent writing checkpoints: not training time
        for t in range(first_step, schedule.n_steps):
            run(t)
            now = time.perf_counter()
            if threads is not None:
                threads.observe(now - step_start)
            step_start = now
            if checkpoints is not None and checkpoints.due(now):
                checkpoints.write(EpochPosition(epoch, t + 1, schedule.n_steps, seconds_before + now - start - paused,
                                                step_losses[: t + 1], rng_state))
                paused += time.perf_counter() - now
                step_start = time.perf_counter()
            if now - last >= CHECK_INTERVAL:  # also bounds how long a diverged run goes on unnoticed
                last = now
                bar.set_postfix_str(f"loss {check(t + 1):.4f}", refresh=False)
                bar.update(t + 1 - bar.n)
                step_start = time.perf_counter()
        mean_loss = check(schedule.n_steps)
        first_loss = float(step_losses[first_step]) if first_step < schedule.n_steps else math.nan
        seconds = seconds_before + time.perf_counter() - start - paused
    return EpochStats(epoch=epoch, loss=mean_loss, seconds=seconds, n_steps=schedule.n_steps, n_events=schedule.n_events,
                      first_step_loss=first_loss)
