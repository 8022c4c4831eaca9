"""Seeding a study with known-good parameters (``--enqueue PARAMFILE``, repeatable): the
searched values of a parameter file (e.g. the published best in ``paramfiles/``) are queued as
the study's next trials (Optuna's ``enqueue_trial``), so that a search starts from them.

A parameter file describes a whole configuration, while a trial can only choose the searched
parameters; the rest comes from ``-fp`` and the defaults. So a file is checked before anything is
queued: a value the file gives for a fixed (``-fp``) parameter must agree with it (an error
naming each that does not; ``n_epochs`` only warns, so that a published file seeds a study of
shorter trials), a value for a parameter that is neither fixed nor searched should
agree with the study's default (a warning: the trial runs the default), and a searched value
must be one the trial can take (a categorical value among the choices, a number that the space's
step does not round). A number outside the searched range or off its grid (the published rsc15
``layers=100`` in a space of 64..512 step 32) is run as given, with a warning.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gru4rec.errors import ConfigError
from gru4rec.tune.space import ParamSpec, canonical_name, fixed_names, raise_problems, trial_param_string

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

    from gru4rec.config import Config

__all__ = ["Enqueued", "enqueue", "read_enqueued"]

log = logging.getLogger(__name__)

# How long to train is the study's choice, not the configuration's: a published file (10 epochs)
# seeds a study of shorter trials with a warning.
_TRAINING_LENGTH = frozenset({"n_epochs"})


@dataclass(frozen=True)
class Enqueued:
    """The searched values of one ``--enqueue`` file, checked against the study."""

    path: str
    params: dict[str, Any]
    """Values by the space's parameter names, in the types Optuna's distributions hold."""
    warnings: tuple[str, ...] = ()


def _searched_value(spec: ParamSpec, value: Any, base: Config) -> tuple[Any, str | None]:
    """``value`` (the file's, typed by Config) as the trial's value of ``spec``; returns
    ``(value, problem)``."""
    name = canonical_name(spec.name)
    if spec.dtype == "categorical":
        for choice in spec.values:
            try:
                as_trial = base.replace_from_string(f"{spec.name}={spec.format(choice)}").to_dict()[name]
            except ConfigError:
                continue
            if as_trial == value:
                return choice, None
        return None, f"{spec.name}={value!r} is not among the space's choices {list(spec.values)}"
    if isinstance(value, (list, tuple)):  # layers: the space searches the size of one layer
        if len(value) != 1:
            return None, f"{spec.name}={value!r}: the space searches one {spec.dtype}, the file gives {len(value)} values"
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{spec.name}={value!r} is not a number"
    if spec.dtype == "int":
        if not float(value).is_integer():
            return None, f"{spec.name}={value!r} is not an integer"
        return int(value), None
    value = float(value)
    if spec.clean(value) != value:
        return None, f"{spec.name}={value!r} has more digits than the space's step {spec.step!r} (a trial would run {spec.clean(value)!r})"
    return value, None


def read_enqueued(path: str | os.PathLike[str], space: Sequence[ParamSpec], base: Config, fixed: str) -> Enqueued:
    """Read the parameter file ``path`` and check it against the study (see the module);
    raises ConfigError listing every problem, naming the file."""
    from gru4rec.config import Config
    from gru4rec.config.param_files import read_param_file

    where = f"--enqueue '{path}'"
    try:
        raw = read_param_file(path)
        wanted = Config.from_dict(raw, source=f"param file '{path}'").to_dict()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    given = [canonical_name(str(k).strip()) for k in raw]
    problems: list[str] = []
    warnings: list[str] = []
    params: dict[str, Any] = {}
    searched = {canonical_name(s.name) for s in space}
    for spec in space:
        name = canonical_name(spec.name)
        if name not in given:
            continue  # the sampler chooses it
        value, problem = _searched_value(spec, wanted[name], base)
        if problem:
            problems.append(problem)
            continue
        params[spec.name] = value
        if spec.dtype != "categorical" and not spec.contains(value):
            grid = f"{spec.low}..{spec.high}" + (f" step {spec.step}" if spec.step is not None else "")
            warnings.append(f"{spec.name}={value!r} lies outside the searched grid {grid}; the trial runs it as given")
    if problems:
        raise_problems(where, problems)
    try:
        trial = base.replace_from_string(trial_param_string(space, params)).to_dict()
    except ConfigError as exc:
        raise ConfigError(f"{where}: its values do not combine with the fixed parameters: {exc}") from None
    fixed_set = {canonical_name(n) for n in fixed_names(fixed)}
    for name in dict.fromkeys(given):
        if name in searched or name not in trial or trial[name] == wanted[name]:
            continue
        if name in _TRAINING_LENGTH:
            warnings.append(f"{name}={wanted[name]!r}: the trial trains for the study's {name}={trial[name]!r}")
        elif name in fixed_set:
            problems.append(f"{name}={wanted[name]!r} but the study fixes {name}={trial[name]!r} (-fp)")
        else:
            warnings.append(f"{name}={wanted[name]!r} is neither fixed nor searched: the trial runs the default "
                            f"{trial[name]!r} (add {name} to -fp to change the study)")
    if problems:
        raise_problems(where, problems)
    missing = [s.name for s in space if s.name not in params]
    if missing:
        warnings.append(f"gives no value for {', '.join(missing)}: the sampler chooses")
    return Enqueued(path=str(path), params=params, warnings=tuple(warnings))


def enqueue(study: optuna.Study, items: Sequence[Enqueued]) -> list[int | None]:
    """Queue each item's values as a trial of ``study`` unless a trial with the same values is
    already in it (a rerun of the same command queues nothing twice); logs what it did. Returns,
    per item, None when it was queued, else the number of the trial that already has its values."""
    done: list[int | None] = []
    for item in items:
        trials = study.get_trials(deepcopy=False)
        for warning in item.warnings:
            log.warning(f"--enqueue {item.path}: {warning}")
        existing = next((t.number for t in trials if t.system_attrs.get("fixed_params", t.params) == item.params), None)
        if existing is not None:
            log.info(f"--enqueue {item.path}: its values are trial {existing} of the study already; not queued again")
        else:
            study.enqueue_trial(item.params, user_attrs={"enqueued_from": item.path})
            log.info(f"--enqueue {item.path}: queued as one of the next trials")
        done.append(existing)
    return done
