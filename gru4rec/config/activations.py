"""Activation strings of GRU4Rec (docs/behaviour.md §2): parsing and application.

An activation is written as a short string, as in the original implementation's parameter files:

=====================  ==========================================================
``linear``             identity
``relu``               ``max(x, 0)``
``tanh``               hyperbolic tangent (the default hidden activation)
``leaky-A``            ``x if x >= 0 else A*x``                (e.g. ``leaky-0.01``)
``elu-A``              ``x if x >= 0 else A*(exp(x) - 1)``     (e.g. ``elu-0.5``)
``selu-S-A``           ``S * elu-A(x)``                        (e.g. ``selu-1.0507-1.6733``)
``softmax``            row-wise softmax over the last dimension (final activation only)
``softmax_logit``      row-wise ``-log_softmax`` over the last dimension (final activation only)
=====================  ==========================================================

The numbers ``A`` and ``S`` are unsigned decimal numbers (``0.5``, ``1``, ``.25``, ``1e-3``);
a sign is not accepted, as in the original, whose parser split the string on ``-``.

:func:`parse_activation` turns a string into an :class:`Activation`, a small frozen (hashable)
object that is callable on a tensor. The two softmax forms are row-wise rather than elementwise;
the losses usually fuse them with the loss itself, but calling them is well defined: ``softmax``
gives the probabilities ``r`` of the cross-entropy loss and ``softmax_logit`` gives
``r = -log softmax`` of the ``xe_logit`` loss (docs/behaviour.md §5).
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "Activation",
    "ELEMENTWISE_ACTIVATIONS",
    "FINAL_ACTIVATIONS",
    "HIDDEN_ACTIVATIONS",
    "parse_activation",
]

#: Names of the activations applied element by element (allowed as ``hidden_act``).
ELEMENTWISE_ACTIVATIONS: frozenset[str] = frozenset({"linear", "relu", "tanh", "leaky", "elu", "selu"})
#: Names allowed for ``hidden_act`` (the candidate activation of the GRU cell).
HIDDEN_ACTIVATIONS: frozenset[str] = ELEMENTWISE_ACTIVATIONS
#: Names allowed for ``final_act`` (applied to the scores before the loss).
FINAL_ACTIVATIONS: frozenset[str] = ELEMENTWISE_ACTIVATIONS | {"softmax", "softmax_logit"}

# Number of numeric parameters each name takes, and what they mean (for error messages).
_N_PARAMS: dict[str, int] = {
    "linear": 0, "relu": 0, "tanh": 0, "softmax": 0, "softmax_logit": 0,
    "leaky": 1, "elu": 1, "selu": 2,
}
_USAGE: dict[str, str] = {
    "leaky": "leaky-A (e.g. leaky-0.01)",
    "elu": "elu-A (e.g. elu-0.5)",
    "selu": "selu-S-A (e.g. selu-1.0507-1.6733)",
}
# An unsigned decimal number. The exponent's own sign is part of the number, so
# 'selu-1e-05-1.5' still splits unambiguously into 1e-05 and 1.5.
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PARAMS_RE: dict[int, re.Pattern[str]] = {
    1: re.compile(rf"({_NUMBER})"),
    2: re.compile(rf"({_NUMBER})-({_NUMBER})"),
}


def _format_number(value: float) -> str:
    """Shortest string that reads back as the same float; integral values lose the '.0'."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Activation:
    """A parsed activation: ``name``, its numeric ``params`` and the normalised ``spec`` string.

    Build it with :func:`parse_activation`. Calling it applies the activation to a tensor with
    torch operations that autograd and ``torch.compile`` handle.
    """

    name: str
    params: tuple[float, ...] = ()
    spec: str = ""

    def __post_init__(self) -> None:
        # Internal invariant: instances come from parse_activation (or are written by hand in tests).
        assert self.name in _N_PARAMS and len(self.params) == _N_PARAMS[self.name], self
        if not self.spec:
            object.__setattr__(self, "spec", "-".join([self.name, *map(_format_number, self.params)]))

    @property
    def elementwise(self) -> bool:
        """True for the activations applied element by element (everything but the softmaxes)."""
        return self.name in ELEMENTWISE_ACTIVATIONS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the activation to ``x`` (the softmaxes act on rows: the last dimension)."""
        name = self.name
        if name == "linear":
            return x
        if name == "tanh":
            return torch.tanh(x)
        if name == "relu":
            return torch.relu(x)
        if name == "leaky":
            return F.leaky_relu(x, negative_slope=self.params[0])
        if name == "elu":
            return F.elu(x, alpha=self.params[0])
        if name == "selu":
            scale, alpha = self.params
            return scale * F.elu(x, alpha=alpha)
        if name == "softmax":
            return torch.softmax(x, dim=-1)
        if name == "softmax_logit":
            return -torch.log_softmax(x, dim=-1)
        raise AssertionError(f"unhandled activation {name!r}")  # guarded by __post_init__

    def derivative(self, out: torch.Tensor) -> torch.Tensor | None:
        """f'(x) of an elementwise activation, from its OUTPUT ``out = f(x)`` (None: identity).

        Every elementwise activation here keeps the sign of x (f(x) > 0 exactly when x > 0), so
        the output alone says which branch x was on; the hand-written backward passes of the
        training step then need not keep the pre-activations.
        """
        name = self.name
        if name == "linear":
            return None
        if name == "tanh":
            return 1.0 - out * out
        if name == "relu":
            return (out > 0).to(out.dtype)
        if name == "leaky":
            return torch.where(out > 0, 1.0, self.params[0]).to(out.dtype)
        if name == "elu":
            return torch.where(out > 0, 1.0, out + self.params[0])
        if name == "selu":
            scale, alpha = self.params
            return torch.where(out > 0, scale, out + scale * alpha)
        raise ValueError(f"{self.spec} is not elementwise: it has no elementwise derivative")

    def __str__(self) -> str:
        return self.spec


def parse_activation(spec: str) -> Activation:
    """Parse an activation string such as ``'tanh'``, ``'elu-0.5'`` or ``'selu-1.0507-1.6733'``.

    Surrounding blanks and letter case are ignored. Raises :class:`ValueError` with the reason
    for an unknown name, a missing, extra or malformed number, or a number that is not finite.
    """
    if not isinstance(spec, str):
        raise ValueError(f"an activation must be a string such as 'tanh' or 'elu-0.5', got {spec!r}")
    return _parse_cached(spec)


# Configs parse the same few strings over and over (properties, model construction): cache them.
@functools.lru_cache(maxsize=256)
def _parse_cached(spec: str) -> Activation:
    text = spec.strip().lower()
    name, sep, rest = text.partition("-")
    if name not in _N_PARAMS:
        known = ", ".join(sorted(_N_PARAMS))
        raise ValueError(f"unknown activation {spec!r}: the name must be one of {known}")
    n_params = _N_PARAMS[name]
    if n_params == 0:
        if sep:
            raise ValueError(f"activation {spec!r}: {name!r} takes no parameter")
        return Activation(name, (), name)
    if not sep or not rest:
        raise ValueError(f"activation {spec!r} needs its parameter: write {_USAGE[name]}")
    match = _PARAMS_RE[n_params].fullmatch(rest)
    if match is None:
        raise ValueError(
            f"activation {spec!r} is malformed: write {_USAGE[name]} with unsigned decimal numbers"
        )
    params = tuple(float(g) for g in match.groups())
    if not all(math.isfinite(p) for p in params):
        raise ValueError(f"activation {spec!r}: its parameters must be finite numbers")
    return Activation(name, params)
