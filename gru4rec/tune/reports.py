"""What a run leaves in ``--out`` (STUDY = the study name): ``STUDY.best.json`` and
``STUDY.best.py`` (the fixed and the best searched parameters, readable with ``-pf``),
``STUDY.trials.csv`` and ``STUDY.trials.json`` (every trial: state, value, parameters, per-epoch
values, fail reasons) and ``STUDY.summary.json`` (counts, best trial, final test), and the
:class:`StudyReport` that :func:`~gru4rec.tune.runner.run_study` returns.

Every file is written atomically; existing files are only replaced with ``--force``.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from gru4rec.errors import Gru4RecError
from gru4rec.files import atomic_write
from gru4rec.tune.settings import ParoptSettings
from gru4rec.tune.space import ParamSpec, canonical_name, fixed_names

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

    from gru4rec.config import Config

__all__ = [
    "StudyReport",
    "best_param_dict",
    "check_outputs",
    "output_paths",
    "write_best_files",
    "write_summary",
    "write_trial_exports",
]


@dataclass
class StudyReport:
    """What a run leaves behind (returned by :func:`run_study`)."""

    study_name: str
    storage: str
    """Storage URL, password redacted."""
    counts: dict[str, int]
    """Number of trials per state (COMPLETE, PRUNED, FAIL, RUNNING, ...) in the whole study."""
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


def _safe_file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "study"


def output_paths(out: str | os.PathLike[str], study_name: str) -> dict[str, Path]:
    """The files a run writes into ``out`` for ``study_name``."""
    stem = Path(out) / _safe_file_stem(study_name)
    return {
        "best_json": stem.with_name(stem.name + ".best.json"),
        "best_py": stem.with_name(stem.name + ".best.py"),
        "trials_csv": stem.with_name(stem.name + ".trials.csv"),
        "trials_json": stem.with_name(stem.name + ".trials.json"),
        "summary": stem.with_name(stem.name + ".summary.json"),
    }


def _write_text(path: Path, text: str) -> None:
    """Atomic write: a temp file in the same folder, then rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


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


def best_param_dict(base: "Config", fixed: str, space: Sequence[ParamSpec], best_string: str) -> dict[str, Any]:
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


def _trial_records(study: "optuna.Study", space: Sequence[ParamSpec]) -> list[dict[str, Any]]:
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
                "intermediate_values": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                "user_attrs": t.user_attrs,
                "datetime_start": t.datetime_start,
                "datetime_complete": t.datetime_complete,
                "duration_s": duration,
            }
        )
    return records


def check_outputs(paths: dict[str, Path], force: bool) -> None:
    """Refuse to overwrite existing output files unless ``force`` (``--force``)."""
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise Gru4RecError(
            f"output file(s) exist: {', '.join(existing)}; pass --force to overwrite them "
            "or choose another --out / --study-name"
        )


def write_trial_exports(study: "optuna.Study", space: Sequence[ParamSpec], paths: dict[str, Path]) -> dict[str, str]:
    """Write every trial of ``study``, whatever its outcome, as CSV (Optuna's trials data frame)
    and JSON; returns the files written by key (``trials_csv``, ``trials_json``)."""
    paths["trials_json"].parent.mkdir(parents=True, exist_ok=True)
    frame = study.trials_dataframe()
    for spec in space:  # stored values are raw floats (0.35000000000000003): write them clean
        column = f"params_{spec.name}"
        if column in frame.columns:
            frame[column] = frame[column].map(lambda v, spec=spec: v if _is_missing(v) else spec.clean(v))
    _write_text(paths["trials_csv"], frame.to_csv(index=False))
    records = _json_safe(_trial_records(study, space))
    _write_text(paths["trials_json"], json.dumps(records, indent=1, allow_nan=False) + "\n")
    return {"trials_csv": str(paths["trials_csv"]), "trials_json": str(paths["trials_json"])}


def write_best_files(paths: dict[str, Path], params: dict[str, Any], header: str) -> dict[str, str]:
    """Write the best parameters ``params`` (see :func:`best_param_dict`) as JSON and as the
    original's ``OrderedDict`` .py file under the comment ``header``; returns the files by key."""
    _write_text(paths["best_json"], json.dumps(params, indent=1) + "\n")
    _write_text(paths["best_py"], _py_param_file(params, header))
    return {"best_json": str(paths["best_json"]), "best_py": str(paths["best_py"])}


def write_summary(paths: dict[str, Path], settings: ParoptSettings, report: StudyReport, wall: float) -> str:
    """Write ``STUDY.summary.json``: the objective, the study's counts, the best trial, the final
    test and the problems of ``report``, and this run's wall time; returns the file."""
    summary = {
        "study_name": report.study_name,
        "storage": report.storage,
        "objective": {"metric": settings.primary_metric, "cutoff": settings.measure, "eval_mode": settings.eval_mode,
                      "valid": str(settings.valid), "train": str(settings.train)},
        "counts": report.counts,
        "best_trial": report.best_number,
        "best_value": report.best_value,
        "best_param_string": report.best_param_string,
        "final_test": report.final,
        "wall_seconds_this_run": round(wall, 3),
        "problems": report.problems,
    }
    _write_text(paths["summary"], json.dumps(_json_safe(summary), indent=1, allow_nan=False) + "\n")
    return str(paths["summary"])
