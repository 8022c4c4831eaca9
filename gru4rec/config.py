"""Every GRU4Rec hyperparameter (docs/behaviour.md §7) in one validated, immutable dataclass.

:class:`Config` is the single source of truth for hyperparameters: the model, the training loop,
the command lines and the model files all read it. It can be built

* directly: ``Config(loss="bpr-max", layers=(512,), learning_rate=0.05)``;
* from a parameter string, the original's ``-ps`` syntax:
  ``Config.from_string("loss=bpr-max,layers=200/200,final_act=elu-1")``;
* from a mapping whose values are typed or strings: ``Config.from_dict({...})``;
* from a parameter file: ``Config.from_file("paramfiles/coveo_bprmax_shared_512_best.py")``
  (the original's ``.py`` files are read, never executed; JSON, TOML and YAML hold the same
  mapping: see :mod:`gru4rec.param_files`).

Whatever the route, every value is converted to its field's type and the whole configuration is
checked at once; :class:`~gru4rec.errors.ConfigError` lists every problem, each naming its
parameter. Two values are derived when construction resolves them:

* ``final_act=None`` becomes the loss's usual final activation (``softmax`` for cross-entropy,
  ``softmax_logit`` for xe_logit, ``elu-0.5`` for bpr-max, top1-max, bpr and top1);
* ``embedding='layersize'`` becomes ``layers[0]``.

:meth:`Config.replace` re-derives them when their inputs change (e.g. replacing ``loss`` in a
config whose ``final_act`` was derived picks the new loss's default).

Input aliases (``from_string``, ``from_dict``, ``from_file``, ``replace``): ``elu_param=x``, the
official ports' spelling for bpr-max, means ``final_act='elu-x'`` (``elu_param=0`` means
``final_act='linear'``). As in the ports, it is ignored when the loss is ``cross-entropy`` or
``xe_logit`` (their published param files carry ``('elu_param', 0)`` next to cross-entropy). Giving
both ``elu_param`` and ``final_act`` with another loss is an error.
"""
from __future__ import annotations

import difflib
import os
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from gru4rec.activations import ELEMENTWISE_ACTIVATIONS, Activation, parse_activation
from gru4rec.config_values import (
    ADAPT_PARAM_DEFAULTS,
    ADAPT_PARAM_MEANING,
    ADAPTS,
    DEFAULT_FINAL_ACT,
    LOSSES,
    PARAM_STRING_SEPARATORS,
    SOFTMAX_LOSSES,
    BadValue,
    format_value,
    split_param_string,
    to_bool,
    to_embedding,
    to_float,
    to_float_tuple,
    to_int,
    to_int_tuple,
    to_name,
    to_optional_act,
    to_str,
    type_name,
)
from gru4rec.errors import ConfigError
from gru4rec.param_files import read_param_file

__all__ = ["Config", "LOSSES", "ADAPTS", "DEFAULT_FINAL_ACT"]

_ALIASES: dict[str, str] = {"elu_param": "final_act"}


def _suggest(name: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _raise(problems: list[str], source: str | None = None) -> typing.NoReturn:
    """Raise one ConfigError listing every problem; ``problems`` is kept on the exception."""
    where = f" in {source}" if source else ""
    if len(problems) == 1:
        message = f"invalid GRU4Rec parameter{where}: {problems[0]}"
    else:
        listing = "\n".join(f"  - {p}" for p in problems)
        message = f"{len(problems)} invalid GRU4Rec parameters{where}:\n{listing}"
    error = ConfigError(message)
    error.problems = list(problems)  # type: ignore[attr-defined]  # for callers that merge reports
    raise error


def _problems_of(error: ConfigError) -> list[str]:
    return list(getattr(error, "problems", [str(error)]))


@dataclass(frozen=True, kw_only=True)
class Config:
    """GRU4Rec hyperparameters (docs/behaviour.md §7), validated on construction; immutable.

    After construction ``final_act`` is always a normalised activation string and ``embedding``
    an int (see the module docstring for how they are derived). Construction with a bad value
    raises :class:`~gru4rec.errors.ConfigError` listing every problem. Values are converted to
    the field's type (strings such as ``'0.05'`` or ``'200/200'`` are accepted, so are lists for
    the tuple fields).
    """

    loss: str = "cross-entropy"
    """``cross-entropy``, ``xe_logit``, ``bpr-max``, ``top1-max``, ``bpr`` or ``top1`` (docs/behaviour.md §5)."""
    final_act: str | None = None
    """Activation of the scores before the loss; ``None`` derives it from the loss (docs/behaviour.md §2)."""
    hidden_act: str = "tanh"
    """Candidate activation of the GRU cell (elementwise activations only)."""
    layers: tuple[int, ...] = (100,)
    """Sizes of the GRU layers."""
    n_epochs: int = 10
    batch_size: int = 64
    dropout_p_embed: float = 0.0
    dropout_p_hidden: float = 0.0
    learning_rate: float = 0.05
    momentum: float = 0.0
    lmbd: float = 0.0
    """L2 regularisation applied in the update (docs/behaviour.md §6)."""
    embedding: int | str = 0
    """Width of a separate input embedding (0: none; ``'layersize'``: ``layers[0]``)."""
    constrained_embedding: bool = True
    """Share the output item matrix as the input embedding (``embedding`` is then ignored)."""
    n_sample: int = 2048
    """Extra negative samples shared by the mini-batch (docs/behaviour.md §4)."""
    sample_alpha: float = 0.5
    """Sampling probability ∝ support^alpha (1: popularity, 0: uniform)."""
    sample_store_size: int = 10_000_000
    """Number of pre-drawn sample ids (0: draw every step)."""
    smoothing: float = 0.0
    """Label smoothing of the cross-entropy losses."""
    adapt: str = "adagrad"
    """``adagrad``, ``rmsprop``, ``adadelta``, ``adam`` or ``sgd`` (docs/behaviour.md §6)."""
    adapt_params: tuple[float, ...] = ()
    """Optimiser constants (empty: defaults, see :attr:`resolved_adapt_params`)."""
    grad_cap: float = 0.0
    """Clip the global gradient norm to this value (0: no clipping)."""
    bpreg: float = 1.0
    """Score regularisation of bpr-max."""
    logq: float = 0.0
    """Weight of the logQ correction (docs/behaviour.md §4); 1.0 is advised with cross-entropy."""
    sigma: float = 0.0
    """Fixed initialisation scale (0: per-block Glorot scale)."""
    init_as_normal: bool = False
    train_random_order: bool = False
    time_sort: bool = True
    seed: int = 42
    repeat_weight: float = 0.0
    """Repeat-aware scoring: boost of the items already in the session, in units of the row's
    score spread (0: off, faithful GRU4Rec; :mod:`gru4rec.inference.repeat`). Used at inference
    only (recommendations, evaluation, serving), never in training."""
    repeat_decay: float = 1.0
    """Repeat-aware scoring: weight of an earlier click relative to the next one (1: counts only)."""
    session_key: str = "SessionId"
    item_key: str = "ItemId"
    time_key: str = "Time"

    # Converter per field; keys are the field names (checked at import by _check_converters).
    _CONVERTERS: ClassVar[dict[str, typing.Callable[[Any], Any]]] = {
        "loss": to_name,
        "final_act": to_optional_act,
        "hidden_act": to_name,
        "layers": to_int_tuple,
        "n_epochs": to_int,
        "batch_size": to_int,
        "dropout_p_embed": to_float,
        "dropout_p_hidden": to_float,
        "learning_rate": to_float,
        "momentum": to_float,
        "lmbd": to_float,
        "embedding": to_embedding,
        "constrained_embedding": to_bool,
        "n_sample": to_int,
        "sample_alpha": to_float,
        "sample_store_size": to_int,
        "smoothing": to_float,
        "adapt": to_name,
        "adapt_params": to_float_tuple,
        "grad_cap": to_float,
        "bpreg": to_float,
        "logq": to_float,
        "sigma": to_float,
        "init_as_normal": to_bool,
        "train_random_order": to_bool,
        "time_sort": to_bool,
        "seed": to_int,
        "repeat_weight": to_float,
        "repeat_decay": to_float,
        "session_key": to_str,
        "item_key": to_str,
        "time_key": to_str,
    }

    # ------------------------------------------------------------------ construction & checks

    def __post_init__(self) -> None:
        problems: list[str] = []
        values: dict[str, Any] = {}
        for name, convert in self._CONVERTERS.items():
            raw = getattr(self, name)
            try:
                values[name] = convert(raw)
            except BadValue as bad:
                problems.append(f"{name}: {bad}")
        # Remember which values were derived so that replace() can derive them again.
        derived: set[str] = set()
        if "final_act" in values and values["final_act"] is None:
            derived.add("final_act")
            if values.get("loss") in DEFAULT_FINAL_ACT:
                values["final_act"] = DEFAULT_FINAL_ACT[values["loss"]]
        if values.get("embedding") == "layersize":
            derived.add("embedding")
            layers = values.get("layers")
            values["embedding"] = layers[0] if layers else 0
        problems.extend(self._check(values))
        if problems:
            _raise(problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_derived", frozenset(derived))

    @staticmethod
    def _check(v: dict[str, Any]) -> list[str]:
        """Ranges and combinations of the values that converted; one message per problem."""
        problems: list[str] = []

        def at_least(name: str, low: float, note: str = "") -> None:
            if name in v and v[name] < low:
                problems.append(f"{name}: must be >= {low}{note}, got {v[name]!r}")

        def fraction(name: str, what: str = "") -> None:
            if name in v and not 0.0 <= v[name] < 1.0:
                problems.append(f"{name}: must be in [0, 1){what}, got {v[name]!r}")

        loss = v.get("loss")
        if loss is not None and loss not in LOSSES:
            problems.append(f"loss: unknown loss {loss!r}{_suggest(loss, LOSSES)}; use one of {', '.join(LOSSES)}")
            loss = None

        final: Activation | None = None
        if v.get("final_act") is not None:
            try:
                final = parse_activation(v["final_act"])
                v["final_act"] = final.spec
            except ValueError as exc:
                problems.append(f"final_act: {exc}")
        if final is not None and loss is not None:
            if loss == "cross-entropy" and final.name != "softmax":
                problems.append(
                    f"final_act: loss 'cross-entropy' needs final_act 'softmax', got {final.spec!r} "
                    "(use loss 'bpr-max' for elementwise final activations)"
                )
            elif loss == "xe_logit" and final.name != "softmax_logit":
                problems.append(f"final_act: loss 'xe_logit' needs final_act 'softmax_logit', got {final.spec!r}")
            elif loss not in SOFTMAX_LOSSES and not final.elementwise:
                problems.append(
                    f"final_act: loss {loss!r} needs an elementwise final_act such as 'elu-0.5' or "
                    f"'linear', got {final.spec!r} (softmax goes with loss 'cross-entropy')"
                )

        if "hidden_act" in v:
            try:
                hidden = parse_activation(v["hidden_act"])
            except ValueError as exc:
                problems.append(f"hidden_act: {exc}")
            else:
                if hidden.name not in ELEMENTWISE_ACTIVATIONS:
                    allowed = ", ".join(sorted(ELEMENTWISE_ACTIVATIONS))
                    problems.append(f"hidden_act: must be an elementwise activation ({allowed}), got {hidden.spec!r}")
                v["hidden_act"] = hidden.spec

        if "layers" in v:
            layers = v["layers"]
            if not layers:
                problems.append("layers: needs at least one layer, e.g. layers=100")
            elif any(size < 1 for size in layers):
                problems.append(f"layers: every layer size must be >= 1, got {list(layers)}")

        at_least("n_epochs", 1)
        at_least("batch_size", 1)
        fraction("dropout_p_embed")
        fraction("dropout_p_hidden")
        if "learning_rate" in v and not v["learning_rate"] > 0:
            problems.append(f"learning_rate: must be > 0, got {v['learning_rate']!r}")
        fraction("momentum")
        at_least("lmbd", 0.0)
        if isinstance(v.get("embedding"), int):
            at_least("embedding", 0, " (0: no separate embedding)")
        at_least("n_sample", 0)
        at_least("sample_alpha", 0.0)
        at_least("sample_store_size", 0, " (0: draw the samples every step)")
        fraction("smoothing")
        if v.get("smoothing", 0.0) > 0.0 and loss is not None and loss not in SOFTMAX_LOSSES:
            problems.append(f"smoothing: label smoothing applies to the cross-entropy losses only, not to loss {loss!r}")
        at_least("grad_cap", 0.0, " (0: no clipping)")
        at_least("bpreg", 0.0)
        at_least("logq", 0.0)
        at_least("sigma", 0.0, " (0: Glorot scale per block)")
        at_least("repeat_weight", 0.0, " (0: no repeat boost)")
        if "repeat_decay" in v and not 0.0 <= v["repeat_decay"] <= 1.0:
            problems.append(f"repeat_decay: must be in [0, 1], got {v['repeat_decay']!r}")
        if "seed" in v and not 0 <= v["seed"] < 2**63:
            problems.append(f"seed: must be in [0, 2**63), got {v['seed']!r}")

        adapt = v.get("adapt")
        if adapt is not None and adapt not in ADAPTS:
            problems.append(f"adapt: unknown optimiser {adapt!r}{_suggest(adapt, ADAPTS)}; use one of {', '.join(ADAPTS)}")
        elif adapt is not None and "adapt_params" in v:
            given = v["adapt_params"]
            expected = len(ADAPT_PARAM_DEFAULTS[adapt])
            if given and len(given) != expected:
                if expected == 0:
                    problems.append(f"adapt_params: adapt {adapt!r} takes no parameters, got {list(given)}")
                else:
                    problems.append(
                        f"adapt_params: adapt {adapt!r} takes {expected} value(s), "
                        f"{ADAPT_PARAM_MEANING[adapt]}, got {list(given)}"
                    )
            elif given and not all(0.0 <= p < 1.0 for p in given):
                problems.append(f"adapt_params: the decay rates of adapt {adapt!r} must be in [0, 1), got {list(given)}")

        keys = [k for k in ("session_key", "item_key", "time_key") if k in v]
        for key in keys:
            if not v[key]:
                problems.append(f"{key}: must be a non-empty column name")
        named = [k for k in keys if v[k]]
        for i, first in enumerate(named):
            for second in named[i + 1:]:
                if v[first] == v[second]:
                    problems.append(f"{second}: must differ from {first} (both are {v[first]!r})")
        return problems

    # ------------------------------------------------------------------ alternative constructors

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of every hyperparameter, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The declared default of every hyperparameter (``final_act`` None, before derivation)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    @classmethod
    def _expand(cls, params: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Map aliases to fields and report unknown or duplicated names; values untouched."""
        known = cls.field_names()
        try:
            loss = to_name(params.get("loss", cls.loss))
        except BadValue:
            loss = None  # reported by the constructor
        out: dict[str, Any] = {}
        problems: list[str] = []
        for key, value in params.items():
            if not isinstance(key, str):
                problems.append(f"{key!r}: parameter names must be strings")
                continue
            name = key.strip()
            if name == "elu_param":
                if loss in SOFTMAX_LOSSES:
                    continue  # as in the official ports: elu_param only shapes the non-softmax losses
                if "final_act" in params or "final_act" in out:
                    problems.append("elu_param: give either elu_param or final_act, not both")
                    continue
                try:
                    alpha = to_float(value)
                except BadValue as bad:
                    problems.append(f"elu_param: {bad}")
                    continue
                out["final_act"] = "linear" if alpha == 0 else f"elu-{alpha!r}"
                continue
            if name not in known:
                problems.append(f"{name}: unknown parameter{_suggest(name, [*known, *_ALIASES])}")
                continue
            if name in out:
                problems.append(f"{name}: given more than once")
                continue
            out[name] = value
        return out, problems

    @classmethod
    def _build(cls, params: Mapping[str, Any], *, extra: list[str] | None = None, source: str | None = None) -> Config:
        """Construct from a name→value mapping, reporting every problem (including ``extra``)."""
        values, problems = cls._expand(params)
        problems = [*(extra or []), *problems]
        try:
            config = cls(**values)
        except ConfigError as error:
            _raise(problems + _problems_of(error), source)
        if problems:
            _raise(problems, source)
        return config

    @classmethod
    def from_dict(cls, params: Mapping[str, Any], *, source: str | None = None) -> Config:
        """Build from a mapping of parameter names to typed values or strings (aliases allowed).

        ``source`` (e.g. a file name) is named in the error message.
        """
        if not isinstance(params, Mapping):
            _raise([f"expected a mapping of parameter names to values, got {type_name(params)}"], source)
        return cls._build(params, source=source)

    @classmethod
    def from_string(cls, text: str) -> Config:
        """Parse ``'name=value,name=value'`` (the original's ``-ps``); ``''`` gives the defaults.

        Lists use ``/`` (``layers=200/200``, ``adapt_params=0.9/0.999``), booleans
        ``True/False/true/false/1/0``, ``embedding=layersize`` and ``elu_param=x`` are accepted.
        """
        if not isinstance(text, str):
            _raise([f"a parameter string must be a str, got {type_name(text)}"])
        pairs, problems = split_param_string(text)
        return cls._build(pairs, extra=problems)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Config:
        """Read a parameter file: the original's ``.py`` format (read, never executed), ``.json``,
        ``.toml`` or ``.yaml``/``.yml``. Errors name the file."""
        params = read_param_file(path)
        return cls.from_dict(params, source=f"param file '{path}'")

    # ------------------------------------------------------------------ derived views & updates

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied and validated (aliases such as ``elu_param`` allowed).

        Values that were derived (``final_act`` from the loss, ``embedding='layersize'``) are
        derived again from the new values unless they are part of ``changes``.
        """
        return self._build(self._with_changes(changes))

    def replace_from_string(self, text: str) -> Config:
        """A copy with the parameter string ``text`` applied on top (e.g. ``-ps`` over ``-pf``)."""
        if not isinstance(text, str):
            _raise([f"a parameter string must be a str, got {type_name(text)}"])
        pairs, problems = split_param_string(text)
        return self._build(self._with_changes(pairs), extra=problems)

    def _with_changes(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        base: dict[str, Any] = {name: getattr(self, name) for name in self.field_names()}
        derived: frozenset[str] = getattr(self, "_derived", frozenset())
        if "final_act" in derived:
            base["final_act"] = None
        if "embedding" in derived:
            base["embedding"] = "layersize"
        if "elu_param" in changes:  # the alias replaces final_act; do not report a clash with the base
            base.pop("final_act")
        merged: dict[str, Any] = dict(base)
        for key, value in changes.items():
            merged[key.strip() if isinstance(key, str) else key] = value
        return merged

    @property
    def resolved_adapt_params(self) -> tuple[float, ...]:
        """``adapt_params`` with the optimiser's defaults filled in (rmsprop ρ=0.9, adadelta
        ρ=0.95, adam β=0.9/0.999; empty for adagrad and sgd)."""
        return self.adapt_params or ADAPT_PARAM_DEFAULTS[self.adapt]

    @property
    def final_activation(self) -> Activation:
        """``final_act`` parsed."""
        assert self.final_act is not None  # derived in __post_init__
        return parse_activation(self.final_act)

    @property
    def hidden_activation(self) -> Activation:
        """``hidden_act`` parsed."""
        return parse_activation(self.hidden_act)

    @property
    def embedding_mode(self) -> str:
        """``'shared'`` (constrained), ``'separate'`` (embedding > 0) or ``'none'`` (one-hot); see docs/behaviour.md §2."""
        if self.constrained_embedding:
            return "shared"
        return "separate" if int(self.embedding) > 0 else "none"

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """Every hyperparameter as JSON-safe values (tuples become lists); ``from_dict`` reads it."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in ((n, getattr(self, n)) for n in self.field_names())
        }

    def to_param_string(self, *, only_changed: bool = False) -> str:
        """``name=value,...`` that :meth:`from_string` reads back to an equal config.

        ``only_changed=True`` leaves out values equal to the defaults (for logs and file names).
        """
        defaults = type(self)() if only_changed else None
        parts = []
        for name in self.field_names():
            value = getattr(self, name)
            if defaults is not None and getattr(defaults, name) == value:
                continue
            text = format_value(value)
            if any(sep in text for sep in PARAM_STRING_SEPARATORS) or text != text.strip():
                _raise([f"{name}: the value {value!r} cannot be written in a parameter string "
                        "(it contains ',' or '=' or surrounding blanks); use to_dict() instead"])
            parts.append(f"{name}={text}")
        return ",".join(parts)


def _check_converters() -> None:
    # Internal invariant: every field has exactly one converter.
    assert set(Config._CONVERTERS) == set(Config.field_names()), "Config._CONVERTERS out of sync with the fields"


_check_converters()
