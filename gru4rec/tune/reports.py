"""What a run reports (STUDY = the study name): the contents of ``STUDY.best.json`` and
``STUDY.best.py`` (the fixed and the best searched parameters, readable with ``-pf``),
``STUDY.trials.csv`` and ``STUDY.trials.json`` (every trial: state, value, parameters, per-epoch
values, fail reasons) and ``STUDY.summary.json`` (counts, best trial, final test), and the
:class:`StudyReport` that :func:`~gru4rec.tune.runner.run_study` returns. Where the files go and
who may replace them: :mod:`gru4rec.tune.report_files`.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gru4rec.tune.settings import ParoptSettings
from gru4rec.tune.space import ParamSpec, canonical_name, fixed_names

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

    from gru4rec.config import Config

__all__ = [
    "StudyReport",
    "best_json_text",
    "best_param_dict",
    "best_py_text",
    "summary_data",
    "trials_csv_text",
    "trials_json_text",
]


@dataclass
class StudyReport:
    """What a run leaves behind (returned by :func:`run_study`)."""

    study_name: str
    storage: str
    """Storage URL, password redacted."""
    counts: dict[str, int]
    """Number of trials per state (COMPLETE, PRUNED, FAIL, RUNNING, ...) in the whole study."""
    run_counts: dict[str, int] = field(default_factory=dict)
    """Number of this run's trials per state (``-nt`` counts these)."""
    best_number: int | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    """The best trial's searched values."""
    best_param_string: str | None = None
    """Fixed + best searched parameters, ready for ``-ps``."""
    files: dict[str, str] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    """Final test: ``{"recall": {c: x}, "mrr": {c: y}, ...}`` when ``final_test`` was given."""
    problems: list[str] = field(default_factory=list)
    """Why a worker stopped early (consecutive failures, crashed worker process)."""
    recovered: list[str] = field(default_factory=list)
    """Local workers that were killed and replaced, their trials queued again."""


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def best_param_dict(base: Config, fixed: str, space: Sequence[ParamSpec], best_string: str) -> dict[str, Any]:
    """Typed values of the fixed and searched parameters of the best configuration.

    The keys are those of ``-fp`` and of the space, in that order (aliases resolved), plus the
    column keys when they differ from the defaults; the values come from the validated config,
    so the file reads back (``Config.from_file``) to exactly the configuration that was trained.
    """
    from gru4rec.config import Config

    config = base.replace_from_string(best_string)
    values = config.to_dict()
    defaults = Config.defaults()
    names = [canonical_name(n) for n in fixed_names(fixed)] + [canonical_name(s.name) for s in space]
    names += [k for k in ("session_key", "item_key", "time_key") if values[k] != defaults[k]]
    out: dict[str, Any] = {}
    for name in names:
        if name in values and name not in out:
            out[name] = values[name]
    return out


def _py_param_file(params: dict[str, Any], header: str) -> str:
    lines = [f"# {line}" for line in header.splitlines()]
    lines += ["from collections import OrderedDict", "", "gru4rec_params = OrderedDict(["]
    lines += [f"    ({name!r}, {value!r})," for name, value in params.items()]
    lines += ["])", ""]
    return "\n".join(lines)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _trial_records(study: optuna.Study, space: Sequence[ParamSpec]) -> list[dict[str, Any]]:
    specs = {s.name: s for s in space}
    records = []
    for t in study.get_trials(deepcopy=False):
        duration = t.duration.total_seconds() if t.duration is not None else None
        records.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "params": {k: specs[k].clean(v) if k in specs else v for k, v in t.params.items()},
                # An enqueued trial that has not started holds its values here only.
                "queued_params": t.system_attrs.get("fixed_params"),
                "intermediate_values": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                "user_attrs": t.user_attrs,
                "retry_of": t.system_attrs.get("failed_trial"),
                "datetime_start": t.datetime_start,
                "datetime_complete": t.datetime_complete,
                "duration_s": duration,
            }
        )
    return records


def trials_csv_text(study: optuna.Study, space: Sequence[ParamSpec]) -> str:
    """Every trial of ``study``, whatever its outcome, as CSV (Optuna's trials data frame)."""
    frame = study.trials_dataframe()
    for spec in space:  # stored values are raw floats (0.35000000000000003): write them clean
        column = f"params_{spec.name}"
        if column in frame.columns:
            frame[column] = frame[column].map(lambda v, spec=spec: v if _is_missing(v) else spec.clean(v))
    return str(frame.to_csv(index=False))


def trials_json_text(study: optuna.Study, space: Sequence[ParamSpec]) -> str:
    """Every trial of ``study`` as a JSON list of records (state, value, parameters, per-epoch
    values, user attributes, times, and ``retry_of`` for a trial queued again after its worker
    died)."""
    records = _json_safe(_trial_records(study, space))
    return json.dumps(records, indent=1, allow_nan=False) + "\n"


def best_json_text(params: dict[str, Any]) -> str:
    """The best parameters ``params`` (see :func:`best_param_dict`) as a JSON parameter file."""
    return json.dumps(params, indent=1) + "\n"


def best_py_text(params: dict[str, Any], header: str) -> str:
    """The best parameters as the original's ``OrderedDict`` .py file under the comment ``header``."""
    return _py_param_file(params, header)


def summary_data(settings: ParoptSettings, report: StudyReport, wall: float) -> dict[str, Any]:
    """The summary's content: the objective, the study's and this run's counts, the best trial,
    the final test, the problems and recoveries of ``report``, and this run's wall time."""
    summary = {
        "objective": {"metric": settings.primary_metric, "cutoff": settings.measure, "eval_mode": settings.eval_mode,
                      "valid": str(settings.valid), "train": str(settings.train),
                      # the trials' item attribute table, as gru4rec train takes it (none: no key)
                      **({"item_features": settings.attribute_flags()} if settings.item_features is not None else {})},
        "counts": report.counts,
        "this_run": {"counts": report.run_counts, "wall_seconds": round(wall, 3), "sampler_seed": settings.sampler_seed},
        "best_trial": report.best_number,
        "best_value": report.best_value,
        "best_param_string": report.best_param_string,
        "final_test": report.final,
        "problems": report.problems,
        "recovered_workers": report.recovered,
    }
    return dict(_json_safe(summary))
