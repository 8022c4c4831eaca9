"""A run folder per trial (``paropt --run-dirs DIR``): ``DIR/<study>/trial-NNNNN`` holds the
trial's config.json, epochs.jsonl (with the validation metrics when trials stop early),
metrics.json (the trial's final model on VALID, with breakdowns) and a command.txt whose
``gru4rec train`` command retrains exactly this trial; no model file (a study has many trials).
:mod:`gru4rec.tracking.runs` writes the files; ``gru4rec report`` reads them.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gru4rec.tune.settings import ParoptSettings

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna
    import pandas as pd

    from gru4rec.config import Config
    from gru4rec.tracking.runs import RunFolder

__all__ = ["trial_run_folder", "write_trial_metrics"]


def trial_run_folder(settings: ParoptSettings, trial: optuna.trial.Trial, config: Config, params: dict[str, Any], device: Any) -> RunFolder:
    """The run folder of one trial (``--run-dirs``), started: command.txt holds the ``gru4rec
    train`` command that retrains the trial, config.json the trial's configuration."""
    import torch

    from gru4rec.tracking.runs import RunFolder

    # The losses depend on the thread count (parallel sums, to float32 rounding), so the command
    # that retrains the trial names one: the trial's own, or the count it starts on when chosen online.
    threads = settings.trial_threads() or torch.get_num_threads()
    folder = RunFolder(os.path.join(settings.run_dirs or ".", trial.study.study_name, f"trial-{trial.number:05d}"))
    folder.check(force=settings.force)
    metric = f"{settings.primary_metric}@{settings.measure}"
    command = ["gru4rec", "train", settings.train, "-ps", config.to_param_string(only_changed=True),
               "--valid", settings.valid, "-m", str(settings.measure), "-e", settings.eval_mode, "--valid-metric", metric,
               "--threads", str(threads)]
    if settings.early_stop is not None:
        command += ["--early-stop", str(settings.early_stop)]
    command += settings.attribute_flags()
    folder.start(command, {
        "config": config.to_dict(),
        "param_string": config.to_param_string(only_changed=True),
        "device": str(device),
        "precision": settings.precision,
        "threads": threads,
        "train": settings.train,
        "valid": settings.valid,
        "valid_metric": metric if settings.early_stop is not None else None,
        "early_stop": settings.early_stop,
        "test": [],
        "cutoffs": [settings.measure],
        "eval_mode": settings.eval_mode,
        "study": trial.study.study_name,
        "trial": trial.number,
        "params": params,
        **({"item_features": settings.item_features} if settings.item_features is not None else {}),
    })
    return folder


def write_trial_metrics(folder: RunFolder, model: Any, valid: pd.DataFrame, settings: ParoptSettings) -> None:
    """A trial's metrics.json: the final model on VALID at the report's cutoffs, with breakdowns."""
    from gru4rec.evaluation.evaluator import evaluate
    from gru4rec.tracking.runs import RUN_CUTOFFS, metrics_entry

    result = evaluate(model, valid, cutoffs=tuple(sorted(set(RUN_CUTOFFS) | {settings.measure})), mode=settings.eval_mode, breakdown=True)
    folder.write_metrics({settings.valid: metrics_entry(result)})
