"""The elementwise activations of GRU4Rec (``gru4rec/config/activations.py``) inside Triton kernels.

Shared by the fused GRU cell (the candidate activation, :mod:`gru4rec.kernels.triton_gru`) and
the fused losses (the final activation, :mod:`gru4rec.kernels.triton_losses`). An activation
enters a kernel as a constexpr code with two float parameters (:func:`activation_code`);
:func:`activate` applies it, :func:`slope` gives its derivative from the OUTPUT, as
:meth:`gru4rec.config.activations.Activation.derivative` does (every one of them keeps the sign of its
input, so the output says which branch the input was on). Nothing here takes exp of a large
positive argument: nothing overflows, on a GPU or in the interpreter.
"""
from __future__ import annotations

import math
from typing import Any

import triton
import triton.language as tl

__all__ = ["ACT_CODES", "ACT_ELU", "ACT_LEAKY", "ACT_LINEAR", "ACT_RELU", "ACT_SELU", "ACT_TANH", "activate",
           "activation_code", "sigmoid", "slope", "tanh"]

#: Codes of the candidate activations (the ``ACT`` constexpr of the kernels).
ACT_LINEAR, ACT_RELU, ACT_TANH, ACT_LEAKY, ACT_ELU, ACT_SELU = range(6)
ACT_CODES: dict[str, int] = {"linear": ACT_LINEAR, "relu": ACT_RELU, "tanh": ACT_TANH, "leaky": ACT_LEAKY, "elu": ACT_ELU, "selu": ACT_SELU}
_N_PARAMS = {"linear": 0, "relu": 0, "tanh": 0, "leaky": 1, "elu": 1, "selu": 2}


def activation_args(act: Any) -> tuple[int, float, float]:
    """(code, p0, p1) from an activation object (via :func:`activation_code`) or from such a
    tuple already made once (checked, not parsed again): what the kernels' launchers take."""
    if isinstance(act, tuple):
        if len(act) != 3 or act[0] not in ACT_CODES.values():
            raise ValueError(f"act must be an elementwise Activation or a (code, p0, p1) tuple of a known activation code, got {act!r}")
        return int(act[0]), float(act[1]), float(act[2])
    return activation_code(act)


def activation_code(act: Any) -> tuple[int, float, float]:
    """(code, p0, p1) of an elementwise activation (an object with ``.name`` and ``.params``,
    as :class:`gru4rec.config.activations.Activation`): leaky-A and elu-A give p0 = A, selu-S-A gives
    p0 = S, p1 = A; unused parameters are 0. ValueError for anything else (the softmaxes)."""
    name, params = getattr(act, "name", None), tuple(getattr(act, "params", ()))
    if name not in ACT_CODES:
        raise ValueError(f"act must be one of the elementwise activations {', '.join(ACT_CODES)}, got {act!r}")
    if len(params) != _N_PARAMS[name] or not all(isinstance(p, (int, float)) and math.isfinite(p) for p in params):
        raise ValueError(f"act {name!r} takes {_N_PARAMS[name]} finite parameter(s), got {params!r}")
    p = [float(x) for x in params] + [0.0, 0.0]
    return ACT_CODES[name], p[0], p[1]


# ---------------------------------------------------------------------------------------------
# Elementwise helpers (float32). No exp of a large positive argument anywhere: nothing overflows.


@triton.jit
def sigmoid(x):
    e = tl.exp(-tl.abs(x))  # in (0, 1]
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def tanh(x):
    # Cephes' odd polynomial below 0.625 (where 1 − 2/(e^2a + 1) loses relative accuracy), that
    # form above (as tanh_f32 of cpu_kernels.c); tanh(20) is 1 in float32.
    a = tl.abs(x)
    s = x * x
    small = (
        (((-5.70498872745e-3 * s + 2.06390887954e-2) * s - 5.37397155531e-2) * s + 1.33314422036e-1) * s - 3.33332819422e-1
    ) * s * x + x
    large = 1.0 - 2.0 / (tl.exp(2.0 * tl.minimum(a, 20.0)) + 1.0)
    large = tl.where(x < 0, -large, large)
    return tl.where(a < 0.625, small, large)


@triton.jit
def _expm1_neg(x):
    """exp(x) − 1 for x ≤ 0 (larger x are clamped to 0): Taylor to degree 9 above −0.5, where
    exp(x) − 1 would cancel, exp(x) − 1 below."""
    xn = tl.minimum(x, 0.0)
    t = tl.maximum(xn, -0.5)
    p = 1.0 / 362880.0
    p = p * t + 1.0 / 40320.0
    p = p * t + 1.0 / 5040.0
    p = p * t + 1.0 / 720.0
    p = p * t + 1.0 / 120.0
    p = p * t + 1.0 / 24.0
    p = p * t + 1.0 / 6.0
    p = p * t + 0.5
    p = p * t + 1.0
    p = p * t
    return tl.where(xn > -0.5, p, tl.exp(xn) - 1.0)


@triton.jit
def activate(u, ACT: tl.constexpr, p0, p1):
    """f(u) for the activation code ACT (parameters as in :func:`activation_code`)."""
    if ACT == 0:  # linear
        y = u
    elif ACT == 1:  # relu
        y = tl.where(u > 0, u, 0.0)
    elif ACT == 2:  # tanh
        y = tanh(u)
    elif ACT == 3:  # leaky-A
        y = tl.where(u > 0, u, u * p0)
    elif ACT == 4:  # elu-A
        y = tl.where(u > 0, u, p0 * _expm1_neg(u))
    else:  # selu-S-A: S·elu-A
        y = p0 * tl.where(u > 0, u, p1 * _expm1_neg(u))
    return y


@triton.jit
def slope(c, ACT: tl.constexpr, p0, p1):
    """f'(u) from the output c = f(u) (Activation.derivative)."""
    if ACT == 0:  # linear
        d = tl.full(c.shape, 1.0, tl.float32)
    elif ACT == 1:  # relu
        d = tl.where(c > 0, 1.0, 0.0)
    elif ACT == 2:  # tanh
        d = 1.0 - c * c
    elif ACT == 3:  # leaky-A
        d = tl.where(c > 0, 1.0, p0)
    elif ACT == 4:  # elu-A
        d = tl.where(c > 0, 1.0, c + p0)
    else:  # selu-S-A
        d = tl.where(c > 0, p0, c + p0 * p1)
    return d
