"""Every GRU4Rec hyperparameter (docs/behaviour.md §7) in one validated, immutable dataclass.

:class:`Config` is the single source of truth for hyperparameters: the model, the training loop,
the command lines and the model files all read it. It can be built

* directly: ``Config(loss="bpr-max", layers=(512,), learning_rate=0.05)``;
* from a parameter string, the original's ``-ps`` syntax:
  ``Config.from_string("loss=bpr-max,layers=200/200,final_act=elu-1")``;
* from a mapping whose values are typed or strings: ``Config.from_dict({...})``;
* from a parameter file: ``Config.from_file("paramfiles/coveo_bprmax_shared_512_best.py")``
  (the original's ``.py`` files are read, never executed; JSON, TOML and YAML hold the same
  mapping: see :mod:`gru4rec.config.param_files`).

Each field is declared once, with :func:`_hyper`: its default, its group (``network``,
``training``, ``data`` or ``inference``: :data:`~gru4rec.config.values.GROUPS`), its converter and
its own check (a range or the allowed choices). :data:`SPECS`, :data:`NETWORK_FIELDS`,
:data:`INFERENCE_FIELDS` and :data:`DATA_FIELDS` are read from those declarations; the checks of
combinations of fields (a loss and its final activation, an optimiser and its constants, distinct
column names) are one function, :func:`_combination_problems`.

Whatever the route, every value is converted to its field's type and the whole configuration is
checked at once; :class:`~gru4rec.errors.ConfigError` lists every problem, each naming its
parameter. A config remembers which fields were given (:attr:`Config.given`) rather than left at
their defaults, so that a warm start can take the others from the model it continues. Two values
are derived when construction resolves them:

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

import os
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any

from gru4rec.config.activations import ELEMENTWISE_ACTIVATIONS, Activation, parse_activation
from gru4rec.config.param_files import read_param_file
from gru4rec.config.values import (
    ADAPT_PARAM_DEFAULTS,
    ADAPT_PARAM_MEANING,
    ADAPTS,
    DEFAULT_FINAL_ACT,
    GROUPS,
    LOSSES,
    PARAM_STRING_SEPARATORS,
    SOFTMAX_LOSSES,
    BadValue,
    FieldSpec,
    at_least,
    format_value,
    greater_than,
    in_range,
    one_of,
    split_param_string,
    suggest,
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

__all__ = ["Config", "LOSSES", "ADAPTS", "DEFAULT_FINAL_ACT", "GROUPS", "DATA_FIELDS", "INFERENCE_FIELDS", "NETWORK_FIELDS", "SPECS"]

_ALIASES: dict[str, str] = {"elu_param": "final_act"}
_SPEC = "gru4rec"  # the key of a field's FieldSpec in its metadata
NETWORK, TRAINING, DATA, INFERENCE = GROUPS


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


# ------------------------------------------------------------------ what a field declares


def _hyper(default: Any, group: str, convert: typing.Callable[[Any], Any], check: typing.Callable[[Any], str | None] | None = None) -> Any:
    """A hyperparameter: its default, its group, its converter and its own check (see
    :class:`~gru4rec.config.values.FieldSpec`); the one place each of them is written."""
    return field(default=default, metadata={_SPEC: FieldSpec(group, convert, check)})


def _to_activation(value: Any) -> str:
    """An activation string in its normalised form (``' ELU-1.0'`` -> ``'elu-1'``)."""
    try:
        return parse_activation(to_name(value)).spec
    except ValueError as exc:
        raise BadValue(str(exc)) from None


def _to_optional_activation(value: Any) -> str | None:
    """:func:`_to_activation`, or None (also from ``''``/``'none'``): derived from the loss."""
    text = to_optional_act(value)
    return None if text is None else _to_activation(text)


def _elementwise(spec: str) -> str | None:
    if parse_activation(spec).name in ELEMENTWISE_ACTIVATIONS:
        return None
    return f"must be an elementwise activation ({', '.join(sorted(ELEMENTWISE_ACTIVATIONS))}), got {spec!r}"


def _layer_sizes(layers: tuple[int, ...]) -> str | None:
    if not layers:
        return "needs at least one layer, e.g. layers=100"
    if any(size < 1 for size in layers):
        return f"every layer size must be >= 1, got {list(layers)}"
    return None


def _column_name(name: str) -> str | None:
    return None if name else "must be a non-empty column name"


_FRACTION = in_range(0.0, 1.0)


@dataclass(frozen=True, kw_only=True)
class Config:
    """GRU4Rec hyperparameters (docs/behaviour.md §7), validated on construction; immutable.

    After construction ``final_act`` is always a normalised activation string and ``embedding``
    an int (see the module docstring for how they are derived). Construction with a bad value
    raises :class:`~gru4rec.errors.ConfigError` listing every problem. Values are converted to
    the field's type (strings such as ``'0.05'`` or ``'200/200'`` are accepted, so are lists for
    the tuple fields).
    """

    loss: str = _hyper("cross-entropy", TRAINING, to_name, one_of(LOSSES, "loss"))
    """``cross-entropy``, ``xe_logit``, ``bpr-max``, ``top1-max``, ``bpr`` or ``top1`` (docs/behaviour.md §5)."""
    final_act: str | None = _hyper(None, TRAINING, _to_optional_activation)
    """Activation of the scores before the loss; ``None`` derives it from the loss (docs/behaviour.md §2)."""
    hidden_act: str = _hyper("tanh", NETWORK, _to_activation, _elementwise)
    """Candidate activation of the GRU cell (elementwise activations only)."""
    layers: tuple[int, ...] = _hyper((100,), NETWORK, to_int_tuple, _layer_sizes)
    """Sizes of the GRU layers."""
    n_epochs: int = _hyper(10, TRAINING, to_int, at_least(1))
    batch_size: int = _hyper(64, TRAINING, to_int, at_least(1))
    dropout_p_embed: float = _hyper(0.0, TRAINING, to_float, _FRACTION)
    dropout_p_hidden: float = _hyper(0.0, TRAINING, to_float, _FRACTION)
    dropout_p_id: float = _hyper(0.0, TRAINING, to_float, _FRACTION)
    """With item attributes: the probability that a training step scores an item from its
    attributes alone (its id row and id bias dropped), as a cold item is scored; no effect
    without attributes (docs/attributes.md)."""
    learning_rate: float = _hyper(0.05, TRAINING, to_float, greater_than(0))
    momentum: float = _hyper(0.0, TRAINING, to_float, _FRACTION)
    lmbd: float = _hyper(0.0, TRAINING, to_float, at_least(0.0))
    """L2 regularisation applied in the update (docs/behaviour.md §6)."""
    embedding: int | str = _hyper(0, NETWORK, to_embedding, at_least(0, " (0: no separate embedding)"))
    """Width of a separate input embedding (0: none; ``'layersize'``: ``layers[0]``)."""
    constrained_embedding: bool = _hyper(True, NETWORK, to_bool)
    """Share the output item matrix as the input embedding (``embedding`` is then ignored)."""
    click_context: bool = _hyper(False, NETWORK, to_bool)
    """Feed layer 0 each input click's context (hour of day, day of week, log gap to the session's
    previous click: :mod:`gru4rec.items.context`) through a dense 5×3L₀ projection ``Wc``
    (docs/attributes.md, "Click context"); off: the plain network, bit for bit."""
    n_sample: int = _hyper(2048, TRAINING, to_int, at_least(0))
    """Extra negative samples shared by the mini-batch (docs/behaviour.md §4)."""
    sample_alpha: float = _hyper(0.5, TRAINING, to_float, at_least(0.0))
    """Sampling probability ∝ support^alpha (1: popularity, 0: uniform)."""
    sample_store_size: int = _hyper(10_000_000, TRAINING, to_int, at_least(0, " (0: draw the samples every step)"))
    """Number of pre-drawn sample ids (0: draw every step)."""
    smoothing: float = _hyper(0.0, TRAINING, to_float, _FRACTION)
    """Label smoothing of the cross-entropy losses."""
    adapt: str = _hyper("adagrad", TRAINING, to_name, one_of(ADAPTS, "optimiser"))
    """``adagrad``, ``rmsprop``, ``adadelta``, ``adam`` or ``sgd`` (docs/behaviour.md §6)."""
    adapt_params: tuple[float, ...] = _hyper((), TRAINING, to_float_tuple)
    """Optimiser constants (empty: defaults, see :attr:`resolved_adapt_params`)."""
    grad_cap: float = _hyper(0.0, TRAINING, to_float, at_least(0.0, " (0: no clipping)"))
    """Clip the global gradient norm to this value (0: no clipping)."""
    bpreg: float = _hyper(1.0, TRAINING, to_float, at_least(0.0))
    """Score regularisation of bpr-max."""
    logq: float = _hyper(0.0, TRAINING, to_float, at_least(0.0))
    """Weight of the logQ correction (docs/behaviour.md §4); 1.0 is advised with cross-entropy."""
    sigma: float = _hyper(0.0, TRAINING, to_float, at_least(0.0, " (0: Glorot scale per block)"))
    """Fixed initialisation scale (0: per-block Glorot scale)."""
    init_as_normal: bool = _hyper(False, TRAINING, to_bool)
    train_random_order: bool = _hyper(False, TRAINING, to_bool)
    time_sort: bool = _hyper(True, TRAINING, to_bool)
    seed: int = _hyper(42, TRAINING, to_int, in_range(0, 2**63, high_text="2**63"))
    repeat_weight: float = _hyper(0.0, INFERENCE, to_float, at_least(0.0, " (0: no repeat boost)"))
    """Repeat-aware scoring: boost of the items already in the session, in units of the row's
    score spread (0: off, faithful GRU4Rec; :mod:`gru4rec.inference.repeat`). Used at inference
    only (recommendations, evaluation, serving), never in training."""
    repeat_decay: float = _hyper(1.0, INFERENCE, to_float, in_range(0.0, 1.0, closed=True))
    """Repeat-aware scoring: weight of an earlier click relative to the next one (1: counts only)."""
    session_key: str = _hyper("SessionId", DATA, to_str, _column_name)
    item_key: str = _hyper("ItemId", DATA, to_str, _column_name)
    time_key: str = _hyper("Time", DATA, to_str, _column_name)

    # ------------------------------------------------------------------ construction & checks

    def __new__(cls, **values: Any) -> Config:
        # Which fields the caller gave (not left at their defaults): a warm start takes the
        # others from the model it starts from. Recorded here because __init__ cannot tell a
        # default from an equal value given explicitly.
        self = super().__new__(cls)
        object.__setattr__(self, "_given", frozenset(values))
        return self

    def __post_init__(self) -> None:
        problems: list[str] = []
        values: dict[str, Any] = {}
        for name, spec in _SPECS.items():
            try:
                values[name] = spec.convert(getattr(self, name))
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
        fine: dict[str, Any] = {}  # the values that passed their own check: the combinations use these
        for name, value in values.items():
            check = _SPECS[name].check
            problem = None if check is None or value is None else check(value)
            if problem is None:
                fine[name] = value
            else:
                problems.append(f"{name}: {problem}")
        problems.extend(_combination_problems(fine))
        if problems:
            _raise(problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_derived", frozenset(derived))

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
                problems.append(f"{name}: unknown parameter{suggest(name, [*known, *_ALIASES])}")
                continue
            if name in out:
                problems.append(f"{name}: given more than once")
                continue
            out[name] = value
        return out, problems

    @classmethod
    def _build(
        cls, params: Mapping[str, Any], *, extra: list[str] | None = None, source: str | None = None,
        given: typing.AbstractSet[str] | None = None,
    ) -> Config:
        """Construct from a name→value mapping, reporting every problem (including ``extra``).
        ``given``: the fields to record as given (default: those in ``params``)."""
        values, problems = cls._expand(params)
        problems = [*(extra or []), *problems]
        try:
            config = cls(**values)
        except ConfigError as error:
            _raise(problems + _problems_of(error), source)
        if problems:
            _raise(problems, source)
        if given is not None:
            object.__setattr__(config, "_given", frozenset(given))
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
        return self._build(self._with_changes(changes), given=self._given_with(changes))

    def replace_from_string(self, text: str) -> Config:
        """A copy with the parameter string ``text`` applied on top (e.g. ``-ps`` over ``-pf``)."""
        if not isinstance(text, str):
            _raise([f"a parameter string must be a str, got {type_name(text)}"])
        pairs, problems = split_param_string(text)
        return self._build(self._with_changes(pairs), extra=problems, given=self._given_with(pairs))

    @property
    def given(self) -> frozenset[str]:
        """The fields that were given rather than left at their defaults: the arguments of
        ``Config(...)``, the names in a parameter string, file or mapping, and those of every
        :meth:`replace` since (``elu_param`` counts as ``final_act``). A warm start
        (``fit(init_from=...)``) takes every other field from the model it starts from."""
        return getattr(self, "_given", frozenset())  # set by __new__; a copy unpickled from an older release has none

    def _given_with(self, changes: Mapping[str, Any]) -> frozenset[str]:
        names = {_ALIASES.get(key.strip(), key.strip()) for key in changes if isinstance(key, str)}
        return self.given | (names & set(SPECS))

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


def _specs(cls: type[Config]) -> dict[str, FieldSpec]:
    """Every field's :class:`FieldSpec`, in declaration order; a field declared without one
    (not with :func:`_hyper`) fails the import of this module."""
    missing = [f.name for f in fields(cls) if not isinstance(f.metadata.get(_SPEC), FieldSpec)]
    if missing:
        raise TypeError(f"Config fields without a group, converter and check (declare them with _hyper): {', '.join(missing)}")
    return {f.name: f.metadata[_SPEC] for f in fields(cls)}


#: Each field's group, converter and own check (read-only), from the field declarations.
SPECS: Mapping[str, FieldSpec] = MappingProxyType(_specs(Config))
_SPECS = SPECS


def _group(name: str) -> tuple[str, ...]:
    return tuple(field_name for field_name, spec in SPECS.items() if spec.group == name)


#: The fields that define the network's shape and function (a warm start keeps them).
NETWORK_FIELDS: tuple[str, ...] = _group(NETWORK)
#: The column names of the event files.
DATA_FIELDS: tuple[str, ...] = _group(DATA)
#: The fields used only when the model answers (recommendations, evaluation, serving), never in training.
INFERENCE_FIELDS: tuple[str, ...] = _group(INFERENCE)


def _combination_problems(v: dict[str, Any]) -> list[str]:
    """The problems of combinations of fields, among the values ``v`` that passed their own
    checks (a field missing from ``v`` is already reported); one message per problem."""
    problems: list[str] = []
    loss = v.get("loss")
    if v.get("final_act") is not None and loss is not None:
        final: Activation = parse_activation(v["final_act"])
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
    if v.get("smoothing", 0.0) > 0.0 and loss is not None and loss not in SOFTMAX_LOSSES:
        problems.append(f"smoothing: label smoothing applies to the cross-entropy losses only, not to loss {loss!r}")
    adapt = v.get("adapt")
    if adapt is not None and "adapt_params" in v:
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
    named = [k for k in DATA_FIELDS if k in v]
    for i, first in enumerate(named):
        for second in named[i + 1:]:
            if v[first] == v[second]:
                problems.append(f"{second}: must differ from {first} (both are {v[first]!r})")
    return problems
