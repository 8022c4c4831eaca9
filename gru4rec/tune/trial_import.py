"""Continuing a study from its exported trials (``--add-trials STUDY.trials.json``, repeatable).

A study's storage may not outlive the machine it ran on; its ``STUDY.trials.json`` export does
(commit it). Given to ``gru4rec paropt`` on another machine, the file's finished trials (COMPLETE
and PRUNED: parameters, value, per-epoch values, user attributes) are added to the study as they
were (Optuna's ``Study.add_trial``), so the sampler learns from them and the best trial stays
the best; its unfinished ones (WAITING, or RUNNING and FAIL where the old machine stopped them)
are queued again with their parameters. Rerunning the same command adds nothing twice.

Each record's parameters must be the study's searched parameters; a file of another space is
refused, naming the file and the first record that does not fit.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gru4rec.errors import ConfigError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.space import ParamSpec

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

__all__ = ["ImportedTrials", "add_trials", "read_trial_records"]

log = logging.getLogger(__name__)

_FINISHED = ("COMPLETE", "PRUNED")
_REQUEUED = ("WAITING", "RUNNING", "FAIL")


class ImportedTrials(NamedTuple):
    """What :func:`add_trials` did with one file's records."""

    added: int
    """Finished trials added as they were."""
    queued: int
    """Unfinished trials queued again with their parameters."""
    skipped: int
    """Records already in the study (a rerun), or unfinished ones that never got parameters."""


def read_trial_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``STUDY.trials.json`` export; ConfigError naming ``path`` when it is not one."""
    where = f"--add-trials '{path}'"
    try:
        with open(path, encoding="utf-8") as handle:
            records = json.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: not a trials JSON export ({exc})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) and "state" in r for r in records):
        raise ConfigError(f"{where}: not a trials JSON export (expected a list of trial records with a 'state')")
    return records


def _record_params(record: dict[str, Any]) -> dict[str, Any]:
    params = record.get("params") or record.get("queued_params") or {}
    if not isinstance(params, dict):
        raise ValueError("its 'params' is not an object")
    return params


def _check_params(params: dict[str, Any], space: Sequence[ParamSpec], finished: bool) -> str | None:
    names = {s.name for s in space}
    unknown = sorted(set(params) - names)
    if unknown:
        return f"parameters {unknown} are not searched by this study's space ({sorted(names)})"
    missing = sorted(names - set(params))
    if finished and missing:
        return f"gives no value for the searched parameters {missing}"
    return None


def _same(trial: optuna.trial.FrozenTrial, state: str, params: dict[str, Any], value: Any,
          specs: dict[str, ParamSpec]) -> bool:
    known = trial.params or trial.system_attrs.get("fixed_params") or {}
    # Compared as the model gets them: a sampled stepped float (0.15000000000000002) is exported
    # cleaned (0.15), and a study given its own export must find its trials in it.
    if _cleaned(known, specs) != _cleaned(params, specs):
        return False
    if state in _FINISHED:
        return trial.state.name == state and trial.value == value
    return trial.state.name in _FINISHED + ("WAITING", "RUNNING")  # already finished or queued


def _cleaned(params: dict[str, Any], specs: dict[str, ParamSpec]) -> dict[str, Any]:
    return {name: specs[name].clean(value) if name in specs else value for name, value in params.items()}


def add_trials(study: optuna.Study, path: str | os.PathLike[str], space: Sequence[ParamSpec]) -> ImportedTrials:
    """Add the finished trials of the export ``path`` to ``study`` and queue its unfinished ones
    (see the module). Raises ConfigError, naming the file
    and the trial, for a file that is not an export or a trial that is not of this space; nothing
    is added then."""
    optuna = import_optuna()
    where = f"--add-trials '{path}'"
    records = read_trial_records(path)
    distributions = {s.name: _distribution(s, optuna) for s in space}
    specs = {s.name: s for s in space}
    plan: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = []
    for index, record in enumerate(records):
        state = str(record["state"])
        label = f"{where}: trial {record.get('number', index)}"
        if state not in _FINISHED + _REQUEUED:
            raise ConfigError(f"{label}: unknown state {state!r}")
        try:
            params = _record_params(record)
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        problem = _check_params(params, space, state in _FINISHED)
        if problem:
            raise ConfigError(f"{label}: {problem}")
        if state in _FINISHED and not params:
            raise ConfigError(f"{label}: a {state} trial without parameters")
        if state == "COMPLETE" and not isinstance(record.get("value"), (int, float)):
            raise ConfigError(f"{label}: a COMPLETE trial without a numeric 'value'")
        try:
            trial_distributions = {name: _widened(distributions[name], value, optuna) for name, value in params.items()}
        except ConfigError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        plan.append((state, params, record, trial_distributions))

    added = queued = skipped = 0
    for state, params, record, trial_distributions in plan:
        existing = study.get_trials(deepcopy=False)
        if any(_same(t, state, params, record.get("value"), specs) for t in existing):
            skipped += 1
            continue
        if state in _FINISHED:
            study.add_trial(
                optuna.trial.create_trial(
                    state=getattr(optuna.trial.TrialState, state),
                    value=record.get("value") if state == "COMPLETE" else None,
                    params=params,
                    distributions=trial_distributions,
                    intermediate_values={int(k): float(v) for k, v in (record.get("intermediate_values") or {}).items()},
                    user_attrs={**(record.get("user_attrs") or {}), "imported_from": f"{path}#{record.get('number')}"},
                )
            )
            added += 1
        elif params:
            study.enqueue_trial(params, user_attrs={"imported_from": f"{path}#{record.get('number')}"})
            queued += 1
        else:
            skipped += 1  # a sampled trial that never got its parameters: nothing to rerun
    log.info(f"{where}: {added} finished trials added, {queued} queued again, {skipped} already in the study or empty")
    return ImportedTrials(added, queued, skipped)


def _distribution(spec: ParamSpec, optuna: Any) -> Any:
    d = optuna.distributions
    if spec.dtype == "int":
        return d.IntDistribution(int(spec.low), int(spec.high), step=int(spec.step or 1), log=spec.log)
    if spec.dtype == "float":
        return d.FloatDistribution(float(spec.low), float(spec.high), step=spec.step, log=spec.log)
    return d.CategoricalDistribution(list(spec.values))


def _widened(distribution: Any, value: Any, optuna: Any) -> Any:
    """``distribution``, or for a value it does not hold (an enqueued published value outside
    the searched grid, run as given) the same kind of distribution that holds it."""
    d = optuna.distributions
    if isinstance(distribution, d.CategoricalDistribution):
        if value not in distribution.choices:
            raise ConfigError(f"value {value!r} is not among the choices {list(distribution.choices)}")
        return distribution
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"value {value!r} is not a number")
    if distribution._contains(distribution.to_internal_repr(value)):
        return distribution
    low, high = min(distribution.low, value), max(distribution.high, value)
    if isinstance(distribution, d.IntDistribution):
        return d.IntDistribution(int(low), int(high), log=distribution.log)
    return d.FloatDistribution(float(low), float(high), log=distribution.log)
