"""GRU4Rec's optimiser rule inside Triton kernels, and the update of the flat dense buffer.

The rule is the one of :mod:`gru4rec.training.optim` (ε = ``eps``, 1e-6 there). From the
gradient g (clipped: g·s) every method makes a direction ĝ, then momentum and L2 are applied::

    adagrad   acc ← acc + g²;             ĝ = g / sqrt(acc + ε)
    rmsprop   acc ← ρ·acc + (1 − ρ)·g²;   ĝ = g / sqrt(acc + ε)
    adadelta  acc ← ρ·acc + (1 − ρ)·g²;   ĝ = g·sqrt(dacc + ε) / sqrt(acc + ε);
              dacc ← ρ·dacc + (1 − ρ)·ĝ²  (the caller passes lr = 1)
    adam      m ← m + (1 − β1)·(g − m);   acc ← β2·acc + (1 − β2)·g²;
              ĝ = (m / (1 − β1^t)) / (sqrt(acc / (1 − β2^t)) + ε)
    sgd       ĝ = g

    d = ĝ + λ·p   (λ = lmbd; d = ĝ when λ = 0)
    μ > 0:  vel ← μ·vel − lr·d;  p ← p + vel
    μ = 0:  p ← p − lr·d

    grad_cap > 0:  s = min(1, grad_cap / (sqrt(Σ g²) + 1e-12)), the sum over the dense gradient
                   and every updated row's summed gradient, each row counted once.

The rule is one ``@triton.jit`` function (:func:`apply_rule`) that the dense kernel here and the
item tables' kernels (:mod:`gru4rec.kernels.triton_optim`) both call, with the run's constants
as kernel arguments (:class:`UpdateRule`) and the per-step scalars — Adam's step count ``t``
(float32, a whole number already incremented for this step: 1 ≤ t < 2³¹) and the squared norm
``sq_total`` of grad_cap — read from 0-dim device tensors: the bias corrections 1 − β^t are
computed in the kernel (float64 powers by squaring, the float32 result subtracted from 1 as
PyTorch does). :class:`TritonDenseUpdate` is the flat buffer of the dense weights in one launch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from gru4rec.kernels.cpu import METHODS  # one numbering of the methods for every kernel
from gru4rec.kernels.triton_support import triton_unavailable

__all__ = ["METHODS", "TritonDenseUpdate", "UpdateRule", "apply_rule", "bias_corrections", "clip_scale", "dense_sq_norm"]

#: Elements of the flat buffer per program of the dense kernels.
_DENSE_BLOCK = 1024
INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------- rule


@dataclass(frozen=True)
class UpdateRule:
    """The optimiser's constants for a run (see the module docstring for the rule).

    ``decay``: ρ for rmsprop and adadelta, β2 for adam (unused otherwise). ``beta1``: adam's β1.
    ``lr``: the learning rate (the caller passes 1 for adadelta, as the optimiser does).
    ``grad_cap``: clip the global gradient norm to this value (0: no clipping)."""

    method: str
    lr: float
    momentum: float = 0.0
    lmbd: float = 0.0
    decay: float = 0.0
    beta1: float = 0.0
    eps: float = 1e-6
    grad_cap: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown optimiser method {self.method!r}; expected one of {sorted(METHODS)}")
        for name in ("lr", "momentum", "lmbd", "decay", "beta1", "eps", "grad_cap"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))  # Triton takes Python floats as float32
        if self.grad_cap < 0:
            raise ValueError(f"grad_cap must be >= 0, got {self.grad_cap}")
        if self.method == "adam" and not (0.0 < self.decay < 1.0 and 0.0 <= self.beta1 < 1.0):
            raise ValueError(f"adam needs 0 < decay (beta2) < 1 and 0 <= beta1 < 1, got {self.decay}, {self.beta1}")

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The state tables this rule reads and writes."""
        keys = {"sgd": (), "adagrad": ("acc",), "rmsprop": ("acc",), "adadelta": ("acc", "dacc"), "adam": ("acc", "m")}[self.method]
        return keys + (("vel",) if self.momentum > 0 else ())

    def _kernel_args(self) -> dict[str, float | int | bool]:
        """The rule's arguments of the update kernels (the same names in both)."""
        return dict(
            lr=self.lr, momentum=self.momentum, lmbd=self.lmbd, decay=self.decay,
            # 1 − ρ and 1 − β1 rounded from double, as PyTorch rounds the Python floats it is given
            gain=1.0 - self.decay, beta1=self.beta1, beta1_gain=1.0 - self.beta1, eps=self.eps, grad_cap=self.grad_cap,
            METHOD=METHODS[self.method], HAS_MOMENTUM=self.momentum > 0, HAS_LMBD=self.lmbd > 0, CLIP=self.grad_cap > 0,
        )


@triton.jit
def clip_scale(sq_ptr, grad_cap, CLIP: tl.constexpr):
    """min(1, grad_cap / (‖g‖ + 1e-12)) from the step's squared norm, or 1 without clipping."""
    if CLIP:
        norm = tl.sqrt(tl.load(sq_ptr))
        return tl.minimum(grad_cap / (norm + 1e-12), 1.0)
    else:
        return 1.0


@triton.jit
def _power(beta, n):
    """β^n in float64 for a whole n ≥ 0 (< 2³¹) by squaring: multiplications only, exact to
    float64 rounding (the float32 exp2/log2 of a GPU are approximations, and float64 ones would
    need libdevice)."""
    base = tl.full((), beta, tl.float32).to(tl.float64)  # β as PyTorch rounds it: float32
    out = tl.full((), 1.0, tl.float64)
    for _ in range(31):
        out = tl.where((n & 1) != 0, out * base, out)
        base = base * base
        n = n >> 1
    return out


@triton.jit
def bias_corrections(t_ptr, beta1, decay, METHOD: tl.constexpr):
    """Adam's 1 − β1^t and 1 − β2^t for this step (1, 1 for the other methods).

    β^t is rounded to float32 before the subtraction, as ``1.0 - beta ** t`` is in PyTorch
    (float32 β, float32 power); for β2 = 0.999 the subtraction cancels all but a few bits, so
    β^t itself must be accurate to float32 rounding."""
    if METHOD == 4:
        n = tl.load(t_ptr).to(tl.int32)  # t counts steps: a whole number
        bias1 = 1.0 - _power(beta1, n).to(tl.float32)
        bias2 = 1.0 - _power(decay, n).to(tl.float32)
        return bias1, bias2
    else:
        return 1.0, 1.0


@triton.jit
def apply_rule(p_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, idx, mask, g,
                lr, momentum, lmbd, decay, gain, beta1_gain, eps, bias1, bias2,
                METHOD: tl.constexpr, HAS_MOMENTUM: tl.constexpr, HAS_LMBD: tl.constexpr):
    """The rule at the elements ``idx`` (where ``mask``) of p and its state, from the (summed,
    clipped) gradient ``g``; the state tables a method keeps no state in are never touched."""
    p = tl.load(p_ptr + idx, mask=mask, other=0.0)
    if METHOD == 0:  # sgd
        d = g
    elif METHOD == 1:  # adagrad
        acc = tl.load(acc_ptr + idx, mask=mask, other=0.0) + g * g
        tl.store(acc_ptr + idx, acc, mask=mask)
        d = g / tl.sqrt(acc + eps)
    elif METHOD == 2:  # rmsprop
        acc = decay * tl.load(acc_ptr + idx, mask=mask, other=0.0) + gain * (g * g)
        tl.store(acc_ptr + idx, acc, mask=mask)
        d = g / tl.sqrt(acc + eps)
    elif METHOD == 3:  # adadelta: the step itself enters dacc
        acc = decay * tl.load(acc_ptr + idx, mask=mask, other=0.0) + gain * (g * g)
        dacc = tl.load(dacc_ptr + idx, mask=mask, other=0.0)
        d = g * tl.sqrt(dacc + eps) / tl.sqrt(acc + eps)
        tl.store(acc_ptr + idx, acc, mask=mask)
        tl.store(dacc_ptr + idx, decay * dacc + gain * (d * d), mask=mask)
    else:  # adam (m: PyTorch's lerp with weight 1 − β1)
        m = tl.load(m_ptr + idx, mask=mask, other=0.0)
        m = m + beta1_gain * (g - m)
        acc = decay * tl.load(acc_ptr + idx, mask=mask, other=0.0) + gain * (g * g)
        tl.store(m_ptr + idx, m, mask=mask)
        tl.store(acc_ptr + idx, acc, mask=mask)
        d = (m / bias1) / (tl.sqrt(acc / bias2) + eps)
    if HAS_LMBD:  # L2 joins the direction before momentum, as in the reference
        d = d + lmbd * p
    if HAS_MOMENTUM:
        vel = momentum * tl.load(vel_ptr + idx, mask=mask, other=0.0) - lr * d
        tl.store(vel_ptr + idx, vel, mask=mask)
        p = p + vel
    else:
        p = p + d * (-lr)
    tl.store(p_ptr + idx, p, mask=mask)


# ---------------------------------------------------------------------------------------- the dense buffer


@triton.jit
def _dense_sq_norm_kernel(g_ptr, sq_ptr, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(g_ptr + idx, mask=idx < n, other=0.0)
    tl.atomic_add(sq_ptr, tl.sum(g * g, axis=0), sem="relaxed")


@triton.jit
def _dense_update_kernel(p_ptr, g_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, t_ptr, sq_ptr, n,
                         lr, momentum, lmbd, decay, gain, beta1, beta1_gain, eps, grad_cap,
                         METHOD: tl.constexpr, HAS_MOMENTUM: tl.constexpr, HAS_LMBD: tl.constexpr, CLIP: tl.constexpr,
                         BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    scale = clip_scale(sq_ptr, grad_cap, CLIP)
    bias1, bias2 = bias_corrections(t_ptr, beta1, decay, METHOD)
    g = tl.load(g_ptr + idx, mask=mask, other=0.0) * scale
    apply_rule(p_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, idx, mask, g, lr, momentum, lmbd, decay, gain,
                beta1_gain, eps, bias1, bias2, METHOD, HAS_MOMENTUM, HAS_LMBD)


# ---------------------------------------------------------------------------------------- checks (shared with triton_optim)


def check_float(t: object, name: str, device: torch.device, numel: int | None = None) -> Tensor:
    if not isinstance(t, Tensor) or t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous float32 tensor")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the table on {device}")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} must have {numel} elements, got {t.numel()} (shape {tuple(t.shape)})")
    return t


def _check_flat(t: object, name: str) -> Tensor:
    """A flat buffer: contiguous float32, indexed in int32 by the dense kernels."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a tensor")
    check_float(t, name, t.device)
    if t.numel() > INT32_MAX - _DENSE_BLOCK:
        raise ValueError(f"{name} has {t.numel()} elements, more than the dense kernels index")
    return t


def check_state(state: dict[str, Tensor | None], rule: UpdateRule, p: Tensor) -> dict[str, Tensor]:
    """The state tables the rule needs (others are ignored), checked against ``p``."""
    out = {}
    for key in rule.state_keys:
        t = state.get(key)
        if t is None:
            raise ValueError(f"the {rule.method} update (momentum {rule.momentum}) needs the state table {key!r}")
        out[key] = check_float(t, key, p.device, p.numel())
        if t.data_ptr() == p.data_ptr():
            raise ValueError(f"the state table {key!r} must not be the parameter itself")
    return out


def check_scalar(value: object, name: str, what: str, device: torch.device) -> None:
    if not isinstance(value, Tensor) or value.dim() != 0 or value.dtype != torch.float32 or value.device != device:
        raise ValueError(f"{name} ({what}) must be a 0-dim float32 tensor on {device}")


def check_sq_total(sq_total: object, device: torch.device) -> None:
    check_scalar(sq_total, "sq_total", "the step's squared gradient norm, grad_cap > 0", device)


def check_step(rule: UpdateRule, device: torch.device, t: Tensor | None, sq_total: Tensor | None) -> None:
    """The per-step scalars the rule reads: Adam's ``t``, and ``sq_total`` when clipping."""
    if rule.method == "adam":
        check_scalar(t, "t", "Adam's step count", device)
    if rule.grad_cap > 0:
        check_sq_total(sq_total, device)


def rule_pointers(p: Tensor, state: dict[str, Tensor], t: Tensor | None, sq_total: Tensor | None) -> list[Tensor]:
    """acc, dacc, m, vel, t, sq_total; ``p`` stands in for those the compiled rule never reads."""
    return [state.get(k, p) for k in ("acc", "dacc", "m", "vel")] + [p if t is None else t, p if sq_total is None else sq_total]


def check_device(device: torch.device) -> None:
    why = triton_unavailable(device)
    if why is not None:
        raise ValueError(f"the Triton optimiser kernels cannot run on {device}: {why}")


# ---------------------------------------------------------------------------------------- the bound update


def _launch_dense_update(p: Tensor, g: Tensor, pointers: list[Tensor], args: dict[str, float | int | bool]) -> None:
    n = p.numel()
    _dense_update_kernel[(triton.cdiv(n, _DENSE_BLOCK),)](p, g, *pointers, n, **args, BLOCK=_DENSE_BLOCK)


def dense_sq_norm(g: Tensor, sq_total: Tensor) -> None:
    """``sq_total += Σ g²`` over the flat dense gradient (one launch)."""
    _check_flat(g, "g")
    check_sq_total(sq_total, g.device)
    if g.numel():
        _dense_sq_norm_kernel[(triton.cdiv(g.numel(), _DENSE_BLOCK),)](g, sq_total, g.numel(), BLOCK=_DENSE_BLOCK)


class TritonDenseUpdate:
    """The update of the flat dense buffer ``p`` (contiguous float32, any shape, read flat) with
    its full-size ``state`` tables, bound and checked once (the rule's constants: those of
    :class:`UpdateRule`)."""

    def __init__(self, p: Tensor, state: dict[str, Tensor | None], *, method: str, lr: float, momentum: float = 0.0,
                 lmbd: float = 0.0, decay: float = 0.0, beta1: float = 0.0, eps: float = 1e-6, grad_cap: float = 0.0) -> None:
        self.rule = UpdateRule(method, lr, momentum=momentum, lmbd=lmbd, decay=decay, beta1=beta1, eps=eps, grad_cap=grad_cap)
        _check_flat(p, "p")
        check_device(p.device)
        self.p = p
        self.state = check_state(state, self.rule, p)
        self._args = self.rule._kernel_args()

    def add_sq_norm(self, g: Tensor, sq_total: Tensor) -> None:
        """Add Σ g² of the dense gradient ``g`` to ``sq_total`` (grad_cap)."""
        check_float(g, "g", self.p.device, self.p.numel())
        dense_sq_norm(g, sq_total)

    def update(self, g: Tensor, t: Tensor | None = None, sq_total: Tensor | None = None) -> None:
        """Update the whole buffer from ``g`` (same size, left unchanged)."""
        check_float(g, "g", self.p.device, self.p.numel())
        check_step(self.rule, self.p.device, t, sq_total)
        if self.p.numel():
            _launch_dense_update(self.p, g, rule_pointers(self.p, self.state, t, sq_total), self._args)
