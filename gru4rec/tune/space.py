"""Search spaces: one :class:`ParamSpec` per searched hyperparameter, read from the original's
JSON-lines paramspace files, checked against the fixed parameters, and written back as
parameter strings.

One parameter per line::

    {"name": "layers", "dtype": "int", "values": [64, 512], "step": 32}
    {"name": "learning_rate", "dtype": "float", "values": [0.01, 0.25], "step": 0.005}
    {"name": "final_act", "dtype": "categorical", "values": ["elu-0.5", "elu-1", "linear"]}

``dtype`` ``int``/``float`` takes ``values: [low, high]`` (both ends included) with an optional
``step`` or ``log``; ``categorical`` takes the list of choices. As in the original, an ``int``
``layers`` searches the size of a single layer.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

    from gru4rec.config import Config

__all__ = [
    "DTYPES",
    "ParamSpec",
    "parse_paramspace",
    "load_paramspace",
    "check_paramspace",
    "trial_param_string",
    "join_params",
    "fixed_names",
    "canonical_name",
    "raise_problems",
]

DTYPES = ("int", "float", "categorical")
# A categorical string choice is written into a parameter string as is: it must not contain these.
_PARAM_STRING_SEPARATORS = (",", "=")

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

    def suggest(self, trial: optuna.trial.BaseTrial) -> Any:
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
        raise_problems(f"paramspace {source}", problems)
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


def raise_problems(where: str, problems: list[str]) -> None:
    """Raise one :class:`~gru4rec.errors.ConfigError` for the ``problems`` found in ``where``
    (one on a line, several as a list)."""
    if len(problems) == 1:
        raise ConfigError(f"invalid {where}: {problems[0]}")
    raise ConfigError(f"{len(problems)} problems in {where}:\n" + "\n".join(f"  - {p}" for p in problems))


def fixed_names(fixed: str) -> list[str]:
    """Parameter names of a ``-fp`` string, in order (the values are parsed by Config)."""
    return [part.partition("=")[0].strip() for part in fixed.split(",") if part.strip()]


def check_paramspace(space: Sequence[ParamSpec], base: Config, fixed: str = "") -> None:
    """Check the space against the configuration it modifies, before any trial runs.

    Every searched name must be a hyperparameter, must not also be fixed, and every end of a
    range and every choice must be a valid value on top of ``base`` (the fixed parameters), so
    that a typo fails now with a clear error instead of failing all trials.
    Invalid *combinations* of several searched values are left to the trials (they FAIL).
    """
    problems: list[str] = []
    fixed_set = {canonical_name(n) for n in fixed_names(fixed)}
    for spec in space:
        where = f"line {spec.line}: {spec.name}" if spec.line else spec.name
        if canonical_name(spec.name) in fixed_set:
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
        raise_problems("search space", problems)


def canonical_name(name: str) -> str:
    """The hyperparameter ``name`` stands for (aliases resolved)."""
    # elu_param is the official ports' alias of final_act.
    return "final_act" if name == "elu_param" else name


def trial_param_string(space: Sequence[ParamSpec], params: dict[str, Any]) -> str:
    """The searched values of a trial as ``name=value,...`` in the order of the space."""
    return ",".join(f"{s.name}={s.format(params[s.name])}" for s in space if s.name in params)


def join_params(*parts: str) -> str:
    """Join parameter strings with ``,`` (empty parts and stray commas dropped)."""
    return ",".join(p.strip(",") for p in parts if p and p.strip(","))

