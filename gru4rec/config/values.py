"""The values of the hyperparameters: the known choices, the conversion of one value to its
field's type, and the parameter-string syntax (split into name/value pairs, values formatted).

These are the building blocks of :class:`gru4rec.config.Config`'s validation: each converter
takes a value as a user may give it (typed, or a string from a parameter string or file) and
returns it converted, or raises :class:`BadValue` with a message that does not yet name the
parameter (the caller adds the name, so that one report can list every problem).
"""
from __future__ import annotations

import difflib
import math
import numbers
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADAPTS",
    "GROUPS",
    "Check",
    "FieldSpec",
    "at_least",
    "greater_than",
    "in_range",
    "one_of",
    "suggest",
    "ADAPT_PARAM_DEFAULTS",
    "ADAPT_PARAM_MEANING",
    "BadValue",
    "DEFAULT_FINAL_ACT",
    "LOSSES",
    "PARAM_STRING_SEPARATORS",
    "SOFTMAX_LOSSES",
    "format_value",
    "to_bool",
    "to_embedding",
    "to_float",
    "to_float_tuple",
    "to_int",
    "to_int_tuple",
    "to_name",
    "to_optional_act",
    "to_str",
    "split_param_string",
    "to_tuple",
    "type_name",
]

#: The losses (docs/behaviour.md §5).
LOSSES: tuple[str, ...] = ("cross-entropy", "xe_logit", "bpr-max", "top1-max", "bpr", "top1")
#: The optimisers (docs/behaviour.md §6).
ADAPTS: tuple[str, ...] = ("adagrad", "rmsprop", "adadelta", "adam", "sgd")
#: The final activation a loss gets when ``final_act`` is not given.
DEFAULT_FINAL_ACT: dict[str, str] = {
    "cross-entropy": "softmax",
    "xe_logit": "softmax_logit",
    "bpr-max": "elu-0.5",
    "top1-max": "elu-0.5",
    "bpr": "elu-0.5",
    "top1": "elu-0.5",
}
#: The values each optimiser takes in ``adapt_params`` (their number and defaults).
ADAPT_PARAM_DEFAULTS: dict[str, tuple[float, ...]] = {
    "adagrad": (),
    "rmsprop": (0.9,),  # decay rho
    "adadelta": (0.95,),  # decay rho
    "adam": (0.9, 0.999),  # beta1, beta2
    "sgd": (),
}
#: What those values are, for error messages.
ADAPT_PARAM_MEANING: dict[str, str] = {
    "rmsprop": "its decay rho (default 0.9)",
    "adadelta": "its decay rho (default 0.95)",
    "adam": "beta1/beta2 (default 0.9/0.999)",
}
#: The losses that end in a softmax (the cross-entropy family).
SOFTMAX_LOSSES: tuple[str, ...] = ("cross-entropy", "xe_logit")

#: Characters that cannot appear in a value of a parameter string (they separate its parts).
PARAM_STRING_SEPARATORS: tuple[str, ...] = (",", "=")

_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


def type_name(value: Any) -> str:
    """The name of the value's type, for error messages."""
    return type(value).__name__


class BadValue(Exception):
    """A value that cannot be converted; the message is completed with the parameter name."""


# ------------------------------------------------------------------------------ declarations

#: The groups of hyperparameters: ``network`` (the network's shape and function: a warm start
#: keeps them), ``training`` (how it is trained), ``data`` (the column names of the event files),
#: ``inference`` (used when the model answers, never in training).
GROUPS: tuple[str, ...] = ("network", "training", "data", "inference")

#: A check of one converted value: None when it is fine, else the problem (without the name).
Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class FieldSpec:
    """What a :class:`~gru4rec.config.Config` field declares besides its type and default: its
    group (one of :data:`GROUPS`), the converter of a user's value (raises :class:`BadValue`)
    and the check of the converted value on its own (ranges, choices; None: any value of the
    type). Checks that involve several fields are :meth:`Config`'s combination checks."""

    group: str
    convert: Callable[[Any], Any]
    check: Check | None = None

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"unknown hyperparameter group {self.group!r}; use one of {', '.join(GROUPS)}")


def suggest(name: str, candidates: typing.Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates``, or ``''``."""
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def at_least(low: float, note: str = "") -> Check:
    """The check ``value >= low`` (``note`` is added to the message, e.g. what 0 means)."""
    return lambda value: None if value >= low else f"must be >= {low}{note}, got {value!r}"


def greater_than(low: float) -> Check:
    """The check ``value > low``."""
    return lambda value: None if value > low else f"must be > {low}, got {value!r}"


def in_range(low: float, high: float, *, closed: bool = False, high_text: str | None = None) -> Check:
    """The check ``low <= value < high`` (``closed``: ``<= high``); ``high_text`` writes ``high``
    in the message (e.g. ``2**63``)."""
    interval = f"[{low:g}, {high_text or f'{high:g}'}{']' if closed else ')'}"

    def check(value: Any) -> str | None:
        inside = low <= value <= high if closed else low <= value < high
        return None if inside else f"must be in {interval}, got {value!r}"

    return check


def one_of(choices: typing.Sequence[str], what: str) -> Check:
    """The check ``value in choices``; the message names ``what`` it is (e.g. ``optimiser``),
    the closest choice and all of them."""
    return lambda value: None if value in choices else (
        f"unknown {what} {value!r}{suggest(value, choices)}; use one of {', '.join(choices)}"
    )


def to_int(value: Any) -> int:
    """An integer; also from an integral float or a string such as ``'64'`` or ``'1e7'`` (not a bool)."""
    if isinstance(value, bool):  # bool is an int subclass, but True is no batch size
        raise BadValue(f"expected an integer, got the boolean {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                value = float(text)  # '1e7' is a fine way to write 10,000,000
            except ValueError:
                raise BadValue(f"expected an integer, got {value!r}") from None
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number) and number == int(number):
            return int(number)
        raise BadValue(f"expected an integer, got {value!r}")
    raise BadValue(f"expected an integer, got {value!r} ({type_name(value)})")


def to_float(value: Any) -> float:
    """A finite number; also from a string such as ``'0.05'`` (not a bool)."""
    if isinstance(value, bool):
        raise BadValue(f"expected a number, got the boolean {value!r}")
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise BadValue(f"expected a number, got {value!r}") from None
    elif isinstance(value, numbers.Real):
        number = float(value)
    else:
        raise BadValue(f"expected a number, got {value!r} ({type_name(value)})")
    if not math.isfinite(number):
        raise BadValue(f"must be a finite number, got {value!r}")
    return number


def to_bool(value: Any) -> bool:
    """A boolean from a bool, 0/1, a NumPy bool or ``True/False/true/false/1/0``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    if hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "b":  # numpy.bool_
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise BadValue(f"expected a boolean (True/False/true/false/1/0), got {value!r}")


def to_str(value: Any) -> str:
    """The value itself if it is a string."""
    if isinstance(value, str):
        return value
    raise BadValue(f"expected a string, got {value!r} ({type_name(value)})")


def to_tuple(value: Any, item: typing.Callable[[Any], Any]) -> tuple[Any, ...]:
    """A tuple of ``item(x)`` from a list/tuple, a 1-d array, one number or ``'a/b/c'`` (or ``'[a,b,c]'``)."""
    if isinstance(value, str):
        text = value.strip()
        # Lists are written with '/' in parameter strings; tolerate a bracketed list too.
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1].replace(",", "/")
        parts: list[Any] = [part.strip() for part in text.split("/")] if text else []
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    elif hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:  # a 1-d numpy array
        parts = list(value.tolist())
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        parts = [value]  # layers=100 means one layer of 100, as in the original
    else:
        raise BadValue(f"expected a list (write it as a/b/c in a parameter string), got {value!r}")
    converted = []
    for position, part in enumerate(parts):
        try:
            converted.append(item(part))
        except BadValue as bad:
            raise BadValue(f"item {position} of {value!r}: {bad}") from None
    return tuple(converted)


def to_int_tuple(value: Any) -> tuple[int, ...]:
    """A tuple of integers (see :func:`to_tuple`), e.g. the layer sizes."""
    return to_tuple(value, to_int)


def to_float_tuple(value: Any) -> tuple[float, ...]:
    """A tuple of numbers (see :func:`to_tuple`), e.g. the optimiser constants."""
    return to_tuple(value, to_float)


def to_optional_act(value: Any) -> str | None:
    """An activation string, lower-cased; None (or ``''``/``'none'``) stays None, to be derived."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    return to_str(value).strip().lower()


def to_name(value: Any) -> str:
    """A name (loss, optimiser, activation) stripped and lower-cased."""
    return to_str(value).strip().lower()


def to_embedding(value: Any) -> int | str:
    """An embedding width (integer) or ``'layersize'``."""
    if isinstance(value, str) and value.strip().lower() == "layersize":
        return "layersize"
    try:
        return to_int(value)
    except BadValue:
        raise BadValue(f"expected an integer or 'layersize', got {value!r}") from None


def format_value(value: Any) -> str:
    """One value in parameter-string syntax (lists with '/', floats read back exactly)."""
    if isinstance(value, tuple):
        return "/".join(format_value(v) for v in value)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def split_param_string(text: str) -> tuple[dict[str, str], list[str]]:
    """``'name=value,name=value'`` as a name→value mapping (values still strings) and the
    problems found (a part without ``=``, a name given twice); empty parts are skipped."""
    pairs: dict[str, str] = {}
    problems: list[str] = []
    for part in text.split(","):
        if not part.strip():
            continue  # tolerate 'a=1,,b=2' and a trailing comma
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            problems.append(f"{part.strip()!r}: expected name=value")
        elif name in pairs:
            problems.append(f"{name}: given more than once")
        else:
            pairs[name] = value.strip()
    return pairs, problems
