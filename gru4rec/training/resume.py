"""Resumable training: what a training checkpoint keeps, when it is written, and how a run
continues from it to the same final model as an uninterrupted run.

A checkpoint is one file, :data:`CHECKPOINT_NAME` in the checkpoint folder, written atomically
through :mod:`gru4rec.formats.checkpoint` (``save_file``/``load_file``). It is taken at a *step
boundary* and holds everything the rest of the run depends on:

* the weights and the optimiser's tables and step count;
* the position: epochs completed and steps done in the next one (0 at an epoch end), and that
  epoch's step losses and seconds so far, so that its reported loss is the uninterrupted run's;
* the slots' hidden states (mid-epoch);
* every random state training draws from: the sample store's generator, rows and cursor, the
  dropout generator, and the numpy generator of the session orders *as it was at the start of
  the epoch* — resuming redraws that epoch's order from it, then skips the steps already done.
  (The weights' initialisation generator is spent before the first step; torch's global
  generator is not used by training.)

When: after every epoch; every ``every_minutes`` at the first step boundary after the time is
up; and at the first step boundary after SIGINT (Ctrl-C) or SIGTERM (a preempted job), after
which training stops with :class:`~gru4rec.errors.TrainingInterrupted`. The epoch loop asks
:meth:`TrainingCheckpoint.due` at every step: a clock it already reads and a flag, no device
sync. A second signal acts at once (the handlers are back to the previous ones by then).

A checkpoint folder already holding a checkpoint is refused unless the run resumes it, resuming
without one is an error, and a finished run removes its checkpoint unless asked to keep it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from torch import Tensor

from gru4rec.config import Config
from gru4rec.errors import Gru4RecError, ModelFileError, TrainingInterrupted
from gru4rec.files import check_output_path
from gru4rec.formats import checkpoint
from gru4rec.formats.checkpoint import MODEL_SUFFIX
from gru4rec.training.trainer import Trainer, TrainerState

__all__ = ["CHECKPOINT_KIND", "CHECKPOINT_NAME", "CheckpointPart", "EpochPosition", "TrainingCheckpoint"]

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "gru4rec-training-checkpoint"
#: The checkpoint's file name inside the checkpoint folder.
CHECKPOINT_NAME = "checkpoint" + MODEL_SUFFIX
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class EpochPosition:
    """Where training stands at a step boundary: ``step`` of the ``n_steps`` steps of ``epoch``
    are done (``step == 0``: the epoch has not started)."""

    epoch: int
    step: int
    n_steps: int
    #: Training seconds of this epoch so far.
    seconds: float
    #: float64 [step]: the losses of the steps done (on the training device; None when step is 0).
    step_losses: Tensor | None
    #: The numpy generator's state at the start of this epoch (before its session order is drawn).
    rng_state: dict[str, Any]
    #: The slots' hidden states to continue from (a restored mid-epoch position only).
    hidden: list[Tensor] | None = None


def _attributes_digest(trainer: Trainer) -> str | None:
    """SHA-256 of the item attributes the trainer's network composes its rows with (their
    encoding, cold ids and encoded tensors), None without: a resumed run must compose the same
    rows, and the checkpoint's buffers would otherwise silently override today's table."""
    rows = trainer.net.attributes
    if rows is None:
        return None
    tensors, meta = rows.source.to_tensors()
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode())
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].numpy().tobytes())
    return digest.hexdigest()


class CheckpointPart(Protocol):
    """More training state that a checkpoint carries besides the trainer's (e.g. the
    validation's best weights and history, :class:`gru4rec.fitting.validation.Validator`)."""

    def checkpoint_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Its tensors (names distinct from the trainer's) and its JSON metadata."""
        ...

    def load_checkpoint_state(self, tensors: dict[str, Tensor], meta: dict[str, Any] | None, path: Any) -> None:
        """Continue from a checkpoint (``meta`` None: the checkpoint was written without this part)."""
        ...


class TrainingCheckpoint:
    """The checkpoint of one training run in ``folder``.

    The constructor checks the folder (writable; holds a checkpoint exactly when ``resume``);
    :meth:`attach` binds the run's network and trainer and, when resuming, restores them and
    returns the position to continue from; the epoch loop calls :meth:`due` and :meth:`write`;
    :meth:`catching_signals` turns SIGINT/SIGTERM into a checkpoint at the next step boundary;
    :meth:`remove` deletes the file when the run has finished.
    """

    def __init__(self, folder: str | os.PathLike[str], *, resume: bool = False, every_minutes: float | None = None) -> None:
        if every_minutes is not None and not (isinstance(every_minutes, (int, float)) and every_minutes > 0):
            raise Gru4RecError(f"checkpoint_every must be a positive number of minutes, got {every_minutes!r}")
        self.folder = check_output_path(folder, "checkpoint folder", force=True, folder=True)
        self.path = self.folder / CHECKPOINT_NAME
        if resume and not self.path.exists():
            raise Gru4RecError(f"nothing to resume: checkpoint folder {self.folder} holds no checkpoint ({CHECKPOINT_NAME})")
        if not resume and self.path.exists():
            raise Gru4RecError(
                f"checkpoint folder {self.folder} holds a checkpoint of an earlier run: resume it "
                "(--resume, resume=True) or remove it; it is not overwritten"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.resume = resume
        self.every_seconds = every_minutes * 60.0 if every_minutes is not None else None
        self._next_due = float("inf")
        self._signal: int | None = None
        self._run: tuple[Trainer, Config, dict[str, Any]] | None = None
        self._extra: CheckpointPart | None = None

    # ------------------------------------------------------------------ binding and restoring

    def attach(
        self, trainer: Trainer, config: Config, fingerprint: dict[str, Any], *, extra: CheckpointPart | None = None
    ) -> EpochPosition | None:
        """Bind the run (its trainer, whose ``net`` it saves, its config, a summary of its data
        that a resumed run must match, and any ``extra`` state to carry); when resuming, load the
        checkpoint into the trainer (and ``extra``) and return the position to continue from."""
        self._run = (trainer, config, fingerprint)
        self._extra = extra
        self._restart_clock()
        return self._restore() if self.resume else None

    def _restart_clock(self) -> None:
        if self.every_seconds is not None:
            self._next_due = time.perf_counter() + self.every_seconds

    def _restore(self) -> EpochPosition:
        assert self._run is not None
        trainer, config, fingerprint = self._run
        tensors, meta = checkpoint.load_file(self.path)
        if meta.get("kind") != CHECKPOINT_KIND:
            raise ModelFileError(f"{self.path} is not a gru4rec training checkpoint")
        # n_epochs may differ: a finished run can be resumed to train for more epochs.
        theirs = {k: v for k, v in meta["config"].items() if k != "n_epochs"}
        ours = {k: v for k, v in config.to_dict().items() if k != "n_epochs"}
        if theirs != ours:
            changed = sorted(k for k in ours if theirs.get(k) != ours[k])
            raise ModelFileError(
                f"{self.path} was written with other hyperparameters ({', '.join(changed)}); "
                "resume with the same ones or remove the checkpoint"
            )
        if meta["data"] != fingerprint:
            raise ModelFileError(f"{self.path} was written for other training data ({meta['data']}); resume on the same data or remove it")
        if meta.get("item_attributes") != _attributes_digest(trainer):
            theirs_with = "with" if meta.get("item_attributes") else "without"
            ours_with = "with" if _attributes_digest(trainer) else "without"
            raise ModelFileError(
                f"{self.path} was written {theirs_with} item attributes and this run is {ours_with}"
                + (" other ones (another item_features table, types or min_count)" if theirs_with == ours_with else "")
                + "; resume with the same item_features or remove it"
            )
        epoch, step = int(meta["epoch"]) + 1, int(meta.get("step", 0))
        if step > 0 and epoch > config.n_epochs:
            raise Gru4RecError(
                f"{self.path} stopped inside epoch {epoch}, after n_epochs={config.n_epochs}: resume with n_epochs >= {epoch}"
            )
        trainer.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
        state: TrainerState = {
            "optimizer": {k[4:]: v for k, v in tensors.items() if k.startswith("opt.")},
            "dropout_gen": tensors["rng.dropout"],
            "sampler": {},
        }
        if "rng.sampler" in tensors:
            state["sampler"] = {"generator": tensors["rng.sampler"], "store": tensors["sampler.store"], "cursor": meta["sampler_cursor"]}
        trainer.load_state_dict(state)
        if self._extra is not None:
            self._extra.load_checkpoint_state(tensors, meta.get("extra"), self.path)
        hidden = None
        losses = None
        if step > 0:
            hidden = [tensors[f"hidden.{i}"].to(trainer.device) for i in range(len(trainer.hidden))]
            losses = tensors["epoch.step_losses"].to(trainer.device)
        log.info("Resuming from %s after epoch %d%s", self.path, epoch - 1,
                 f" and {step} of the {meta['n_steps']} steps of epoch {epoch}" if step else "")
        return EpochPosition(epoch, step, int(meta.get("n_steps", 0)), float(meta.get("epoch_seconds", 0.0)),
                             losses, meta["numpy_rng"], hidden)

    # ------------------------------------------------------------------ writing (the epoch loop's side)

    def due(self, now: float) -> bool:
        """Whether to write a checkpoint at this step boundary (``now``: ``time.perf_counter()``)."""
        return self._signal is not None or now >= self._next_due

    def write(self, position: EpochPosition) -> None:
        """Write the checkpoint of ``position`` (the trainer's state now); after a signal, stop
        training by raising :class:`~gru4rec.errors.TrainingInterrupted`."""
        assert self._run is not None, "attach() first"
        trainer, config, fingerprint = self._run
        state = trainer.state_dict()
        tensors: dict[str, Tensor] = {f"net.{k}": v for k, v in trainer.net.state_dict().items()}
        tensors.update({f"opt.{k}": v for k, v in state["optimizer"].items()})
        tensors["rng.dropout"] = state["dropout_gen"]
        sampler = state["sampler"]
        if sampler:
            tensors["rng.sampler"] = sampler["generator"]
            tensors["sampler.store"] = sampler["store"]
        mid_epoch = 0 < position.step
        if mid_epoch:
            assert position.step_losses is not None
            tensors.update({f"hidden.{i}": h for i, h in enumerate(trainer.hidden)})
            tensors["epoch.step_losses"] = position.step_losses
        meta = {
            "kind": CHECKPOINT_KIND,
            "epoch": position.epoch - 1,  # epochs completed
            "step": position.step,  # steps done in the next epoch
            "n_steps": position.n_steps,
            "epoch_seconds": position.seconds,
            "config": config.to_dict(),
            "data": fingerprint,
            "sampler_cursor": sampler.get("cursor", 0),
            "numpy_rng": position.rng_state,
        }
        digest = _attributes_digest(trainer)
        if digest is not None:  # a plain run's checkpoint keeps its keys
            meta["item_attributes"] = digest
        if self._extra is not None:
            extra_tensors, meta["extra"] = self._extra.checkpoint_state()
            tensors.update(extra_tensors)
        checkpoint.save_file(self.path, tensors, meta, overwrite=True)
        self._restart_clock()
        where = f"epoch {position.epoch}, step {position.step} of {position.n_steps}" if mid_epoch else f"end of epoch {position.epoch - 1}"
        if self._signal is not None:
            signum, self._signal = self._signal, None  # handled: by this checkpoint and the exception
            name = signal.Signals(signum).name
            log.info("%s: checkpoint at %s written to %s", name, where, self.path)
            raise TrainingInterrupted(name, signum, str(self.path))
        log.log(logging.INFO if mid_epoch else logging.DEBUG, "Checkpoint at %s written to %s", where, self.path)

    @contextlib.contextmanager
    def catching_signals(self) -> Iterator[None]:
        """While training: SIGINT and SIGTERM ask for a checkpoint at the next step boundary
        instead of stopping the process mid-step. Only in the main thread (where Python
        delivers signals); elsewhere the signals keep their handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[int, Any] = {}

        def handler(signum: int, frame: FrameType | None) -> None:
            self._signal = signum
            restore()  # a second signal stops at once

        def restore() -> None:
            for number, old in previous.items():
                signal.signal(number, old if old is not None else signal.SIG_DFL)

        for number in _SIGNALS:
            previous[number] = signal.signal(number, handler)
        try:
            yield
        finally:
            restore()
        if self._signal is not None:  # it came after the last step boundary: do not swallow it
            raise TrainingInterrupted(signal.Signals(self._signal).name, self._signal, str(self.path))

    # ------------------------------------------------------------------ the end

    def remove(self) -> None:
        """Delete the checkpoint file (the run is complete); the folder stays."""
        self.path.unlink(missing_ok=True)
        log.debug("Removed the finished run's checkpoint %s", self.path)

