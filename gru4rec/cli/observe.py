"""The flags that let a user watch a training run, shared by ``gru4rec train`` and ``run.py``:
``--valid`` and ``--early-stop`` (:mod:`gru4rec.fitting.validation`), ``--run-dir``
(:mod:`gru4rec.tracking.runs`) and ``--tensorboard`` (:mod:`gru4rec.tracking.tensorboard`).

:class:`Observation` checks them all before training starts (nothing is trained for an output
that could not be written), gives ``fit`` its validation arguments and per-epoch callbacks, and
at the end writes the run folder's metrics and model.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.cli.common import UsageError, check_readable, flag, positive_int
from gru4rec.errors import Gru4RecError
from gru4rec.tracking.runs import RUN_CUTOFFS

if TYPE_CHECKING:  # the heavy imports happen inside the methods
    from gru4rec.config import Config
    from gru4rec.recommender import GRU4Rec

__all__ = ["ObserveFlags", "Observation"]

log = logging.getLogger(__name__)



_GROUP = "validation and tracking"


@dataclass(frozen=True, kw_only=True)
class ObserveFlags:
    """``--valid``, ``--early-stop``, ``--valid-metric``, ``--run-dir``, ``--tensorboard``: a field
    per flag, declared with it (a command's settings extend this class)."""

    valid: str | None = flag("--valid", metavar="FILE", group=_GROUP, default=None,
                             help="validation events, evaluated after every epoch at the -m cutoffs with the -e ties "
                                  "(batched; items unknown to the model are dropped)")
    early_stop: int | None = flag("--early-stop", metavar="PATIENCE", type=positive_int, group=_GROUP, default=None,
                                  help="with --valid: stop when --valid-metric has not improved for PATIENCE epochs, "
                                       "and keep the best epoch's weights")
    valid_metric: str = flag("--valid-metric", metavar="METRIC", group=_GROUP, default="recall@20",
                             help="the validation metric that chooses the best epoch: recall@K, mrr@K or ndcg@K "
                                  "(default: recall@20)")
    run_dir: str | None = flag("--run-dir", metavar="DIR", group=_GROUP, default=None,
                               help="write the run to DIR: command.txt, config.json, epochs.jsonl (per epoch: loss, "
                                    "time, speed, peak memory, validation metrics), metrics.json (the test evaluation "
                                    "with breakdowns) and model.safetensors; a folder with files in it needs --force. "
                                    "Look at it with 'gru4rec report DIR'")
    tensorboard: str | None = flag("--tensorboard", metavar="DIR", group=_GROUP, default=None,
                                   help="write per-epoch scalars (loss, speed, memory, validation metrics; on CUDA GPU "
                                        "utilisation and memory) for TensorBoard to DIR (needs: pip install "
                                        "'gru4rec[tensorboard]')")


class Observation:
    """The validation and tracking of one training command.

    ``args``: the flags of :func:`add_arguments`; ``command``: the command line
    as run; ``cutoffs``/``mode``: the command's evaluation cutoffs and tie mode; ``force``: the
    command's overwrite flag. Everything is checked here, before any work.
    """

    def __init__(self, args: ObserveFlags, *, command: Sequence[str], cutoffs: Sequence[int], mode: str, force: bool) -> None:
        from gru4rec.fitting.validation import parse_metric
        from gru4rec.tracking.runs import RunFolder

        self.valid: str | None = args.valid
        self.early_stop: int | None = args.early_stop
        self.command = list(command)
        self.cutoffs = list(cutoffs)
        self.mode = mode
        if self.early_stop is not None and self.valid is None:
            raise UsageError("--early-stop needs --valid (the events to validate on)")
        try:
            self.metric = parse_metric(args.valid_metric).key
        except Gru4RecError as exc:
            raise UsageError(f"--valid-metric: {exc}") from exc
        check_readable([self.valid] if self.valid else None, "validation file")
        self.run_folder = RunFolder(args.run_dir) if args.run_dir else None
        if self.run_folder is not None:
            try:
                self.run_folder.check(force=force)
            except Gru4RecError as exc:
                raise UsageError(str(exc)) from exc
        self.tensorboard_dir: str | None = args.tensorboard
        if self.tensorboard_dir is not None:
            from gru4rec.tracking.tensorboard import import_summary_writer

            import_summary_writer()  # the missing package is found now, not after training
            if Path(self.tensorboard_dir).exists() and not Path(self.tensorboard_dir).is_dir():
                raise UsageError(f"--tensorboard {self.tensorboard_dir} is a file, not a folder")
        self._tensorboard: Any = None

    @property
    def eval_cutoffs(self) -> list[int]:
        """The cutoffs of the final evaluation's JSON (more with a run folder, for the report's curves)."""
        return sorted(set(self.cutoffs) | (set(RUN_CUTOFFS) if self.run_folder is not None else set()))

    def start(self, config: Config, *, device: str, precision: str, data: str, tests: Sequence[str] | None) -> dict[str, Any]:
        """Create the run folder and the TensorBoard writer; returns the keyword arguments of
        ``GRU4Rec.fit`` for validation and the per-epoch callbacks."""
        import torch

        from gru4rec import __version__
        from gru4rec.machine.devices import resolve_device

        resolved = resolve_device(device)
        callbacks: list[Any] = []
        if self.run_folder is not None:
            command = self.command
            if not any(arg == "--threads" or arg.startswith("--threads=") for arg in command):
                # The losses depend on the thread count (parallel sums), so the command that
                # repeats this run names the count it ran with.
                command = [*command, "--threads", str(torch.get_num_threads())]
            self.run_folder.start(command, {
                "config": config.to_dict(),
                "param_string": config.to_param_string(only_changed=True),
                "device": str(resolved),
                "precision": precision,
                "threads": torch.get_num_threads(),
                "train": data,
                "valid": self.valid,
                "valid_metric": self.metric if self.valid else None,
                "early_stop": self.early_stop,
                "test": list(tests or []),
                "cutoffs": self.cutoffs,
                "eval_mode": self.mode,
                "gru4rec_version": __version__,
                "torch_version": torch.__version__,
                "python_version": sys.version.split()[0],
            })
            callbacks.append(self.run_folder)
            log.info("Writing the run to %s", self.run_folder.path)
        if self.tensorboard_dir is not None:
            from gru4rec.tracking.tensorboard import TensorBoardLogger

            self._tensorboard = TensorBoardLogger(self.tensorboard_dir, device=resolved)
            callbacks.append(self._tensorboard)
            log.info("TensorBoard scalars go to %s (view: tensorboard --logdir %s)", self.tensorboard_dir, self.tensorboard_dir)
        options: dict[str, Any] = {"callback": callbacks}
        if self.valid is not None:
            options.update(valid=self.valid, early_stop=self.early_stop, metric=self.metric,
                           valid_cutoffs=self.cutoffs, valid_mode=self.mode)
        return options

    def trained(self, model: GRU4Rec) -> None:
        """After training: close the TensorBoard writer, save the model into the run folder."""
        self.close()
        if model.best_epoch is not None and self.early_stop is not None:
            log.info("Best epoch on %s: %d (%s)", self.valid, model.best_epoch, self.metric)
        if self.run_folder is not None:
            model.save(self.run_folder.model_path, overwrite=True)
            log.info("Saved model to %s", self.run_folder.model_path)

    def evaluated(self, report: dict[str, Any]) -> None:
        """After the test evaluation: write the run folder's metrics.json."""
        if self.run_folder is not None:
            self.run_folder.write_metrics(report)

    def close(self) -> None:
        """Close the TensorBoard writer (also when training failed)."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

