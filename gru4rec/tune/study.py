"""The study: what a run derives from its settings before any trial (the parsed space, the
fixed parameters, the study's name and storage), the identity recorded in the study so that a
resumed run optimises the same thing, and opening (creating or resuming) the study.
"""
from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.errors import ConfigError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.settings import ParoptSettings
from gru4rec.tune.space import ParamSpec, canonical_name, check_paramspace, fixed_names, load_paramspace
from gru4rec.tune.storage import resolve_storage_url

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

    from gru4rec.config import Config

__all__ = [
    "STUDY_OBJECTIVE_ATTR",
    "Prepared",
    "default_study_name",
    "make_sampler_pruner",
    "n_finished",
    "find_study",
    "item_features_identity",
    "open_study",
    "prepare",
    "state_counts",
    "study_identity",
    "study_uid",
]

#: The study's user attribute in which paropt records what the study optimises (metric, cutoff,
#: ties, files): checked when a study is resumed, read by the study report.
STUDY_OBJECTIVE_ATTR = "gru4rec_paropt"
_STUDY_FORMAT = 1
# Keys of the identity a resumed run must agree with (data paths may differ between machines:
# the item attribute table is compared by its content, with the options it is encoded with).
_IDENTITY_KEYS = ("space", "fixed", "metric", "cutoff", "eval_mode", "item_features")


@dataclass
class Prepared:
    """What every worker derives from the settings before its first trial."""

    space: list[ParamSpec]
    base: Config
    keys: dict[str, str]
    study_name: str
    storage_url: str


def prepare(settings: ParoptSettings) -> Prepared:
    """Validate the settings, parse the space and the fixed parameters (no data read yet)."""
    from gru4rec.config import Config

    settings.check()
    if isinstance(settings.paramspace, (str, os.PathLike)):
        space = load_paramspace(settings.paramspace)
        space_label: str | os.PathLike[str] = settings.paramspace
    else:
        space = list(settings.paramspace)
        space_label = "paramspace"
    try:
        base = Config.from_string(settings.fixed)
    except ConfigError as exc:
        raise ConfigError(f"fixed parameters (-fp): {exc}") from None
    overrides = {
        key: value
        for key, value in (
            ("session_key", settings.session_key),
            ("item_key", settings.item_key),
            ("time_key", settings.time_key),
        )
        if value is not None
    }
    if overrides:
        base = base.replace(**overrides)
    check_paramspace(space, base, settings.fixed)
    keys = {"session_key": base.session_key, "item_key": base.item_key, "time_key": base.time_key}
    name = settings.study_name or default_study_name(space_label, settings.train)
    url = resolve_storage_url(settings.storage, Path(settings.out))
    return Prepared(space=space, base=base, keys=keys, study_name=name, storage_url=url)


def make_sampler_pruner(settings: ParoptSettings) -> tuple[Any, Any]:
    """The default sampler (TPE, seeded per trial: :mod:`gru4rec.tune.sampler`) and pruner
    (median, or none)."""
    optuna = import_optuna()
    from gru4rec.tune.sampler import PerTrialSeededTPE

    sampler = PerTrialSeededTPE(settings.sampler_seed)
    if settings.pruning:
        pruner = optuna.pruners.MedianPruner(n_startup_trials=settings.prune_startup, n_warmup_steps=settings.prune_warmup)
    else:
        pruner = optuna.pruners.NopPruner()
    return sampler, pruner


def study_identity(settings: ParoptSettings, prepared: Prepared) -> dict[str, Any]:
    """What a study optimises; a resumed study must match it (see :func:`open_study`).

    The fixed parameters are compared as typed values, so their order or spelling in ``-fp``
    does not matter.
    """
    values = prepared.base.to_dict()
    fixed = {name: values[name] for name in map(canonical_name, fixed_names(settings.fixed)) if name in values}
    return {
        "format": _STUDY_FORMAT,
        "space": [s.to_json() for s in prepared.space],
        "fixed": dict(sorted(fixed.items())),
        "metric": settings.primary_metric,
        "cutoff": settings.measure,
        "eval_mode": settings.eval_mode,
        "train": str(settings.train),
        "valid": str(settings.valid),
        "item_features": item_features_identity(settings),
        "item_features_file": None if settings.item_features is None else str(settings.item_features),
    }


def item_features_identity(settings: ParoptSettings) -> dict[str, Any] | None:
    """The item attribute table a study's trials train with, as its identity compares it: the
    SHA-256 of the file's bytes (its path may differ between machines), the minimum count and
    the column kinds given; None without a table (a study made before the option has none)."""
    if settings.item_features is None:
        return None
    digest = hashlib.sha256()
    with open(settings.item_features, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest(), "min_count": settings.item_min_count,
            "types": dict(sorted((settings.item_types or {}).items()))}


def open_study(
    storage: Any, name: str, identity: dict[str, Any], sampler: Any, pruner: Any
) -> tuple[optuna.Study, bool]:
    """Create the study or load it if it exists; returns ``(study, resumed)``.

    Refuses to resume a study that optimises something else (other space, fixed parameters,
    metric, cutoff or tie mode) or that was not made by this tool, since mixing trials of
    different objectives would make the best trial meaningless. A new study gets a random id
    (:func:`study_uid`) that its report files record as their owner.
    """
    optuna = import_optuna()
    study = optuna.create_study(
        storage=storage, study_name=name, sampler=sampler, pruner=pruner, direction="maximize", load_if_exists=True
    )
    recorded = study.user_attrs.get(STUDY_OBJECTIVE_ATTR)
    n_trials = len(study.get_trials(deepcopy=False))
    if recorded is None:
        if n_trials:
            raise ConfigError(
                f"study {name!r} exists in the storage with {n_trials} trials but was not created by gru4rec paropt; "
                "choose another --study-name"
            )
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ConfigError(f"study {name!r} exists and minimises; choose another --study-name")
        study.set_user_attr(STUDY_OBJECTIVE_ATTR, {**identity, "uid": uuid.uuid4().hex})
        return study, False
    differences = [
        f"{key}: study has {recorded.get(key)!r}, this run has {identity[key]!r}"
        for key in _IDENTITY_KEYS
        if recorded.get(key) != identity[key]
    ]
    if differences:
        raise ConfigError(
            f"study {name!r} in this storage optimises something else; use another --study-name "
            "(or the same settings) to resume it:\n" + "\n".join(f"  - {d}" for d in differences)
        )
    if not recorded.get("uid"):  # a study made before studies had ids
        study.set_user_attr(STUDY_OBJECTIVE_ATTR, {**recorded, "uid": uuid.uuid4().hex})
    return study, n_trials > 0


def find_study(storage: Any, name: str) -> optuna.Study | None:
    """The study ``name`` in ``storage``, or None when there is none (nothing is created)."""
    optuna = import_optuna()
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def study_uid(study: optuna.Study) -> str | None:
    """The id :func:`open_study` gave the study (None for a study not made by paropt): the owner
    its report files record, so that a rerun tells its own reports from another study's."""
    recorded = study.user_attrs.get(STUDY_OBJECTIVE_ATTR)
    return recorded.get("uid") if isinstance(recorded, dict) else None


def default_study_name(paramspace: str | os.PathLike[str], train: str | os.PathLike[str]) -> str:
    """``<space stem>.<train folder>.<train stem>``: rerunning the same command resumes."""
    train_path = Path(train).resolve()
    return f"{Path(paramspace).stem}.{train_path.parent.name}.{train_path.name.split('.')[0]}"


def n_finished(study: optuna.Study) -> int:
    """Trials of the study that count towards ``--total`` (COMPLETE or PRUNED)."""
    optuna = import_optuna()
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def state_counts(study: optuna.Study) -> dict[str, int]:
    """Number of the study's trials per state name (``COMPLETE``, ``PRUNED``, ``FAIL``, ...)."""
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts

