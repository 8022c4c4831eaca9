"""Hyperparameter optimisation with Optuna: resumable, parallel and distributed.

The original GRU4Rec tuned its published settings with Optuna, one trial at a time, each trial a
``run.py`` subprocess whose printed metric was parsed, the study kept in memory. Here:

* trials run in-process through the Python API (``GRU4Rec(config).fit(...)`` and ``evaluate``);
  each worker process reads TRAIN and VALID once and reuses the frames in all of its trials;
* the study lives in an Optuna storage named by a URL (``--storage`` or the environment variable
  ``GRU4REC_OPTUNA_STORAGE``), by default a SQLite file ``paropt.db`` in the output folder, so a
  killed run resumes where it stopped (same ``--study-name``; the default name is derived from
  the search space and the training file, so rerunning the same command resumes);
* several worker processes share one study through that storage, Optuna's own distributed
  mode: ``--workers W`` starts W local processes, and processes on other machines join by
  running the same command with the same ``--storage`` URL (e.g. PostgreSQL) and study name;
* after every epoch the validation metric is reported to Optuna so that a median pruner stops
  hopeless trials (``--no-pruning`` to disable);
* a trial that fails (the loss diverges to NaN, out of memory, an invalid combination of
  parameters) is recorded as FAIL with its reason in the trial's user attribute
  ``fail_reason``, and the study goes on;
* at the end the best parameters are printed as a ready ``-ps`` string and written as parameter
  files (JSON and the original's ``OrderedDict`` .py form); all trials are exported to CSV and
  JSON; optionally the best configuration is trained on TRAIN+VALID and evaluated on a test file.

Search spaces are the original's JSON-lines format, one parameter per line::

    {"name": "layers", "dtype": "int", "values": [64, 512], "step": 32}
    {"name": "learning_rate", "dtype": "float", "values": [0.01, 0.25], "step": 0.005}
    {"name": "final_act", "dtype": "categorical", "values": ["elu-0.5", "elu-1", "linear"]}

``dtype`` ``int``/``float`` takes ``values: [low, high]`` (both ends included) with an optional
``step`` or ``log``; ``categorical`` takes the list of choices. As in the original, an ``int``
``layers`` searches the size of a single layer.

Trial counting (``-nt N``): by default, as in the original, N is the number of trials this run
starts (failed and pruned ones included), split over its ``--workers``. With ``--total`` N is the
size the study should reach: the run stops once the study holds N finished trials (COMPLETE or
PRUNED), so a resumed run only runs the missing ones; failed trials do not count. Concurrent
workers check the count after each trial, so with W workers the study can end up to W-1 trials
past N (Optuna's ``MaxTrialsCallback`` semantics).

Pruning: after epoch e the validation metric is reported as step e-1; the median pruner
(``--prune-startup`` completed trials first, default 5; ``--prune-warmup`` epochs exempt, default
1, so the first check is after epoch 2) stops a trial whose value is below the median of the
earlier trials at that step. The last epoch is never pruned: its value is the trial's result.
With ``--no-pruning`` the metric is only measured once, after the last epoch.

Files in ``--out`` (STUDY = the study name): ``STUDY.best.json`` and ``STUDY.best.py`` (the fixed
and the best searched parameters, readable with ``-pf``), ``STUDY.trials.csv`` and
``STUDY.trials.json`` (every trial: state, value, parameters, per-epoch values, fail reasons),
``STUDY.summary.json`` (counts, best trial, final test), and ``paropt.db`` when the storage is
the default. Existing files are only replaced with ``--force``. Every process that runs
``paropt`` writes these at its end, so with several machines the last one to finish has them all.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import re
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gru4rec.errors import ConfigError, DataError, Gru4RecError, TrainingDivergedError
from gru4rec.files import atomic_write

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna
    import pandas as pd

    from gru4rec.config import Config

__all__ = [
    "ParamSpec",
    "ParoptSettings",
    "StudyReport",
    "parse_paramspace",
    "load_paramspace",
    "check_paramspace",
    "open_storage",
    "run_study",
    "add_arguments",
    "run",
    "main",
    "STORAGE_ENV",
]

#: Environment variable holding the default storage URL.
STORAGE_ENV = "GRU4REC_OPTUNA_STORAGE"
#: Default output folder (best parameters, trial exports, the default SQLite storage).
DEFAULT_OUT = "runs/paropt"
METRICS = ("recall", "mrr")
EVAL_MODES = ("standard", "conservative", "median", "tiebreaking")
DTYPES = ("int", "float", "categorical")
#: A worker stops after this many failed trials in a row: a space where every trial fails would
#: otherwise burn the whole budget (or, with --total, never end).
MAX_CONSECUTIVE_FAILURES = 10
#: RDB storages get Optuna heartbeats, so that trials of a killed worker are marked FAIL once
#: they have been silent for the grace period (checked when a worker starts its next trial).
HEARTBEAT_INTERVAL_S = 60
HEARTBEAT_GRACE_S = 180
# Study user attribute recording what the study optimises, checked when a study is resumed.
_STUDY_ATTR = "gru4rec_paropt"
_STUDY_FORMAT = 1
_OPTUNA_HINT = "hyperparameter optimisation needs optuna: pip install 'gru4rec[tune]' (or pip install optuna)"
_PARAM_STRING_SEPARATORS = (",", "=")


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:  # optional dependency
        raise Gru4RecError(_OPTUNA_HINT) from exc
    return optuna


# ============================================================================================
# Search space
# ============================================================================================


@dataclass(frozen=True)
class ParamSpec:
    """One searched hyperparameter: a line of a paramspace file.

    ``values`` is ``(low, high)`` for ``int``/``float`` (both included) and the choices for
    ``categorical``. ``step`` quantises ``int``/``float`` values (``low + k*step``); ``log``
    samples ``int``/``float`` values log-uniformly. ``line`` is the 1-based line of the file.
    """

    name: str
    dtype: str
    values: tuple[Any, ...]
    step: int | float | None = None
    log: bool = False
    line: int = field(default=0, compare=False)

    @property
    def low(self) -> Any:
        """Lower end of a numeric range."""
        return self.values[0]

    @property
    def high(self) -> Any:
        """Upper end of a numeric range."""
        return self.values[-1]

    def _decimals(self) -> int | None:
        # A float with a step lies on low + k*step; round it to the digits of low and step so
        # that 0.15000000000000002 is written, compared and fed to the model as 0.15.
        if self.dtype != "float" or self.step is None:
            return None
        return max(_n_decimals(self.low), _n_decimals(self.step))

    def clean(self, value: Any) -> Any:
        """``value`` as the model gets it (stepped floats rounded to the step's digits)."""
        digits = self._decimals()
        if digits is not None:
            return round(float(value), digits)
        if self.dtype == "int":
            return int(value)
        return value

    def suggest(self, trial: "optuna.trial.BaseTrial") -> Any:
        """Ask ``trial`` for a value of this parameter (Optuna's suggest_int/float/categorical)."""
        if self.dtype == "int":
            return int(trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log))
        if self.dtype == "float":
            value = trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)
            return self.clean(value)
        return trial.suggest_categorical(self.name, list(self.values))

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a value this parameter can take."""
        if self.dtype == "categorical":
            return any(type(value) is type(c) and value == c for c in self.values)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.dtype == "int" and not float(value).is_integer():
            return False
        if not self.low <= value <= self.high:
            return False
        if self.step is not None:
            k = (value - self.low) / self.step
            return abs(k - round(k)) < 1e-6
        return True

    def format(self, value: Any) -> str:
        """``value`` in parameter-string syntax (what ``Config.from_string`` reads back)."""
        value = self.clean(value)
        if isinstance(value, bool):
            return "True" if value else "False"
        if isinstance(value, float):
            return repr(value)
        return str(value)

    def to_json(self) -> dict[str, Any]:
        """The paramspace line as a JSON object (what :func:`parse_paramspace` reads)."""
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "values": list(self.values)}
        if self.step is not None:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        return out


def _n_decimals(number: float | int) -> int:
    exponent = Decimal(repr(number)).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_SPEC_KEYS = ("name", "dtype", "values", "step", "log")


def _parse_spec(obj: Any, line: int) -> tuple[ParamSpec | None, list[str]]:
    """One decoded paramspace line -> (spec, problems); the problems do not name the line yet."""
    if not isinstance(obj, dict):
        return None, [f"expected a JSON object {{\"name\": ..., \"dtype\": ..., \"values\": [...]}}, got {type(obj).__name__}"]
    problems: list[str] = []
    unknown = [k for k in obj if k not in _SPEC_KEYS]
    if unknown:
        problems.append(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(_SPEC_KEYS)}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"'name' must be a non-empty string, got {name!r}")
        name = None
    else:
        name = name.strip()
    dtype = obj.get("dtype")
    if dtype not in DTYPES:
        problems.append(f"'dtype' must be one of {', '.join(DTYPES)}, got {dtype!r}")
        dtype = None
    if "values" not in obj:
        problems.append("missing 'values' ([low, high] for int/float, the list of choices for categorical)")
        values = None
    else:
        values = obj["values"]
        if not isinstance(values, list) or not values:
            problems.append(f"'values' must be a non-empty list, got {values!r}")
            values = None
    step = obj.get("step")
    log = obj.get("log", False)
    if not isinstance(log, bool):
        problems.append(f"'log' must be true or false, got {log!r}")
        log = False

    if dtype == "categorical":
        if "step" in obj:
            problems.append("'step' applies to int and float parameters, not to categorical")
        if "log" in obj:
            problems.append("'log' applies to int and float parameters, not to categorical")
        if values is not None:
            for i, choice in enumerate(values):
                if isinstance(choice, str):
                    if not choice.strip() or choice != choice.strip() or any(s in choice for s in _PARAM_STRING_SEPARATORS):
                        problems.append(
                            f"choice {i} {choice!r} cannot be written in a parameter string "
                            "(empty, surrounding blanks, ',' or '=')"
                        )
                elif not (isinstance(choice, bool) or _is_number(choice)):
                    problems.append(f"choice {i} must be a string, number or boolean, got {choice!r}")
            seen: list[Any] = []
            for choice in values:
                if any(type(choice) is type(s) and choice == s for s in seen):
                    problems.append(f"choice {choice!r} is listed more than once")
                seen.append(choice)
    elif dtype in ("int", "float") and values is not None:
        if len(values) != 2:
            problems.append(f"'values' of a {dtype} parameter must be [low, high], got {values!r}")
        elif not all(_is_number(v) for v in values):
            problems.append(f"'values' must be two finite numbers, got {values!r}")
        elif dtype == "int" and not all(float(v).is_integer() for v in values):
            problems.append(f"'values' of an int parameter must be integers, got {values!r}")
        elif values[0] > values[1]:
            problems.append(f"low > high in 'values' {values!r}")
        else:
            if dtype == "int":
                values = [int(v) for v in values]
            else:
                values = [float(v) for v in values]
            if log and values[0] <= 0:
                problems.append(f"'log' needs low > 0, got low {values[0]!r}")
            if step is not None:
                if not _is_number(step) or step <= 0:
                    problems.append(f"'step' must be a positive number, got {step!r}")
                elif dtype == "int" and not float(step).is_integer():
                    problems.append(f"'step' of an int parameter must be an integer, got {step!r}")
                else:
                    step = int(step) if dtype == "int" else float(step)
                    if log and not (dtype == "int" and step == 1):
                        problems.append("'step' and 'log' cannot be combined (Optuna samples a log range without steps)")
                    # The upper end must be reachable: Optuna would silently lower it.
                    k = (values[1] - values[0]) / step
                    if abs(k - round(k)) > 1e-9 * max(1.0, abs(k)):
                        problems.append(
                            f"the range {values!r} is not a whole number of steps of {step!r} "
                            f"(high would be unreachable)"
                        )
    if problems or name is None or dtype is None or values is None:
        return None, problems
    return ParamSpec(name=name, dtype=dtype, values=tuple(values), step=step, log=bool(log), line=line), []


def parse_paramspace(text: str, source: str = "paramspace") -> list[ParamSpec]:
    """Parse a paramspace in the original's JSON-lines format (one JSON object per line).

    Blank lines are skipped. Every malformed line (invalid JSON, unknown key or dtype, missing
    or malformed ``values``, low > high, ``step`` or ``log`` with a categorical, a duplicated
    name, ...) is reported at once in one :class:`~gru4rec.errors.ConfigError` that names
    ``source`` and the line numbers.
    """
    specs: list[ParamSpec] = []
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        spec, line_problems = _parse_spec(obj, number)
        problems.extend(f"line {number}: {p}" for p in line_problems)
        if spec is None:
            continue
        if spec.name in first_line:
            problems.append(f"line {number}: parameter {spec.name!r} already defined on line {first_line[spec.name]}")
            continue
        first_line[spec.name] = number
        specs.append(spec)
    if not specs and not problems:
        problems.append("no parameters: expected one JSON object per line, e.g. "
                        '{"name": "layers", "dtype": "int", "values": [64, 512], "step": 32}')
    if problems:
        _raise_problems(f"paramspace {source}", problems)
    return specs


def load_paramspace(path: str | os.PathLike[str]) -> list[ParamSpec]:
    """Read and parse a paramspace file (see :func:`parse_paramspace`); errors name the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"paramspace '{path}' {'is a directory' if file.is_dir() else 'does not exist'}")
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"paramspace '{path}' cannot be read: {exc}") from None
    return parse_paramspace(text, source=f"'{path}'")


def _raise_problems(where: str, problems: list[str]) -> None:
    if len(problems) == 1:
        raise ConfigError(f"invalid {where}: {problems[0]}")
    raise ConfigError(f"{len(problems)} problems in {where}:\n" + "\n".join(f"  - {p}" for p in problems))


def _fixed_names(fixed: str) -> list[str]:
    """Parameter names of a ``-fp`` string, in order (the values are parsed by Config)."""
    return [part.partition("=")[0].strip() for part in fixed.split(",") if part.strip()]


def check_paramspace(space: Sequence[ParamSpec], base: "Config", fixed: str = "") -> None:
    """Check the space against the configuration it modifies, before any trial runs.

    Every searched name must be a hyperparameter, must not also be fixed, and every end of a
    range and every choice must be a valid value on top of ``base`` (the fixed parameters), so
    that a typo fails now with a clear error instead of failing all trials.
    Invalid *combinations* of several searched values are left to the trials (they FAIL).
    """
    problems: list[str] = []
    fixed_set = {_canonical_name(n) for n in _fixed_names(fixed)}
    for spec in space:
        where = f"line {spec.line}: {spec.name}" if spec.line else spec.name
        if _canonical_name(spec.name) in fixed_set:
            problems.append(f"{where}: is both fixed (-fp) and searched; remove it from one of them")
            continue
        probes = spec.values if spec.dtype == "categorical" else (spec.low, spec.high)
        for value in probes:
            try:
                base.replace_from_string(f"{spec.name}={spec.format(value)}")
            except ConfigError as exc:
                detail = "; ".join(getattr(exc, "problems", [str(exc)]))
                problems.append(f"{where}={spec.format(value)} is invalid with the fixed parameters: {detail}")
                break  # one report per parameter is enough
    if problems:
        _raise_problems("search space", problems)


def _canonical_name(name: str) -> str:
    # elu_param is the official ports' alias of final_act.
    return "final_act" if name == "elu_param" else name


def trial_param_string(space: Sequence[ParamSpec], params: dict[str, Any]) -> str:
    """The searched values of a trial as ``name=value,...`` in the order of the space."""
    return ",".join(f"{s.name}={s.format(params[s.name])}" for s in space if s.name in params)


def _join_params(*parts: str) -> str:
    return ",".join(p.strip(",") for p in parts if p and p.strip(","))


# ============================================================================================
# Storage and study
# ============================================================================================


def _redact(url: str) -> str:
    """A storage URL fit for printing (password hidden)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def _resolve_storage_url(url: str | None, out_dir: Path) -> str:
    url = url or os.environ.get(STORAGE_ENV) or ""
    if not url:
        return f"sqlite:///{(out_dir / 'paropt.db').resolve()}"
    if url.startswith("journal:") or "://" in url:
        return url
    # A bare path: SQLite unless it names a journal file.
    path = Path(url).expanduser().resolve()
    if path.suffix in (".log", ".journal", ".jsonl"):
        return f"journal:{path}"
    return f"sqlite:///{path}"


def open_storage(url: str | None = None, out_dir: str | os.PathLike[str] = DEFAULT_OUT) -> tuple[Any, str]:
    """Open the Optuna storage a URL names; returns ``(storage, url)``.

    ``url`` (or, when None, the environment variable ``GRU4REC_OPTUNA_STORAGE``):

    * any SQLAlchemy URL (``sqlite:///abs/path.db``, ``postgresql://user:pw@host/db``, ...):
      an RDB storage with heartbeats, so trials of a killed worker end up FAIL;
    * ``journal:PATH``: Optuna's journal file storage (safe for several processes on one
      machine or on a shared file system without a database server);
    * a bare path: ``*.log``/``*.journal``/``*.jsonl`` -> journal, anything else -> SQLite;
    * nothing: ``sqlite:///<out_dir>/paropt.db``.
    """
    optuna = _import_optuna()
    out = Path(out_dir)
    resolved = _resolve_storage_url(url, out)
    if resolved.startswith("journal:"):
        path = Path(resolved[len("journal:"):].removeprefix("//")).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(path))), resolved
    engine_kwargs: dict[str, Any] = {}
    if resolved.startswith("sqlite:"):
        db = resolved.split(":///", 1)[-1]
        if db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        # Several local workers write to one SQLite file: wait for the lock instead of failing
        # after SQLite's default 5 s (a trial's writes are tiny; waits are short but can stack).
        engine_kwargs["connect_args"] = {"timeout": 120}
    for attempt in range(_STORAGE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                # Heartbeats are flagged experimental in Optuna; they are what marks a killed
                # worker's trials FAIL, so use them without the warning on every start.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(
                    resolved,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=HEARTBEAT_GRACE_S,
                )
            return storage, resolved
        except ImportError as exc:  # e.g. the database driver of a postgresql:// URL
            raise Gru4RecError(f"storage {_redact(resolved)}: {exc}") from exc
        except Exception as exc:  # SQLAlchemy raises many types for a bad URL or an unreachable server
            # Workers that start together race to create the schema of a new database
            # ("table ... already exists", "database is locked"): the loser tries again.
            if attempt + 1 < _STORAGE_ATTEMPTS and _is_transient(exc):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise Gru4RecError(f"cannot open the Optuna storage {_redact(resolved)}: {type(exc).__name__}: {exc}") from exc
    raise AssertionError("unreachable")


_STORAGE_ATTEMPTS = 8


def _is_transient(exc: BaseException) -> bool:
    text = str(exc)
    return "already exists" in text or "database is locked" in text or "UNIQUE constraint failed" in text


def _study_identity(settings: "ParoptSettings", prepared: "_Prepared") -> dict[str, Any]:
    """What a study optimises; a resumed study must match it (see :func:`_open_study`).

    The fixed parameters are compared as typed values, so their order or spelling in ``-fp``
    does not matter.
    """
    values = prepared.base.to_dict()
    fixed = {name: values[name] for name in map(_canonical_name, _fixed_names(settings.fixed)) if name in values}
    return {
        "format": _STUDY_FORMAT,
        "space": [s.to_json() for s in prepared.space],
        "fixed": dict(sorted(fixed.items())),
        "metric": settings.primary_metric,
        "cutoff": settings.measure,
        "eval_mode": settings.eval_mode,
        "train": str(settings.train),
        "valid": str(settings.valid),
    }


# Keys of the identity a resumed run must agree with (data paths may differ between machines).
_IDENTITY_KEYS = ("space", "fixed", "metric", "cutoff", "eval_mode")


def _open_study(
    storage: Any, name: str, identity: dict[str, Any], sampler: Any, pruner: Any
) -> tuple["optuna.Study", bool]:
    """Create the study or load it if it exists; returns ``(study, resumed)``.

    Refuses to resume a study that optimises something else (other space, fixed parameters,
    metric, cutoff or tie mode) or that was not made by this tool, since mixing trials of
    different objectives would make the best trial meaningless.
    """
    optuna = _import_optuna()
    study = optuna.create_study(
        storage=storage, study_name=name, sampler=sampler, pruner=pruner, direction="maximize", load_if_exists=True
    )
    recorded = study.user_attrs.get(_STUDY_ATTR)
    n_trials = len(study.get_trials(deepcopy=False))
    if recorded is None:
        if n_trials:
            raise ConfigError(
                f"study {name!r} exists in the storage with {n_trials} trials but was not created by gru4rec paropt; "
                "choose another --study-name"
            )
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ConfigError(f"study {name!r} exists and minimises; choose another --study-name")
        study.set_user_attr(_STUDY_ATTR, identity)
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
    return study, n_trials > 0


def default_study_name(paramspace: str | os.PathLike[str], train: str | os.PathLike[str]) -> str:
    """``<space stem>.<train folder>.<train stem>``: rerunning the same command resumes."""
    train_path = Path(train).resolve()
    return f"{Path(paramspace).stem}.{train_path.parent.name}.{train_path.name.split('.')[0]}"


# ============================================================================================
# Settings
# ============================================================================================


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
    """Trials to run (``-nt``); with ``total`` the number of finished trials the study should hold."""
    total: bool = False
    measure: int = 20
    """Cutoff of the objective (``-m``)."""
    final_measure: tuple[int, ...] = (20,)
    """Cutoffs of the final test (``-fm``)."""
    primary_metric: str = "recall"
    eval_mode: str = "standard"
    session_key: str | None = None
    item_key: str | None = None
    time_key: str | None = None
    device: str = "auto"
    precision: str = "float32"
    """Training precision of every trial (``--precision``; see :class:`gru4rec.GRU4Rec`)."""
    threads: int | None = None
    """torch threads per worker; None: 1 when workers > 1, else torch's default."""
    workers: int = 1
    storage: str | None = None
    study_name: str | None = None
    pruning: bool = True
    prune_startup: int = 5
    """Median pruner: completed trials before any pruning."""
    prune_warmup: int = 1
    """Median pruner: epochs exempt from pruning (a trial can first be pruned after epoch warmup+1)."""
    sampler_seed: int | None = None
    """Seed of the TPE sampler (worker i uses seed + i); None: random."""
    timeout: float | None = None
    """Stop starting trials after this many seconds (per worker)."""
    out: str = DEFAULT_OUT
    final_test: str | None = None
    force: bool = False
    verbose: bool = False

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
        if self.timeout is not None and self.timeout <= 0:
            problems.append(f"--timeout must be > 0, got {self.timeout}")
        try:
            from gru4rec.recommender import resolve_device
            from gru4rec.training.precision import check_precision

            check_precision(self.precision, resolve_device(self.device), warn=False)  # the trials' Trainers warn
        except Gru4RecError as exc:
            problems.append(f"--device/--precision: {exc}")
        if problems:
            _raise_problems("paropt settings", problems)


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


# ============================================================================================
# Trials
# ============================================================================================


class _TrialFailed(Exception):
    """A trial that cannot give a value; Optuna records it as FAIL (``catch``)."""


def _is_oom(exc: BaseException) -> bool:
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


class _EpochReporter:
    """The ``fit`` callback: evaluate on VALID after every epoch, report, maybe prune."""

    def __init__(self, trial: "optuna.trial.Trial", score: Callable[[Any], float], n_epochs: int, per_epoch: bool):
        self.trial = trial
        self.score = score
        self.n_epochs = n_epochs
        self.per_epoch = per_epoch
        self.epochs = 0
        self.value: float | None = None

    def __call__(self, info: Any) -> None:
        self.epochs += 1
        loss = float(info.loss)
        if not math.isfinite(loss):  # the trainer should raise first; never score a broken model
            raise TrainingDivergedError(f"the training loss became {loss} in epoch {self.epochs}")
        if not self.per_epoch:
            return
        self.value = self.score(info.model)
        # Steps are 0-based epochs: MedianPruner's n_warmup_steps = epochs exempt from pruning.
        self.trial.report(self.value, self.epochs - 1)
        # The last epoch's value is the result: a finished trial is not thrown away.
        if self.epochs < self.n_epochs and self.trial.should_prune():
            optuna = _import_optuna()
            raise optuna.TrialPruned(f"pruned after epoch {self.epochs}")


class _Objective:
    """The Optuna objective: one in-process training on TRAIN, validated on VALID."""

    def __init__(
        self,
        settings: ParoptSettings,
        space: Sequence[ParamSpec],
        base: "Config",
        train: "pd.DataFrame",
        valid: "pd.DataFrame",
        per_epoch: bool,
    ):
        self.settings = settings
        self.space = list(space)
        self.base = base
        self.train = train
        self.valid = valid
        self.per_epoch = per_epoch
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

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

    def __call__(self, trial: "optuna.trial.Trial") -> float:
        optuna = _import_optuna()
        from gru4rec.recommender import GRU4Rec

        params = {spec.name: spec.suggest(trial) for spec in self.space}
        searched = trial_param_string(self.space, params)
        trial.set_user_attr("param_string", searched)
        trial.set_user_attr("worker", self.worker)
        model = None
        reporter: _EpochReporter | None = None
        start = time.perf_counter()
        try:
            config = self.base.replace_from_string(searched)
            reporter = _EpochReporter(trial, self.score, config.n_epochs, self.per_epoch)
            model = GRU4Rec(config, device=self.settings.device, precision=self.settings.precision)
            # Quiet trials: one line per trial comes from _Progress; -v shows the epoch lines.
            training_log = logging.getLogger("gru4rec.training")
            level = training_log.level
            if not self.settings.verbose:
                training_log.setLevel(logging.WARNING)
            try:
                model.fit(self.train, callback=reporter, progress=False)
            finally:
                training_log.setLevel(level)
            trial.set_user_attr("epochs", reporter.epochs)
            value = reporter.value if reporter.value is not None and reporter.epochs == config.n_epochs else self.score(model)
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            return value
        except optuna.TrialPruned:
            trial.set_user_attr("epochs", reporter.epochs if reporter is not None else 0)
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            raise
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
        raise _TrialFailed(reason)


def _free_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


class _Progress:
    """Optuna callback: one line per finished trial; stops the worker when it should."""

    def __init__(self, settings: ParoptSettings, prefix: str, stop_at_total: int | None):
        self.label = _metric_label(settings)
        self.prefix = prefix
        self.stop_at_total = stop_at_total
        self.consecutive_failures = 0
        self.gave_up: str | None = None

    def __call__(self, study: "optuna.Study", trial: "optuna.trial.FrozenTrial") -> None:
        optuna = _import_optuna()
        states = optuna.trial.TrialState
        params = trial.user_attrs.get("param_string", "")
        seconds = trial.user_attrs.get("seconds")
        took = f"{seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        if trial.state == states.COMPLETE:
            try:
                best = study.best_trial
                best_text = f"best {best.value:.5f} (trial {best.number})"
            except ValueError:
                best_text = ""
            line = f"Trial {trial.number} COMPLETE {self.label}={trial.value:.5f}  {best_text}  {took}  {params}"
            self.consecutive_failures = 0
        elif trial.state == states.PRUNED:
            last = trial.last_step
            value = trial.intermediate_values.get(last) if last is not None else None
            value_text = f" {self.label}={value:.5f}" if value is not None else ""
            line = f"Trial {trial.number} PRUNED after epoch {trial.user_attrs.get('epochs', '?')}{value_text}  {took}  {params}"
            self.consecutive_failures = 0
        else:
            reason = trial.user_attrs.get("fail_reason") or trial.system_attrs.get("fail_reason", "")
            line = f"Trial {trial.number} {trial.state.name} {reason}  {params}"
            if trial.state == states.FAIL:
                self.consecutive_failures += 1
                if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    self.gave_up = f"stopped after {self.consecutive_failures} failed trials in a row; the last: {reason}"
                    study.stop()
        print(self.prefix + line, flush=True)
        if self.stop_at_total is not None and _n_finished(study) >= self.stop_at_total:
            study.stop()


def _metric_label(settings: ParoptSettings) -> str:
    return f"{'MRR' if settings.primary_metric == 'mrr' else 'Recall'}@{settings.measure}"


def _n_finished(study: "optuna.Study") -> int:
    optuna = _import_optuna()
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


# ============================================================================================
# Workers
# ============================================================================================


@dataclass
class _Prepared:
    """What every worker derives from the settings before its first trial."""

    space: list[ParamSpec]
    base: "Config"
    keys: dict[str, str]
    study_name: str
    storage_url: str


def _prepare(settings: ParoptSettings) -> _Prepared:
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
    url = _resolve_storage_url(settings.storage, Path(settings.out))
    return _Prepared(space=space, base=base, keys=keys, study_name=name, storage_url=url)


def _make_sampler_pruner(settings: ParoptSettings, worker: int) -> tuple[Any, Any]:
    optuna = _import_optuna()
    seed = None if settings.sampler_seed is None else settings.sampler_seed + worker
    sampler = optuna.samplers.TPESampler(seed=seed)
    if settings.pruning:
        pruner = optuna.pruners.MedianPruner(n_startup_trials=settings.prune_startup, n_warmup_steps=settings.prune_warmup)
    else:
        pruner = optuna.pruners.NopPruner()
    return sampler, pruner


def _set_threads(settings: ParoptSettings) -> None:
    threads = settings.threads if settings.threads is not None else (1 if settings.workers > 1 else None)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _read_data(settings: ParoptSettings, keys: dict[str, str]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    from gru4rec.data.events import read_events

    return read_events(settings.train, **keys), read_events(settings.valid, **keys)


def _work(
    settings: ParoptSettings,
    prepared: _Prepared,
    worker: int,
    n_trials: int | None,
    sampler: Any = None,
    pruner: Any = None,
    storage: Any = None,
    data: dict[str, Any] | None = None,
) -> str | None:
    """Run one worker's trials in this process; returns why it gave up early, or None.

    ``data`` (optional) receives the frames read, so that the caller can reuse them.
    """
    optuna = _import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING if settings.verbose else optuna.logging.ERROR)
    _set_threads(settings)
    default_sampler, default_pruner = _make_sampler_pruner(settings, worker)
    if storage is None:
        storage, _ = open_storage(prepared.storage_url, settings.out)
    study, _ = _open_study(
        storage,
        prepared.study_name,
        _study_identity(settings, prepared),
        sampler if sampler is not None else default_sampler,
        pruner if pruner is not None else default_pruner,
    )
    stop_at = settings.n_trials if settings.total else None
    if stop_at is not None and _n_finished(study) >= stop_at:
        return None
    train, valid = _read_data(settings, prepared.keys)  # once per worker, shared by its trials
    if data is not None:
        data.update(train=train, valid=valid)
    per_epoch = not isinstance(study.pruner, optuna.pruners.NopPruner)
    objective = _Objective(settings, prepared.space, prepared.base, train, valid, per_epoch)
    prefix = f"[worker {worker}] " if settings.workers > 1 else ""
    progress = _Progress(settings, prefix, stop_at)
    study.optimize(
        objective,
        n_trials=n_trials,
        timeout=settings.timeout,
        catch=(_TrialFailed,),
        callbacks=[progress],
        gc_after_trial=True,
    )
    return progress.gave_up


def _worker_process(settings: ParoptSettings, worker: int, n_trials: int | None, sampler: Any, pruner: Any) -> None:
    """Entry point of a spawned local worker process."""
    try:
        prepared = _prepare(settings)
        gave_up = _work(settings, prepared, worker, n_trials, sampler, pruner)
    except Gru4RecError as exc:
        print(f"[worker {worker}] error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        sys.exit(130)
    if gave_up:
        print(f"[worker {worker}] {gave_up}", file=sys.stderr, flush=True)
        sys.exit(3)


def _shares(n_trials: int, workers: int) -> list[int]:
    return [n_trials // workers + (1 if i < n_trials % workers else 0) for i in range(workers)]


# ============================================================================================
# Outputs
# ============================================================================================


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
    names = [_canonical_name(n) for n in _fixed_names(fixed)] + [_canonical_name(s.name) for s in space]
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


def _counts(study: "optuna.Study") -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def _check_outputs(paths: dict[str, Path], force: bool) -> None:
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise Gru4RecError(
            f"output file(s) exist: {', '.join(existing)}; pass --force to overwrite them "
            "or choose another --out / --study-name"
        )


# ============================================================================================
# Final test
# ============================================================================================


def _final_test(
    settings: ParoptSettings, config: "Config", keys: dict[str, str], frames: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train ``config`` on TRAIN+VALID, evaluate on the test file at the -fm cutoffs.

    ``frames`` may hold TRAIN and VALID already read (keys ``train``, ``valid``).
    """
    import pandas as pd

    from gru4rec.data.events import read_events
    from gru4rec.evaluation.evaluator import evaluate
    from gru4rec.recommender import GRU4Rec

    assert settings.final_test is not None
    if frames and "train" in frames and "valid" in frames:
        train, valid = frames["train"], frames["valid"]
    else:
        train, valid = _read_data(settings, keys)
    test = read_events(settings.final_test, **keys)
    shared = set(train[keys["session_key"]].unique()) & set(valid[keys["session_key"]].unique())
    if shared:
        print(f"warning: {len(shared)} session ids occur in both TRAIN and VALID; "
              "they are merged into one session each for the final training", file=sys.stderr)
    full = pd.concat([train, valid], ignore_index=True)
    print(f"Final training on TRAIN+VALID ({len(full)} events) with the best parameters ...", flush=True)
    start = time.perf_counter()
    model = GRU4Rec(config, device=settings.device, precision=settings.precision).fit(full)
    train_s = time.perf_counter() - start
    cutoffs = tuple(sorted(set(settings.final_measure)))
    result = evaluate(model, test, cutoffs=cutoffs, mode=settings.eval_mode)
    for c in cutoffs:
        print(f"Recall@{c}: {result.recall[c]:.6f} MRR@{c}: {result.mrr[c]:.6f}", flush=True)
    return {
        "test": str(settings.final_test),
        "eval_mode": settings.eval_mode,
        "recall": {str(c): float(result.recall[c]) for c in cutoffs},
        "mrr": {str(c): float(result.mrr[c]) for c in cutoffs},
        "n_predictions": int(getattr(result, "n_predictions", 0)),
        "train_seconds": round(train_s, 3),
    }


# ============================================================================================
# The run
# ============================================================================================


def run_study(settings: ParoptSettings, *, sampler: Any = None, pruner: Any = None) -> StudyReport:
    """Run (or resume) a study, then export its results; see the module docstring.

    ``sampler``/``pruner`` replace the defaults (TPE; median pruner or, with
    ``settings.pruning=False``, none) in every worker; with ``workers > 1`` they must pickle.
    Raises Gru4RecError subclasses for invalid settings, data or storage.
    """
    optuna = _import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING if settings.verbose else optuna.logging.ERROR)
    prepared = _prepare(settings)
    paths = output_paths(settings.out, prepared.study_name)
    _check_outputs(paths, settings.force)
    # Missing data fails now, before a study is created for it.
    for label, path in (("TRAIN", settings.train), ("VALID", settings.valid), ("--final-test", settings.final_test)):
        if path is not None and not Path(path).is_file():
            raise DataError(f"{label} {path}: file not found")

    # Create (or check) the study once here, so that the workers never race to create it.
    storage, url = open_storage(prepared.storage_url, settings.out)
    default_sampler, default_pruner = _make_sampler_pruner(settings, 0)
    study, resumed = _open_study(
        storage,
        prepared.study_name,
        _study_identity(settings, prepared),
        sampler or default_sampler,
        pruner or default_pruner,
    )
    counts = _counts(study)
    what = "Resuming" if resumed else "Starting"
    counts_text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    print(f"{what} study {prepared.study_name!r} in {_redact(url)} ({counts_text})", flush=True)
    if settings.total:
        plan = f"until the study holds {settings.n_trials} finished trials ({_n_finished(study)} now)"
    else:
        plan = f"{settings.n_trials} trial(s)"
    print(f"Running {plan} with {settings.workers} worker(s); objective {_metric_label(settings)} ({settings.eval_mode}) "
          f"on {settings.valid}; pruning {'on' if settings.pruning or pruner is not None else 'off'}", flush=True)

    problems: list[str] = []
    frames: dict[str, Any] = {}  # TRAIN and VALID as worker 0 read them, reused by the final test
    start = time.perf_counter()
    shares: list[int | None] = [None] * settings.workers if settings.total else list(_shares(settings.n_trials, settings.workers))
    processes = []
    if settings.workers > 1:
        context = multiprocessing.get_context("spawn")  # no fork: torch and SQLite handles do not survive it
        for worker in range(1, settings.workers):
            if shares[worker] == 0:
                continue
            process = context.Process(
                target=_worker_process, args=(settings, worker, shares[worker], sampler, pruner), name=f"paropt-worker-{worker}"
            )
            process.start()
            processes.append((worker, process))
    try:
        if shares[0] != 0:
            gave_up = _work(settings, prepared, 0, shares[0], sampler, pruner, storage, frames)
            if gave_up:
                problems.append(f"worker 0: {gave_up}")
    finally:
        for worker, process in processes:
            process.join()
            if process.exitcode != 0:
                problems.append(f"worker {worker} exited with code {process.exitcode}")
    wall = time.perf_counter() - start

    study = optuna.load_study(study_name=prepared.study_name, storage=storage)
    report = StudyReport(study_name=prepared.study_name, storage=_redact(url), counts=_counts(study), problems=problems)
    counts_text = ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items()))
    print(f"Study {prepared.study_name!r}: {counts_text}; this run took {wall:.1f} s", flush=True)

    # Exports: every trial, whatever the outcome.
    paths["trials_json"].parent.mkdir(parents=True, exist_ok=True)
    frame = study.trials_dataframe()
    for spec in prepared.space:  # stored values are raw floats (0.35000000000000003): write them clean
        column = f"params_{spec.name}"
        if column in frame.columns:
            frame[column] = frame[column].map(lambda v, spec=spec: v if _is_missing(v) else spec.clean(v))
    _write_text(paths["trials_csv"], frame.to_csv(index=False))
    records = _json_safe(_trial_records(study, prepared.space))
    _write_text(paths["trials_json"], json.dumps(records, indent=1, allow_nan=False) + "\n")
    report.files = {"trials_csv": str(paths["trials_csv"]), "trials_json": str(paths["trials_json"])}

    try:
        best = study.best_trial
    except ValueError:
        best = None
    if best is None:
        print("No trial completed: no best parameters.", flush=True)
        problems.append("no trial completed")
    else:
        searched = trial_param_string(prepared.space, best.params)
        best_string = _join_params(settings.fixed, searched)
        report.best_number, report.best_value = best.number, best.value
        report.best_params = {s.name: s.clean(best.params[s.name]) for s in prepared.space if s.name in best.params}
        report.best_param_string = best_string
        metric_label = _metric_label(settings)
        print(f"Best trial {best.number}: {metric_label}={best.value:.6f}", flush=True)
        print(f"Best parameters: {best_string}", flush=True)
        params = best_param_dict(prepared.base, settings.fixed, prepared.space, searched)
        header = (
            f"Best parameters of Optuna study {prepared.study_name!r}: trial {best.number}, "
            f"{metric_label}={best.value:.6f} on {settings.valid} (gru4rec paropt)"
        )
        _write_text(paths["best_json"], json.dumps(params, indent=1) + "\n")
        _write_text(paths["best_py"], _py_param_file(params, header))
        report.files.update(best_json=str(paths["best_json"]), best_py=str(paths["best_py"]))
        if settings.final_test is not None:
            _set_threads(settings)
            config = prepared.base.replace_from_string(searched)
            report.final = _final_test(settings, config, prepared.keys, frames)

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
        "problems": problems,
    }
    _write_text(paths["summary"], json.dumps(_json_safe(summary), indent=1, allow_nan=False) + "\n")
    report.files["summary"] = str(paths["summary"])
    print("Wrote " + ", ".join(report.files.values()), flush=True)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr, flush=True)
    return report


# ============================================================================================
# Command line
# ============================================================================================


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add paropt's options to ``parser`` (the original's flags plus storage/parallel options)."""
    parser.add_argument("path", metavar="TRAIN", help="training events (TSV/CSV/Parquet)")
    parser.add_argument("test", metavar="VALID", help="validation events the objective is measured on")
    parser.add_argument("-opf", "--optuna_parameter_file", metavar="PATH", required=True,
                        help="search space: JSON lines {name, dtype int|float|categorical, values, step, log}")
    parser.add_argument("-fp", "--fixed_parameters", metavar="PARAM_STRING", default="",
                        help="fixed parameters, e.g. 'loss=cross-entropy,constrained_embedding=True,n_epochs=10'")
    parser.add_argument("-nt", "--ntrials", metavar="NT", type=int, default=50,
                        help="trials to run in this invocation (with --total: finished trials the study should hold); default 50")
    parser.add_argument("--total", action="store_true",
                        help="-nt counts the study's finished (COMPLETE+PRUNED) trials, so a resumed run only runs the missing ones")
    parser.add_argument("-m", "--measure", metavar="AT", type=int, default=20, help="cutoff of the objective metric (default 20)")
    parser.add_argument("-fm", "--final_measure", metavar="AT", type=int, nargs="*", default=[20],
                        help="cutoffs of the final test (--final-test); default 20")
    parser.add_argument("-pm", "--primary_metric", metavar="METRIC", choices=METRICS, default="recall",
                        help="objective: recall or mrr (default recall)")
    parser.add_argument("-e", "--eval_type", metavar="MODE", choices=EVAL_MODES, default="standard",
                        help="tie handling: standard, conservative, median or tiebreaking (default standard)")
    parser.add_argument("-ik", "--item_key", metavar="IK", default=None, help="item id column (default ItemId)")
    parser.add_argument("-sk", "--session_key", metavar="SK", default=None, help="session id column (default SessionId)")
    parser.add_argument("-tk", "--time_key", metavar="TK", default=None, help="time column (default Time)")
    parser.add_argument("-d", "--device", default="auto", help="torch device: auto, cpu, cuda, cuda:1, ... (default auto)")
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                        help="training precision of the trials (default float32; see gru4rec train --help)")
    parser.add_argument("--storage", metavar="URL", default=None,
                        help=f"Optuna storage: SQLAlchemy URL, journal:PATH or a file path (default: ${STORAGE_ENV}, "
                             "else sqlite:///OUT/paropt.db)")
    parser.add_argument("--study-name", default=None,
                        help="study to create or resume (default: <space>.<train folder>.<train file>)")
    parser.add_argument("--no-pruning", action="store_true", help="no pruning (and no per-epoch validation)")
    parser.add_argument("--prune-startup", type=int, default=5, metavar="N",
                        help="median pruner: completed trials before pruning starts (default 5)")
    parser.add_argument("--prune-warmup", type=int, default=1, metavar="E",
                        help="median pruner: epochs exempt from pruning (default 1)")
    parser.add_argument("--workers", type=int, default=1, metavar="W",
                        help="local worker processes sharing the study (default 1)")
    parser.add_argument("--threads", type=int, default=None, metavar="T",
                        help="torch threads per worker (default: 1 with several workers, else torch's default)")
    parser.add_argument("--seed", type=int, default=None, dest="sampler_seed",
                        help="seed of the TPE sampler (worker i uses seed+i; give distinct seeds on other machines)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="start no new trial after S seconds")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"folder for the best parameters, trial exports and the default storage (default {DEFAULT_OUT})")
    parser.add_argument("--final-test", default=None, metavar="TEST",
                        help="train the best configuration on TRAIN+VALID and evaluate it on TEST at the -fm cutoffs")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Optuna's own log messages")


def settings_from_args(args: argparse.Namespace) -> ParoptSettings:
    """The :class:`ParoptSettings` of parsed command-line arguments."""
    return ParoptSettings(
        train=args.path,
        valid=args.test,
        paramspace=args.optuna_parameter_file,
        fixed=args.fixed_parameters or "",
        n_trials=args.ntrials,
        total=args.total,
        measure=args.measure,
        final_measure=tuple(args.final_measure or (20,)),
        primary_metric=args.primary_metric,
        eval_mode=args.eval_type,
        session_key=args.session_key,
        item_key=args.item_key,
        time_key=args.time_key,
        device=args.device,
        precision=args.precision,
        threads=args.threads,
        workers=args.workers,
        storage=args.storage,
        study_name=args.study_name,
        pruning=not args.no_pruning,
        prune_startup=args.prune_startup,
        prune_warmup=args.prune_warmup,
        sampler_seed=args.sampler_seed,
        timeout=args.timeout,
        out=args.out,
        final_test=args.final_test,
        force=args.force,
        verbose=args.verbose,
    )


def run(args: argparse.Namespace) -> int:
    """Run paropt for parsed arguments; returns the exit code.

    0: done; 1: no trial completed or a worker stopped early; 2: invalid input (one-line error
    on stderr; with ``args.debug`` the exception propagates); 130: interrupted.
    """
    try:
        report = run_study(settings_from_args(args))
    except Gru4RecError as exc:
        if getattr(args, "debug", False):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume the study", file=sys.stderr)
        return 130
    return 1 if report.problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``paropt.py`` / ``python -m gru4rec.tune.study``: parse ``argv`` and :func:`run`."""
    parser = argparse.ArgumentParser(
        prog="paropt.py",
        description="Tune GRU4Rec hyperparameters with Optuna (resumable, parallel, distributed).",
    )
    add_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
