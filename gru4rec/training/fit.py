"""One training run of ``GRU4Rec.fit``: the network (fresh, or a warm start's), its trainer, the
resumable checkpoint and the epochs, with validation as a hook.

:class:`TrainingRun` is what ``fit`` does once the training sessions and item supports are
ready, up to the last epoch: it seeds torch, draws the network (or grows a warm start's,
:mod:`gru4rec.training.warm_start`), builds the :class:`~gru4rec.training.trainer.Trainer` (carrying a warm
start's optimiser state), binds a :class:`~gru4rec.training.resume.TrainingCheckpoint` and runs
:func:`~gru4rec.training.loop.train_epochs`. Validation is anything with the
:class:`EpochValidation` methods; training never imports the evaluator, so the wiring of
``gru4rec.fitting.validation.Validator``, the data and the per-epoch callbacks is one layer up, in
:mod:`gru4rec.fitting`.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap, Sessions
from gru4rec.errors import DataError
from gru4rec.items.attributes import ItemAttributes
from gru4rec.items.context import sessions_context
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.loop import EpochStats, train_epochs
from gru4rec.training.resume import CheckpointPart, TrainingCheckpoint
from gru4rec.training.trainer import Trainer
from gru4rec.training.warm_start import carry_optimizer_state, warm_net

__all__ = ["EpochValidation", "TrainedEpoch", "TrainingRun", "WarmStart"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStart:
    """What a warm start takes from the model it starts from (``fit(init_from=...)``): its
    network, item map, optimiser state (or None) and config; ``name`` names it in messages."""

    name: str
    net: GRU4RecNet
    item_map: ItemMap
    optimizer_state: dict[str, torch.Tensor] | None
    config: Config


class EpochValidation(CheckpointPart, Protocol):
    """What a training run asks of validation (:class:`gru4rec.fitting.validation.Validator`)."""

    def after_epoch(self, epoch: int) -> dict[str, float]:
        """Evaluate after ``epoch``; the metrics by name (``'recall@20'``, ...)."""
        ...

    @property
    def should_stop(self) -> bool:
        """Whether training should stop now (early stopping)."""
        ...


@dataclass(frozen=True)
class TrainedEpoch:
    """One finished epoch: its statistics and, with validation, its metrics."""

    stats: EpochStats
    valid: dict[str, float] | None


class TrainingRun:
    """The network and trainer of one ``fit``, built on construction; :meth:`epochs` trains.

    The network is drawn from ``config.seed`` (torch's global generator is seeded with it too,
    as the trainer draws from it) on the CPU and moved to ``device``; with ``warm`` it holds the
    warm start's weights and rows (:func:`~gru4rec.training.warm_start.warm_net`) and the trainer its
    optimiser state where it can (:func:`~gru4rec.training.warm_start.carry_optimizer_state`).
    """

    def __init__(
        self,
        config: Config,
        n_items: int,
        item_support: np.ndarray,
        *,
        device: torch.device,
        precision: str = "float32",
        warm: WarmStart | None = None,
        attributes: ItemAttributes | None = None,
    ) -> None:
        """``attributes``: item attributes on the ``n_items`` items (issue 49; with ``warm``, grown
        from its own: :meth:`~gru4rec.items.attributes.ItemAttributes.warm_start`)."""
        torch.manual_seed(config.seed)
        init_gen = torch.Generator().manual_seed(config.seed)
        if warm is None:
            net = GRU4RecNet(n_items, config, generator=init_gen, attributes=attributes)
        else:
            net = warm_net(warm.net, n_items, config, generator=init_gen, attributes=attributes)
            log.info("Warm start from %s: %d items kept, %d new", warm.name, len(warm.item_map), n_items - len(warm.item_map))
        self.config = config
        self.net = net.to(device).eval()
        self.trainer = Trainer(self.net, config, item_support, precision=precision)
        log.debug("training backend: %s", self.trainer.backend.describe())
        if warm is not None:
            carry_optimizer_state(self.trainer.optimizer, warm.optimizer_state, warm.config, len(warm.item_map), warm.name)
        #: The last epoch whose weights the network holds (a resumed run starts after its checkpoint's).
        self.epochs_done = 0

    def epochs(
        self,
        sessions: Sessions,
        *,
        checkpoint: TrainingCheckpoint | None = None,
        fingerprint: dict[str, Any] | None = None,
        validation: EpochValidation | None = None,
        progress: bool = True,
    ) -> Generator[TrainedEpoch, None, None]:
        """Train on ``sessions`` epoch after epoch, yielding each one when it is done (its
        checkpoint written); the caller may stop early. Use it in a ``with contextlib.closing(...)``
        so that the signal handlers of ``checkpoint`` are restored when the caller stops.

        ``checkpoint``: bound to this run with ``fingerprint`` (what a resumed run's data must
        match) and ``validation`` (its state is part of the checkpoint); when it resumes, the
        epochs continue from its position. ``validation.after_epoch`` runs after every epoch,
        before that epoch's checkpoint (so the checkpoint of epoch e holds e's validation); the
        run ends after the epoch that sets ``validation.should_stop`` (or at once when a resumed
        run had already stopped)."""
        config = self.config
        rng = np.random.default_rng(config.seed + 3)
        start = checkpoint.attach(self.trainer, config, fingerprint or {}, extra=validation) if checkpoint is not None else None
        self.epochs_done = start.epoch - 1 if start is not None else 0
        if validation is not None and validation.should_stop:  # resumed after it had stopped early
            return
        scores: dict[int, dict[str, float]] = {}
        validate = None if validation is None else (lambda stats: scores.__setitem__(stats.epoch, validation.after_epoch(stats.epoch)))
        context = None
        if self.net.uses_context:  # the events' click context, computed once for every epoch
            if sessions.times is None:
                raise DataError(f"click_context: the training sessions have no times (column {config.time_key!r}); "
                                "build them with sessions_from_events")
            context = sessions_context(sessions.times, sessions.offsets)
        with checkpoint.catching_signals() if checkpoint is not None else contextlib.nullcontext():
            for stats in train_epochs(self.trainer, sessions.items, sessions.offsets, rng=rng, progress=progress,
                                      start=start, checkpoints=checkpoint, on_epoch_end=validate, context=context):
                self.epochs_done = stats.epoch
                yield TrainedEpoch(stats, scores.get(stats.epoch))
                if validation is not None and validation.should_stop:
                    return
