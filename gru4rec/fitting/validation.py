"""Validation during training and early stopping: ``GRU4Rec.fit(data, valid=..., early_stop=...)``.

After every epoch the model is evaluated on the validation events with the batched evaluator
(:func:`gru4rec.evaluation.evaluate`, the same full-catalogue ranking as a test; coverage and
popularity are skipped). The validation sessions are formed once, before the first epoch, with
the training item map (unknown items dropped as in a test). The chosen metric (``metric``,
e.g. ``'recall@20'`` or ``'mrr@20'``) decides which epoch is best: an epoch is better only when
its value is strictly larger than the best so far.

With ``early_stop=P`` training stops once P epochs in a row have not improved on the best, and
the best epoch's weights are put back into the model at the end, also when all epochs ran. The
copy of the best weights stays on the training device (no host transfer per epoch); it costs
one more copy of the parameters in memory. Without ``early_stop`` the validation metrics are
only recorded, and the model keeps its last epoch's weights.

With ``checkpoint_dir`` the validation state (history, best epoch, the best weights) is part of
the training checkpoint, so a resumed run stops at the same epoch and keeps the same weights as
an uninterrupted one.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gru4rec.errors import ConfigError, DataError, ModelFileError
from gru4rec.evaluation import evaluate
from gru4rec.evaluation.metrics import check_cutoffs, check_mode

if TYPE_CHECKING:  # typing only
    from gru4rec.data import Sessions
    from gru4rec.network.gru import GRU4RecNet

__all__ = ["METRIC_NAMES", "ValidationMetric", "Validator", "parse_metric"]

log = logging.getLogger(__name__)

#: The metrics that can choose the best epoch.
METRIC_NAMES = ("recall", "mrr", "ndcg")
_METRIC = re.compile(r"^\s*(recall|mrr|ndcg)\s*@\s*(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ValidationMetric:
    """The metric that chooses the best epoch, e.g. ``recall@20``."""

    name: str
    cutoff: int

    @property
    def key(self) -> str:
        """Its key in the per-epoch metric dicts, e.g. ``'recall@20'``."""
        return f"{self.name}@{self.cutoff}"


def parse_metric(text: str) -> ValidationMetric:
    """``'recall@20'``, ``'MRR@10'``, ``'ndcg@5'`` → :class:`ValidationMetric`; ConfigError otherwise."""
    match = _METRIC.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(2)) < 1:
        raise ConfigError(f"metric: expected recall@K, mrr@K or ndcg@K with K >= 1, got {text!r}")
    return ValidationMetric(match.group(1).lower(), int(match.group(2)))


def check_patience(early_stop: int | None) -> None:
    """ConfigError unless ``early_stop`` is None or a positive integer."""
    if early_stop is None:
        return
    if isinstance(early_stop, bool) or not isinstance(early_stop, int) or early_stop < 1:
        raise ConfigError(f"early_stop: expected a positive number of epochs, got {early_stop!r}")


class Validator:
    """Evaluates a model on validation sessions after every epoch and tracks the best epoch.

    ``model`` is the fitted-in-progress :class:`gru4rec.GRU4Rec` (its ``net``, ``item_map``,
    ``item_support``, ``config`` and ``device`` are read at every evaluation); ``sessions`` the
    validation sessions in the training item map. ``cutoffs`` are the cutoffs recorded per epoch
    (the metric's own cutoff is always included).
    """

    def __init__(
        self,
        model: Any,
        sessions: Sessions,
        *,
        metric: str | ValidationMetric = "recall@20",
        cutoffs: Sequence[int] | None = None,
        mode: str = "standard",
        batch_size: int = 512,
        patience: int | None = None,
    ) -> None:
        self.metric = metric if isinstance(metric, ValidationMetric) else parse_metric(metric)
        self.cutoffs = check_cutoffs(tuple(cutoffs or ()) + (self.metric.cutoff,))
        tie_mode = check_mode(mode)
        check_patience(patience)
        if not (sessions.lengths >= 2).any():
            raise DataError("valid: no validation session has two or more events with items seen in training — nothing to validate on")
        self.model = model
        self.sessions = sessions
        self.mode = tie_mode
        self.batch_size = batch_size
        self.patience = patience
        self.history: list[dict[str, float]] = []
        self.best_epoch: int | None = None
        self.best_value = -math.inf
        self.since_best = 0
        self._best_weights: dict[str, torch.Tensor] | None = None

    @property
    def should_stop(self) -> bool:
        """Whether ``patience`` epochs in a row have not improved on the best."""
        return self.patience is not None and self.since_best >= self.patience

    def after_epoch(self, epoch: int) -> dict[str, float]:
        """Evaluate the model after ``epoch``; returns ``{'recall@20': ..., 'mrr@20': ..., ...}``
        for every cutoff, and keeps a copy of the weights when the epoch is the best so far."""
        net = self.model.net
        result = evaluate(
            self.model, self.sessions, cutoffs=self.cutoffs, mode=self.mode, batch_size=self.batch_size,
            beyond_accuracy=False,
        )
        metrics = {f"{name}@{c}": float(getattr(result, name)[c]) for name in METRIC_NAMES for c in self.cutoffs}
        self.history.append({"epoch": epoch, **metrics})
        value = metrics[self.metric.key]
        if not math.isnan(value) and value > self.best_value:
            self.best_value, self.best_epoch, self.since_best = value, epoch, 0
            if self.patience is not None:
                self._keep(net)
        else:
            self.since_best += 1
        log.info(
            "Validation after epoch %d (%.2fs): %s (best %.6f after epoch %s)",
            epoch,
            result.seconds,
            " ".join(f"{k}={v:.6f}" for k, v in metrics.items() if not k.startswith("ndcg")),
            self.best_value,
            self.best_epoch,
        )
        if self.should_stop:
            log.info("Early stopping after epoch %d: %s has not improved for %d epoch(s)", epoch, self.metric.key, self.patience)
        return metrics

    def _keep(self, net: GRU4RecNet) -> None:
        state = net.state_dict()
        if self._best_weights is None:
            self._best_weights = {k: v.detach().clone() for k, v in state.items()}
        else:  # reuse the buffers: no new allocation per improvement
            for k, v in state.items():
                self._best_weights[k].copy_(v)

    def finish(self) -> int | None:
        """With early stopping, put the best epoch's weights back into the model; returns the
        best epoch (None before any evaluation)."""
        if self.patience is not None and self._best_weights is not None:
            self.model.net.load_state_dict(self._best_weights)
            if self.best_epoch is not None and self.best_epoch != self.history[-1]["epoch"]:
                log.info("Kept the weights of epoch %d (%s=%.6f)", self.best_epoch, self.metric.key, self.best_value)
        return self.best_epoch

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The tensors (the best weights) and the JSON metadata that a training checkpoint holds
        for this validator."""
        tensors = {f"valid.best.{k}": v for k, v in (self._best_weights or {}).items()}
        meta = {
            "metric": self.metric.key,
            "mode": self.mode,
            "history": self.history,
            "best_epoch": self.best_epoch,
            "best_value": None if self.best_epoch is None else self.best_value,
            "since_best": self.since_best,
        }
        return tensors, meta

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None, path: Any) -> None:
        """Continue from a checkpoint's validation state (``meta`` None: the checkpointed run had
        no validation, so the tracking starts with the resumed epochs)."""
        if meta is None:
            log.warning("%s holds no validation state: the best epoch is chosen among the resumed epochs only", path)
            return
        if meta["metric"] != self.metric.key or meta["mode"] != self.mode:
            raise ModelFileError(
                f"{path} was written validating on {meta['metric']} ({meta['mode']} ties); resume with the same metric and mode"
            )
        self.history = list(meta["history"])
        self.best_epoch = meta["best_epoch"]
        self.best_value = -math.inf if meta["best_value"] is None else float(meta["best_value"])
        self.since_best = int(meta["since_best"])
        prefix = "valid.best."
        best = {k[len(prefix):]: v.to(self.model.device) for k, v in tensors.items() if k.startswith(prefix)}
        self._best_weights = best or None
