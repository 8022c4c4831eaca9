"""The settings of a search: :class:`ParoptSettings`, one field per command-line option."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gru4rec.errors import Gru4RecError
from gru4rec.tune.space import ParamSpec, raise_problems

if TYPE_CHECKING:  # the evaluator is imported when a trial runs, not with the settings
    from gru4rec.evaluation.metrics import TieMode

__all__ = ["DEFAULT_OUT", "EVAL_MODES", "METRICS", "ParoptSettings", "metric_label"]

#: Default output folder (best parameters, trial exports, the default SQLite storage).
DEFAULT_OUT = "runs/paropt"
METRICS = ("recall", "mrr")
EVAL_MODES = ("standard", "conservative", "median", "tiebreaking")


@dataclass
class ParoptSettings:
    """Everything a paropt run needs; the command line maps one to one onto these fields."""

    train: str
    """Training events (TRAIN)."""
    valid: str
    """Validation events (VALID) the objective is measured on."""
    paramspace: str | list[ParamSpec]
    """Paramspace file (JSON lines) or the parsed specs."""
    fixed: str = ""
    """Fixed parameters as a parameter string (``-fp``)."""
    n_trials: int = 50
    """Trials this run adds to the study (``-nt``); with ``total`` the number of finished trials the
    study should hold."""
    total: bool = False
    measure: int = 20
    """Cutoff of the objective (``-m``)."""
    final_measure: tuple[int, ...] = (20,)
    """Cutoffs of the final test (``-fm``)."""
    primary_metric: str = "recall"
    eval_mode: TieMode = "standard"
    session_key: str | None = None
    item_key: str | None = None
    time_key: str | None = None
    device: str = "auto"
    precision: str = "float32"
    """Training precision of every trial (``--precision``; see :class:`gru4rec.GRU4Rec`)."""
    threads: int | None = None
    """torch threads per worker; None: 1 when workers > 1, else chosen online (:mod:`gru4rec.machine.threads`)."""
    workers: int = 1
    storage: str | None = None
    study_name: str | None = None
    pruning: bool = True
    prune_startup: int = 5
    """Median pruner: completed trials before any pruning."""
    prune_warmup: int = 1
    """Median pruner: epochs exempt from pruning (a trial can first be pruned after epoch warmup+1)."""
    sampler_seed: int | None = 42
    """Seed of the TPE sampler: trial n draws from a generator seeded with (seed, n), so the same
    command on a new study proposes the same trials; None: unseeded."""
    timeout: float | None = None
    """Stop starting trials after this many seconds (per worker)."""
    out: str = DEFAULT_OUT
    final_test: str | None = None
    early_stop: int | None = None
    """Stop a trial when the objective on VALID has not improved for this many epochs and keep
    its best epoch (the trial's value is that epoch's); None: train every epoch."""
    run_dirs: str | None = None
    """A run folder per trial under ``run_dirs/<study name>/trial-NNNNN`` (:mod:`gru4rec.tracking.runs`)."""
    enqueue: tuple[str, ...] = ()
    """Parameter files whose searched values are queued as the first trials (``--enqueue``)."""
    add_trials: tuple[str, ...] = ()
    """``STUDY.trials.json`` exports whose trials are added to the study (``--add-trials``)."""
    heartbeat_interval: int = 60
    """Seconds between the heartbeats a running trial writes to an RDB storage."""
    grace_period: int = 180
    """Seconds without a heartbeat after which another worker marks a trial FAIL and queues it again."""
    force: bool = False
    verbose: bool = False
    item_features: str | None = None
    """Item attribute table (``--item-features``; docs/attributes.md): every trial, and the final
    test, trains with it as ``fit(item_features=...)`` does; its content (SHA-256), ``item_min_count``
    and ``item_types`` are part of the study's identity."""
    item_min_count: int = 1
    """A value enters an attribute's vocabulary when at least this many training items have it
    (``--item-min-count``: ``fit``'s ``attribute_min_count``)."""
    item_types: dict[str, str] | None = None
    """Column kinds that override the inferred ones, ``{column: kind}`` (``--item-types``:
    ``fit``'s ``attribute_types``)."""

    def attribute_options(self) -> dict[str, Any]:
        """``fit``'s item attribute arguments (``{}`` without ``item_features``)."""
        if self.item_features is None:
            return {}
        return {"item_features": self.item_features, "attribute_min_count": self.item_min_count,
                "attribute_types": self.item_types}

    def attribute_flags(self) -> list[str]:
        """The item attribute options as ``gru4rec train`` takes them (a trial's command.txt)."""
        if self.item_features is None:
            return []
        flags = ["--item-features", self.item_features]
        if self.item_min_count != 1:
            flags += ["--item-min-count", str(self.item_min_count)]
        if self.item_types:
            flags += ["--item-types", ",".join(f"{name}={kind}" for name, kind in self.item_types.items())]
        return flags

    def trial_threads(self) -> int | None:
        """The threads every trial (and the final test) trains with: ``threads``, else 1 with
        several workers (they share the CPUs), else None: one worker chooses its count online as
        ``gru4rec train`` does (:class:`gru4rec.machine.threads.ThreadChoice`). Passed to the model, whose
        ``fit`` would otherwise apply its own default over the worker's setting."""
        if self.threads is not None:
            return self.threads
        return 1 if self.workers > 1 else None

    def check(self) -> None:
        """Raise ConfigError listing every invalid setting."""
        problems = []
        if self.n_trials < (0 if self.total else 1):
            problems.append(f"-nt must be >= {0 if self.total else 1}, got {self.n_trials}")
        if self.measure < 1:
            problems.append(f"-m must be >= 1, got {self.measure}")
        if not self.final_measure or any(c < 1 for c in self.final_measure):
            problems.append(f"-fm needs cutoffs >= 1, got {list(self.final_measure)}")
        if self.primary_metric not in METRICS:
            problems.append(f"-pm must be one of {', '.join(METRICS)}, got {self.primary_metric!r}")
        if self.eval_mode not in EVAL_MODES:
            problems.append(f"-e must be one of {', '.join(EVAL_MODES)}, got {self.eval_mode!r}")
        if self.workers < 1:
            problems.append(f"--workers must be >= 1, got {self.workers}")
        if self.threads is not None and self.threads < 1:
            problems.append(f"--threads must be >= 1, got {self.threads}")
        if self.prune_startup < 0 or self.prune_warmup < 0:
            problems.append("--prune-startup and --prune-warmup must be >= 0")
        if self.early_stop is not None and self.early_stop < 1:
            problems.append(f"--early-stop must be >= 1, got {self.early_stop}")
        if self.heartbeat_interval < 1 or self.grace_period <= self.heartbeat_interval:
            problems.append(
                f"--heartbeat-interval must be >= 1 and --grace-period longer than it, got "
                f"{self.heartbeat_interval} and {self.grace_period} (a shorter grace period fails live trials)"
            )
        if self.item_features is None and (self.item_min_count != 1 or self.item_types):
            problems.append("--item-min-count and --item-types need --item-features (the attribute table)")
        if isinstance(self.item_min_count, bool) or not isinstance(self.item_min_count, int) or self.item_min_count < 1:
            problems.append(f"--item-min-count must be an integer >= 1, got {self.item_min_count!r}")
        if self.timeout is not None and self.timeout <= 0:
            problems.append(f"--timeout must be > 0, got {self.timeout}")
        try:
            from gru4rec.machine.devices import resolve_device
            from gru4rec.training.precision import check_precision

            check_precision(self.precision, resolve_device(self.device), warn=False)  # the trials' Trainers warn
        except Gru4RecError as exc:
            problems.append(f"--device/--precision: {exc}")
        if problems:
            raise_problems("paropt settings", problems)


def metric_label(settings: ParoptSettings) -> str:
    """The objective as the lines and files name it, e.g. ``MRR@20``."""
    return f"{'MRR' if settings.primary_metric == 'mrr' else 'Recall'}@{settings.measure}"
