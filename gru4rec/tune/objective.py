"""The trial objective: one in-process training on TRAIN with the trial's parameters, measured
on VALID after every epoch (reported to Optuna, which may prune the trial) or once at the end,
and the failures that make a trial FAIL instead of stopping the study (an invalid combination
of parameters, a NaN or infinite loss, out of memory).

A trial whose loss explodes (:class:`~gru4rec.errors.LossExplodedWarning`: an epoch loss above
three times the untrained level, :func:`gru4rec.training.loop.loss_bound`) is stopped at the end of that
epoch, before its validation, and PRUNED, with the warning's text in its ``diverged`` attribute:
pruned rather than failed so that the TPE sampler counts it among the worst trials (it ignores
failed ones) and steers away from its learning rate.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gru4rec.errors import ConfigError, LossExplodedWarning, TrainingDivergedError
from gru4rec.log import LOGGER_NAME
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.settings import ParoptSettings
from gru4rec.tune.space import ParamSpec, trial_param_string
from gru4rec.tune.trial_runs import trial_run_folder, write_trial_metrics

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna
    import pandas as pd

    from gru4rec.config import Config

__all__ = ["Objective", "TrialFailed", "quiet_training", "worker_tag"]

# The loggers of the training loop and of validation (the per-epoch lines); a trial silences
# them unless verbose.
_TRAINING_LOGGERS = (f"{LOGGER_NAME}.training", f"{LOGGER_NAME}.validation")


class TrialFailed(Exception):
    """A trial that cannot give a value; Optuna records it as FAIL (``catch``)."""


def _is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` says that host or device memory ran out (torch words it several ways)."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text
    )


def _one_line(exc: BaseException, limit: int = 1000) -> str:
    """``Type: message`` on one line (a ConfigError lists its problems on several)."""
    text = " ".join(part.strip() for part in str(exc).strip().splitlines())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}".rstrip(": ")


def worker_tag(pid: int | None = None) -> str:
    """``host:pid`` of the process ``pid`` (default: this one), the trials' ``worker`` attribute."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


class _EpochReporter:
    """The ``fit`` callback: evaluate on VALID after every epoch, report, maybe prune."""

    def __init__(
        self, trial: optuna.trial.Trial, score: Callable[[Any], float], n_epochs: int, per_epoch: bool
    ) -> None:
        self.trial = trial
        self.score = score
        self.n_epochs = n_epochs
        self.per_epoch = per_epoch
        self.epochs = 0
        self.value: float | None = None
        self.metric_key = ""

    def __call__(self, info: Any) -> None:
        self.epochs += 1
        loss = float(info.loss)
        if not math.isfinite(loss):  # the trainer should raise first; never score a broken model
            raise TrainingDivergedError(f"the training loss became {loss} in epoch {self.epochs}")
        if not self.per_epoch:
            return
        # With early stopping fit has just validated the epoch: its value is in info.valid.
        self.value = info.valid[self.metric_key] if info.valid is not None else self.score(info.model)
        # Steps are 0-based epochs: MedianPruner's n_warmup_steps = epochs exempt from pruning.
        self.trial.report(self.value, self.epochs - 1)
        # The last epoch's value is the result: a finished trial is not thrown away.
        if self.epochs < self.n_epochs and self.trial.should_prune():
            optuna = import_optuna()
            raise optuna.TrialPruned(f"pruned after epoch {self.epochs}")


class Objective:
    """The Optuna objective: one in-process training on TRAIN, validated on VALID."""

    def __init__(
        self,
        settings: ParoptSettings,
        space: Sequence[ParamSpec],
        base: Config,
        train: pd.DataFrame,
        valid: pd.DataFrame,
        per_epoch: bool,
        run_id: str = "",
    ) -> None:
        self.settings = settings
        self.run_id = run_id
        self.space = list(space)
        self.base = base
        self.train = train
        self.valid = valid
        self.per_epoch = per_epoch
        self.worker = worker_tag()

    @property
    def metric_key(self) -> str:
        """The objective as a validation metric key, e.g. ``'mrr@20'``."""
        return f"{self.settings.primary_metric}@{self.settings.measure}"

    def fit_options(self) -> dict[str, Any]:
        """``fit``'s validation arguments when trials stop early (``--early-stop``)."""
        if self.settings.early_stop is None:
            return {}
        return {"valid": self.valid, "early_stop": self.settings.early_stop, "metric": self.metric_key,
                "valid_cutoffs": (self.settings.measure,), "valid_mode": self.settings.eval_mode}

    def score(self, model: Any) -> float:
        """The objective metric of ``model`` on VALID."""
        from gru4rec.evaluation.evaluator import evaluate

        net = getattr(model, "net", None)
        was_training = bool(getattr(net, "training", False))
        try:
            result = evaluate(model, self.valid, cutoffs=(self.settings.measure,), mode=self.settings.eval_mode)
        finally:
            if net is not None:  # training goes on after the callback: restore dropout mode
                net.train(was_training)
        value = float(getattr(result, self.settings.primary_metric)[self.settings.measure])
        if not math.isfinite(value):
            raise TrainingDivergedError(f"the validation {self.settings.primary_metric} is {value}")
        return value

    def __call__(self, trial: optuna.trial.Trial) -> float:
        optuna = import_optuna()
        from gru4rec.recommender import GRU4Rec

        # Who runs the trial, first: a run counts its trials by "run", and the parent of a killed
        # local worker finds the trial it was running by "worker".
        trial.set_user_attr("run", self.run_id)
        trial.set_user_attr("worker", self.worker)
        with warnings.catch_warnings():
            # An enqueued value off the space's grid: paropt warned about it when queueing it
            # (gru4rec/tune/enqueue.py); Optuna's own UserWarning would say it a second time.
            warnings.filterwarnings("ignore", message=r"Fixed parameter .* is out of range", category=UserWarning)
            params = {spec.name: spec.suggest(trial) for spec in self.space}
        searched = trial_param_string(self.space, params)
        trial.set_user_attr("param_string", searched)
        model = None
        reporter: _EpochReporter | None = None
        start = time.perf_counter()
        try:
            config = self.base.replace_from_string(searched)
            reporter = _EpochReporter(trial, self.score, config.n_epochs, self.per_epoch)
            reporter.metric_key = self.metric_key
            model = GRU4Rec(config, device=self.settings.device, precision=self.settings.precision,
                            threads=self.settings.trial_threads())
            callbacks: list[Any] = [reporter]
            run_folder = trial_run_folder(self.settings, trial, config, params, model.device) if self.settings.run_dirs else None
            if run_folder is not None:
                callbacks.append(run_folder)
            # Quiet trials: the runner logs one line per trial; -v shows the epoch lines too.
            with quiet_training(not self.settings.verbose), warnings.catch_warnings():
                # An exploded loss stops the trial at the end of its epoch (below: PRUNED).
                warnings.simplefilter("error", LossExplodedWarning)
                model.fit(self.train, callback=callbacks, progress=False, **self.fit_options(),
                          **self.settings.attribute_options())
            trial.set_user_attr("epochs", reporter.epochs)
            if model.best_epoch is not None and self.settings.early_stop is not None:
                # The model holds its best epoch's weights: that epoch's validation is the value.
                trial.set_user_attr("best_epoch", model.best_epoch)
                value = next(h[self.metric_key] for h in model.valid_history if h["epoch"] == model.best_epoch)
            else:
                value = reporter.value if reporter.value is not None and reporter.epochs == config.n_epochs else self.score(model)
            if run_folder is not None:
                write_trial_metrics(run_folder, model, self.valid, self.settings)
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            return value
        except optuna.TrialPruned:
            trial.set_user_attr("epochs", reporter.epochs if reporter is not None else 0)
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            raise
        except LossExplodedWarning as exc:
            # The epoch that exploded was trained but never reached the callback.
            trial.set_user_attr("epochs", (reporter.epochs if reporter is not None else 0) + 1)
            trial.set_user_attr("diverged", str(exc))
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            del model
            _free_cuda_cache()
            raise optuna.TrialPruned(f"diverged: {exc}") from None
        except (ConfigError, TrainingDivergedError) as exc:
            reason = _one_line(exc)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is turned into a FAIL
            if not _is_oom(exc):
                raise
            reason = f"out of memory: {_one_line(exc)}"
        # A failed trial: record why, free what it held, let Optuna mark it FAIL.
        trial.set_user_attr("fail_reason", reason)
        trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
        del model
        _free_cuda_cache()  # optimize(gc_after_trial=True) collects the rest
        raise TrialFailed(reason)


def _free_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


@contextmanager
def quiet_training(quiet: bool = True) -> Iterator[None]:
    """While in the block, the training loggers show warnings only (no per-epoch lines) when
    ``quiet``; their level is restored afterwards."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in _TRAINING_LOGGERS]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, previous):
            logger.setLevel(level)
