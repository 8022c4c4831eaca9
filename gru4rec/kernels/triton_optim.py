"""GRU4Rec's optimiser as fused Triton kernels: the lazy update of the item tables at the rows a
step uses (duplicate rows allowed, no host sync) and the update of the flat dense buffer.

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

Item tables: duplicate rows without a host sync
-----------------------------------------------
A step's row indices repeat (an item is clicked by several sessions, sampled as a negative, and
both), and the gradients of one row must be summed before the rule runs once on the row: the rule
is not linear in g. ``torch.unique`` would tell how many distinct rows there are, but that number
lives on the device and reading it stalls the captured CUDA graph. Here every table has two
full-size tables of zeros, ``scratch`` (N×W float32) and ``owner`` (N int32), and a step is:

1. :func:`scatter_rows` (once per part of the gradient): ``scratch[rows[k]] += g[k]`` (atomic
   adds) and ``owner[rows[k]] = max(owner[rows[k]], offset + k + 1)`` (atomic max). After every
   part is in, ``scratch`` holds each row's summed gradient and ``owner`` names one position per
   row, the last one, that *owns* the row. Positions are numbered across the parts of one table
   (``offset`` = the number of positions in the earlier parts), so an owner is unique even when a
   row is in two parts (shared-embedding mode: Wy gets the input rows and the score columns).
2. (grad_cap > 0) :func:`rows_sq_norm`: each owning position adds ‖scratch[row]‖² to the 0-dim
   ``sq_total`` (atomic add); :func:`dense_sq_norm` adds the dense gradient's Σ g². Every norm
   kernel of the step runs before any update, since the updates consume the scratch table.
3. :func:`update_rows` (once per part): the owning position reads scratch[row] (times s, computed
   in the kernel from ``sq_total``), zeroes it and owner[row], and applies the rule to p[row] and
   its state rows. Exactly one program touches each row, so nothing races; the others do nothing.
4. :func:`dense_update`: the rule over the whole flat buffer, one kernel.

Both tables are zero again after the step. Positions whose row is outside [0, N) are skipped
(checking them on the host would sync); rows must be in range for the update to mean anything.

Per step: 2 launches per table part (scatter, update) and 1 for the dense buffer, plus with
grad_cap > 0 one norm kernel per table part, one for the dense buffer and the caller's zeroing of
``sq_total``. Scalars that change per step are read from 0-dim device tensors: Adam's step count
``t`` (float32, a whole number already incremented for this step by the caller: 1 ≤ t < 2³¹) and
``sq_total``; the bias corrections 1 − β^t are computed in the kernel (float64 powers by
squaring, the float32 result subtracted from 1 as PyTorch does). Constants of a run (method,
lr, μ, λ, ρ or β2, β1, ε, grad_cap) are kernel arguments. Launch grids depend on tensor shapes only, and no
tensor is allocated, so every call can be captured in a CUDA graph.

Determinism: the summed gradient of a duplicated row and ``sq_total`` are float sums done by
atomics, whose order varies between runs (the last bit may differ); everything else is exact.

This module imports Triton at the top: it is imported only where the fused GPU path is chosen
(:func:`gru4rec.kernels.triton_support.triton_unavailable`). On CPU tensors its kernels run in
Triton's interpreter (``TRITON_INTERPRET=1``, set before this module is imported): the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from gru4rec.kernels.triton_support import triton_unavailable

__all__ = [
    "METHODS",
    "TritonDenseUpdate",
    "TritonTableUpdate",
    "UpdateRule",
    "dense_sq_norm",
    "dense_update",
    "rows_sq_norm",
    "scatter_rows",
    "update_rows",
]

#: Optimiser methods as the kernels number them (a compile-time constant of each kernel).
METHODS = {"sgd": 0, "adagrad": 1, "rmsprop": 2, "adadelta": 3, "adam": 4}

#: Elements of the flat buffer per program of the dense kernels.
_DENSE_BLOCK = 1024
#: Elements of one row tile (positions × columns); rows wider than _MAX_BLOCK_W are walked in
#: column chunks by the same program, which is what lets it zero the owner entry last.
_ROW_TILE = 1024
_MAX_BLOCK_W = 128
_INT32_MAX = 2**31 - 1


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
def _clip_scale(sq_ptr, grad_cap, CLIP: tl.constexpr):
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
def _bias_corrections(t_ptr, beta1, decay, METHOD: tl.constexpr):
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
def _apply_rule(p_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, idx, mask, g,
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


# ---------------------------------------------------------------------------------------- kernels


@triton.jit
def _positions(rows_ptr, rows2_ptr, K, K2, N, BLOCK_K: tl.constexpr):
    """This program's positions over one part (K) or two (K + K2: the second's rows follow),
    their rows (int64: row × W may pass 2³¹), which are valid, and which are in the first part."""
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    in1 = k < K
    in2 = (k >= K) & (k < K + K2)
    row = tl.where(in1, tl.load(rows_ptr + k, mask=in1, other=0).to(tl.int64),
                   tl.load(rows2_ptr + (k - K), mask=in2, other=0).to(tl.int64))
    return k, row, (in1 | in2) & (row >= 0) & (row < N), in1


@triton.jit
def _scatter_rows_kernel(rows_ptr, g_ptr, rows2_ptr, g2_ptr, scratch_ptr, owner_ptr, bg_ptr, bscratch_ptr, K, K2, N, W, offset,
                         bias_from, HAS_BIAS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr):
    k, row, valid, in1 = _positions(rows_ptr, rows2_ptr, K, K2, N, BLOCK_K)
    # the last position of a row owns it (positions numbered from 1: 0 means "no owner")
    tl.atomic_max(owner_ptr + row, offset + k + 1, mask=valid, sem="relaxed")
    if HAS_BIAS:  # the bias table rides along: the same rows from position bias_from on, one value each
        at_bias = valid & (k >= bias_from)
        tl.atomic_add(bscratch_ptr + row, tl.load(bg_ptr + (k - bias_from), mask=at_bias, other=0.0), mask=at_bias, sem="relaxed")
    cols = tl.arange(0, BLOCK_W)
    g_base = k.to(tl.int64)[:, None] * W
    g2_base = (k - K).to(tl.int64)[:, None] * W
    first = in1[:, None]
    s_base = row[:, None] * W
    for w0 in range(0, W, BLOCK_W):
        c = (w0 + cols)[None, :]
        mask = valid[:, None] & (c < W)
        g = tl.where(first, tl.load(g_ptr + g_base + c, mask=mask & first, other=0.0),
                     tl.load(g2_ptr + g2_base + c, mask=mask & ~first, other=0.0))
        tl.atomic_add(scratch_ptr + s_base + c, g, mask=mask, sem="relaxed")


@triton.jit
def _rows_sq_norm_kernel(rows_ptr, rows2_ptr, scratch_ptr, owner_ptr, bscratch_ptr, sq_ptr, K, K2, N, W, offset, bias_from,
                         HAS_BIAS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr):
    k, row, valid, _ = _positions(rows_ptr, rows2_ptr, K, K2, N, BLOCK_K)
    owner = tl.load(owner_ptr + row, mask=valid, other=0)
    own = valid & (owner == offset + k + 1)  # each row counted once, by its owner
    cols = tl.arange(0, BLOCK_W)
    s_base = row[:, None] * W
    total = tl.zeros((BLOCK_K, BLOCK_W), dtype=tl.float32)
    for w0 in range(0, W, BLOCK_W):
        c = (w0 + cols)[None, :]
        g = tl.load(scratch_ptr + s_base + c, mask=own[:, None] & (c < W), other=0.0)
        total += g * g
    part = tl.sum(tl.sum(total, axis=1), axis=0)
    if HAS_BIAS:
        gb = tl.load(bscratch_ptr + row, mask=own & (k >= bias_from), other=0.0)
        part += tl.sum(gb * gb, axis=0)
    tl.atomic_add(sq_ptr, part, sem="relaxed")


@triton.jit
def _update_rows_kernel(rows_ptr, rows2_ptr, p_ptr, scratch_ptr, owner_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, t_ptr, sq_ptr,
                        bp_ptr, bscratch_ptr, bacc_ptr, bdacc_ptr, bm_ptr, bvel_ptr,
                        K, K2, N, W, offset, bias_from, lr, momentum, lmbd, decay, gain, beta1, beta1_gain, eps, grad_cap,
                        METHOD: tl.constexpr, HAS_MOMENTUM: tl.constexpr, HAS_LMBD: tl.constexpr, CLIP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr):
    k, row, valid, _ = _positions(rows_ptr, rows2_ptr, K, K2, N, BLOCK_K)
    # The owner's own program is the only one that zeroes owner[row] (after its whole row): any
    # other position of the row reads the owner's number or 0, never its own, and does nothing.
    owner = tl.load(owner_ptr + row, mask=valid, other=0)
    own = valid & (owner == offset + k + 1)
    scale = _clip_scale(sq_ptr, grad_cap, CLIP)
    bias1, bias2 = _bias_corrections(t_ptr, beta1, decay, METHOD)
    cols = tl.arange(0, BLOCK_W)
    s_base = row[:, None] * W
    for w0 in range(0, W, BLOCK_W):
        c = (w0 + cols)[None, :]
        mask = own[:, None] & (c < W)
        idx = s_base + c
        g = tl.load(scratch_ptr + idx, mask=mask, other=0.0) * scale
        tl.store(scratch_ptr + idx, tl.zeros((BLOCK_K, BLOCK_W), dtype=tl.float32), mask=mask)
        _apply_rule(p_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, idx, mask, g, lr, momentum, lmbd, decay, gain,
                    beta1_gain, eps, bias1, bias2, METHOD, HAS_MOMENTUM, HAS_LMBD)
    if HAS_BIAS:  # the same owner updates the bias table's row, if the row is one of the bias's
        own_b = own & (k >= bias_from)
        gb = tl.load(bscratch_ptr + row, mask=own_b, other=0.0) * scale
        tl.store(bscratch_ptr + row, tl.zeros((BLOCK_K,), dtype=tl.float32), mask=own_b)
        _apply_rule(bp_ptr, bacc_ptr, bdacc_ptr, bm_ptr, bvel_ptr, row, own_b, gb, lr, momentum, lmbd, decay, gain,
                    beta1_gain, eps, bias1, bias2, METHOD, HAS_MOMENTUM, HAS_LMBD)
    tl.store(owner_ptr + row, tl.zeros((BLOCK_K,), dtype=tl.int32), mask=own)


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
    scale = _clip_scale(sq_ptr, grad_cap, CLIP)
    bias1, bias2 = _bias_corrections(t_ptr, beta1, decay, METHOD)
    g = tl.load(g_ptr + idx, mask=mask, other=0.0) * scale
    _apply_rule(p_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, idx, mask, g, lr, momentum, lmbd, decay, gain,
                beta1_gain, eps, bias1, bias2, METHOD, HAS_MOMENTUM, HAS_LMBD)


# ---------------------------------------------------------------------------------------- checks


def _row_blocks(width: int) -> tuple[int, int]:
    """(positions, columns) of a row tile: about _ROW_TILE elements, powers of two."""
    block_w = min(triton.next_power_of_2(max(width, 1)), _MAX_BLOCK_W)
    return max(_ROW_TILE // block_w, 1), block_w


def _check_float(t: object, name: str, device: torch.device, numel: int | None = None) -> Tensor:
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
    _check_float(t, name, t.device)
    if t.numel() > _INT32_MAX - _DENSE_BLOCK:
        raise ValueError(f"{name} has {t.numel()} elements, more than the dense kernels index")
    return t


def _table_shape(p: object, name: str = "p") -> tuple[int, int]:
    """(N, W) of an item table: N×W, or N (a bias table, N×1)."""
    if not isinstance(p, Tensor) or p.dim() not in (1, 2):
        raise ValueError(f"{name} must be a 1-D or 2-D tensor (an item table: N×W, or N)")
    _check_float(p, name, p.device)
    n, w = p.shape[0], (p.shape[1] if p.dim() == 2 else 1)
    if n * w == 0:
        raise ValueError(f"an item table must not be empty, got shape {tuple(p.shape)}")
    return n, w


def _check_scratch(scratch: object, owner: object, n: int, width: int, device: torch.device) -> None:
    """``scratch``: N·W float32 sums; ``owner``: N int32 owners; both on ``device``."""
    _check_float(scratch, "scratch", device, n * width)
    if not isinstance(owner, Tensor) or owner.dtype != torch.int32 or not owner.is_contiguous() or owner.dim() != 1:
        raise ValueError("owner must be a contiguous 1-D int32 tensor")
    if owner.device != device or owner.shape[0] != n:
        raise ValueError(f"owner must hold one int32 per row of the table ({n}) on {device}, got shape {tuple(owner.shape)} on {owner.device}")


def _check_table(p: Tensor, scratch: object, owner: object) -> tuple[int, int]:
    """(N, W) of the item table ``p``, with its scratch and owner tables checked against it."""
    n, w = _table_shape(p)
    _check_scratch(scratch, owner, n, w, p.device)
    if scratch.data_ptr() == p.data_ptr():  # type: ignore[union-attr]
        raise ValueError("scratch must be a table of its own, not the parameter")
    return n, w


def _check_rows(rows: object, device: torch.device, offset: int) -> int:
    """The number of positions K of ``rows`` (1-D int32/int64); positions offset+1…offset+K must fit int32."""
    if not isinstance(rows, Tensor) or rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64) or not rows.is_contiguous():
        raise ValueError("rows must be a contiguous 1-D int32 or int64 tensor")
    if rows.device != device:
        raise ValueError(f"rows is on {rows.device}, the table on {device}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    if offset + rows.shape[0] > _INT32_MAX:
        raise ValueError(f"offset + len(rows) = {offset + rows.shape[0]} does not fit the int32 owner table")
    return rows.shape[0]


def _check_state(state: dict[str, Tensor | None], rule: UpdateRule, p: Tensor) -> dict[str, Tensor]:
    """The state tables the rule needs (others are ignored), checked against ``p``."""
    out = {}
    for key in rule.state_keys:
        t = state.get(key)
        if t is None:
            raise ValueError(f"the {rule.method} update (momentum {rule.momentum}) needs the state table {key!r}")
        out[key] = _check_float(t, key, p.device, p.numel())
        if t.data_ptr() == p.data_ptr():
            raise ValueError(f"the state table {key!r} must not be the parameter itself")
    return out


def _check_scalar(value: object, name: str, what: str, device: torch.device) -> None:
    if not isinstance(value, Tensor) or value.dim() != 0 or value.dtype != torch.float32 or value.device != device:
        raise ValueError(f"{name} ({what}) must be a 0-dim float32 tensor on {device}")


def _check_sq_total(sq_total: object, device: torch.device) -> None:
    _check_scalar(sq_total, "sq_total", "the step's squared gradient norm, grad_cap > 0", device)


def _check_step(rule: UpdateRule, device: torch.device, t: Tensor | None, sq_total: Tensor | None) -> None:
    """The per-step scalars the rule reads: Adam's ``t``, and ``sq_total`` when clipping."""
    if rule.method == "adam":
        _check_scalar(t, "t", "Adam's step count", device)
    if rule.grad_cap > 0:
        _check_sq_total(sq_total, device)


def _check_same_dtype(rows: Tensor, second: Tensor) -> None:
    if second.dtype != rows.dtype:
        raise ValueError(f"the second part's rows must be {rows.dtype} like the first's, got {second.dtype}")


def _check_grad_rows(g: object, k: int, width: int, device: torch.device) -> None:
    _check_float(g, "g", device, k * width)
    if g.dim() == 0 or g.shape[0] != k:  # type: ignore[union-attr]
        raise ValueError(f"g must have one gradient row per position ({k}), got shape {tuple(g.shape)}")  # type: ignore[union-attr]


def _rule_pointers(p: Tensor, state: dict[str, Tensor], t: Tensor | None, sq_total: Tensor | None) -> list[Tensor]:
    """acc, dacc, m, vel, t, sq_total; ``p`` stands in for those the compiled rule never reads."""
    return [state.get(k, p) for k in ("acc", "dacc", "m", "vel")] + [p if t is None else t, p if sq_total is None else sq_total]


# ---------------------------------------------------------------------------------------- launches
# (arguments checked by the callers; K > 0)


def _launch_scatter(rows: Tensor, g: Tensor, scratch: Tensor, owner: Tensor, k: int, n: int, w: int, offset: int,
                    bias: tuple[Tensor, Tensor] | None = None, second: tuple[Tensor, Tensor] | None = None) -> None:
    block_k, block_w = _row_blocks(w)
    rows2, g2 = second if second is not None else (rows, g)
    k2 = rows2.shape[0] if second is not None else 0
    bg, bscratch = bias if bias is not None else (g, scratch)
    _scatter_rows_kernel[(triton.cdiv(k + k2, block_k),)](rows, g, rows2, g2, scratch, owner, bg, bscratch, k, k2, n, w, offset,
                                                           k if second is not None else 0, HAS_BIAS=bias is not None,
                                                           BLOCK_K=block_k, BLOCK_W=block_w)


def _launch_rows_sq_norm(rows: Tensor, scratch: Tensor, owner: Tensor, sq_total: Tensor, k: int, n: int, w: int, offset: int,
                         bscratch: Tensor | None = None, second: Tensor | None = None) -> None:
    block_k, block_w = _row_blocks(w)
    k2 = second.shape[0] if second is not None else 0
    _rows_sq_norm_kernel[(triton.cdiv(k + k2, block_k),)](rows, rows if second is None else second, scratch, owner,
                                                           scratch if bscratch is None else bscratch, sq_total, k, k2, n, w,
                                                           offset, k if second is not None else 0, HAS_BIAS=bscratch is not None,
                                                           BLOCK_K=block_k, BLOCK_W=block_w)


def _launch_update_rows(rows: Tensor, p: Tensor, scratch: Tensor, owner: Tensor, pointers: list[Tensor], k: int, n: int, w: int,
                        offset: int, args: dict[str, float | int | bool], bias: list[Tensor] | None = None,
                        second: Tensor | None = None) -> None:
    """``bias``: the bias table riding along (its p, scratch, acc, dacc, m, vel), or None;
    ``second``: the rows of a second part following these (the bias rides on the last part)."""
    block_k, block_w = _row_blocks(w)
    k2 = second.shape[0] if second is not None else 0
    _update_rows_kernel[(triton.cdiv(k + k2, block_k),)](rows, rows if second is None else second, p, scratch, owner, *pointers,
                                                          *(bias if bias is not None else [p] * 6), k, k2, n, w, offset,
                                                          k if second is not None else 0, **args, HAS_BIAS=bias is not None,
                                                          BLOCK_K=block_k, BLOCK_W=block_w)


def _launch_dense_update(p: Tensor, g: Tensor, pointers: list[Tensor], args: dict[str, float | int | bool]) -> None:
    n = p.numel()
    _dense_update_kernel[(triton.cdiv(n, _DENSE_BLOCK),)](p, g, *pointers, n, **args, BLOCK=_DENSE_BLOCK)


# ---------------------------------------------------------------------------------------- functions


def scatter_rows(rows: Tensor, g: Tensor, scratch: Tensor, owner: Tensor, offset: int = 0) -> None:
    """``scratch[rows[k]] += g[k]`` and ``owner[rows[k]] = max(owner[rows[k]], offset + k + 1)``
    for every position k (one launch). ``g``: K×W (or K for a bias table); ``scratch``: the
    table's N×W (or N) float32 sums; ``owner``: N int32; ``offset``: positions in earlier parts."""
    n, w = _table_shape(scratch, "scratch")
    _check_scratch(scratch, owner, n, w, scratch.device)
    k = _check_rows(rows, scratch.device, offset)
    _check_grad_rows(g, k, w, scratch.device)
    if k:
        _launch_scatter(rows, g, scratch, owner, k, n, w, offset)


def rows_sq_norm(rows: Tensor, scratch: Tensor, owner: Tensor, sq_total: Tensor, offset: int = 0) -> None:
    """``sq_total += Σ ‖scratch[row]‖²`` over the rows owned by this part's positions (one
    launch; after every :func:`scatter_rows` of the step, before any :func:`update_rows`)."""
    n, w = _table_shape(scratch, "scratch")
    _check_scratch(scratch, owner, n, w, scratch.device)
    k = _check_rows(rows, scratch.device, offset)
    _check_sq_total(sq_total, scratch.device)
    if k:
        _launch_rows_sq_norm(rows, scratch, owner, sq_total, k, n, w, offset)


def update_rows(rows: Tensor, p: Tensor, scratch: Tensor, owner: Tensor, state: dict[str, Tensor | None], rule: UpdateRule,
                *, offset: int = 0, t: Tensor | None = None, sq_total: Tensor | None = None) -> None:
    """Apply ``rule`` to the rows of ``p`` (N×W or N) owned by this part's positions, from their
    summed gradients in ``scratch``; zeroes those rows of ``scratch`` and ``owner`` (one launch).
    ``state``: the full-size tables acc/dacc/m/vel the rule needs (others ignored); ``t``: Adam's
    step count (0-dim float32, this step counted); ``sq_total``: Σ g² of the step (grad_cap > 0)."""
    n, w = _check_table(p, scratch, owner)
    k = _check_rows(rows, p.device, offset)
    tables = _check_state(state, rule, p)
    _check_step(rule, p.device, t, sq_total)
    if k:
        _launch_update_rows(rows, p, scratch, owner, _rule_pointers(p, tables, t, sq_total), k, n, w, offset, rule._kernel_args())


def dense_sq_norm(g: Tensor, sq_total: Tensor) -> None:
    """``sq_total += Σ g²`` over the flat dense gradient (one launch)."""
    _check_flat(g, "g")
    _check_sq_total(sq_total, g.device)
    if g.numel():
        _dense_sq_norm_kernel[(triton.cdiv(g.numel(), _DENSE_BLOCK),)](g, sq_total, g.numel(), BLOCK=_DENSE_BLOCK)


def dense_update(p: Tensor, g: Tensor, state: dict[str, Tensor | None], rule: UpdateRule,
                 *, t: Tensor | None = None, sq_total: Tensor | None = None) -> None:
    """Apply ``rule`` to the whole flat buffer ``p`` from its gradient ``g`` (same size; left
    unchanged) and its full-size ``state`` tables (one launch). ``t``, ``sq_total``: as in
    :func:`update_rows`."""
    _check_flat(p, "p")
    _check_float(g, "g", p.device, p.numel())
    if p.numel() and g.data_ptr() == p.data_ptr():
        raise ValueError("g must not be the parameter itself")
    tables = _check_state(state, rule, p)
    _check_step(rule, p.device, t, sq_total)
    if p.numel():
        _launch_dense_update(p, g, _rule_pointers(p, tables, t, sq_total), rule._kernel_args())


# ---------------------------------------------------------------------------------------- bound


def _check_device(device: torch.device) -> None:
    why = triton_unavailable(device)
    if why is not None:
        raise ValueError(f"the Triton optimiser kernels cannot run on {device}: {why}")


class TritonTableUpdate:
    """The update of one item table ``p`` (N×W, or N for a bias table) with its full-size
    ``state`` tables (``acc``, ``dacc``, ``m``, ``vel``; None or absent where the method keeps
    none; other keys ignored), a zeroed float32 ``scratch`` table like ``p`` and a zeroed int32
    ``owner`` table of N entries (both zero again after every step), bound and checked once;
    each call checks only what changes. The rule's constants are those of :class:`UpdateRule`.

    A step, for every part (rows, g) of the table's gradient with ``offset`` = the positions of
    the earlier parts: :meth:`scatter`; then, with grad_cap > 0 and ``sq_total`` zeroed,
    :meth:`add_sq_norm` for every part of every table and for the dense buffer; then
    :meth:`update` for every part."""

    def __init__(self, p: Tensor, state: dict[str, Tensor | None], scratch: Tensor, owner: Tensor, *, method: str, lr: float,
                 momentum: float = 0.0, lmbd: float = 0.0, decay: float = 0.0, beta1: float = 0.0, eps: float = 1e-6,
                 grad_cap: float = 0.0) -> None:
        self.rule = UpdateRule(method, lr, momentum=momentum, lmbd=lmbd, decay=decay, beta1=beta1, eps=eps, grad_cap=grad_cap)
        self.n_rows, self.width = _check_table(p, scratch, owner)
        _check_device(p.device)
        self.p, self.scratch, self.owner = p, scratch, owner
        self.state = _check_state(state, self.rule, p)
        self._args = self.rule._kernel_args()

    def scatter(self, rows: Tensor, g: Tensor, offset: int = 0, bias: tuple[TritonTableUpdate, Tensor] | None = None,
                second: tuple[Tensor, Tensor] | None = None) -> None:
        """Add this part's gradient rows ``g`` (K×W, or K) at ``rows`` (K) into the scratch table
        — and, in the same launch, those of a ``second`` part (rows, g) whose positions follow.
        ``bias``: a bias table (N) whose gradient ``g_b`` has the rows of the last part, updated
        with this table in the same launches (its own owner table is not used): (its update, g_b)."""
        k = _check_rows(rows, self.p.device, offset)
        _check_grad_rows(g, k, self.width, self.p.device)
        if second is not None:
            k2 = _check_rows(second[0], self.p.device, offset + k)
            _check_grad_rows(second[1], k2, self.width, self.p.device)
            _check_same_dtype(rows, second[0])
        if bias is not None:
            self._check_bias(bias[0])
            _check_grad_rows(bias[1], k if second is None else second[0].shape[0], 1, self.p.device)
        if k or second is not None:
            _launch_scatter(rows, g, self.scratch, self.owner, k, self.n_rows, self.width, offset,
                            None if bias is None else (bias[1], bias[0].scratch), second)

    def add_sq_norm(self, rows: Tensor, sq_total: Tensor, offset: int = 0, bias: TritonTableUpdate | None = None,
                    second: Tensor | None = None) -> None:
        """Add the squared norm of the summed rows this part (and a ``second`` part's ``rows``)
        owns to ``sq_total`` (grad_cap), and of the riding ``bias`` table's (see :meth:`scatter`)."""
        k = _check_rows(rows, self.p.device, offset)
        _check_sq_total(sq_total, self.p.device)
        self._check_second(second, offset + k, rows)
        if bias is not None:
            self._check_bias(bias)
        if k or second is not None:
            _launch_rows_sq_norm(rows, self.scratch, self.owner, sq_total, k, self.n_rows, self.width, offset,
                                 None if bias is None else bias.scratch, second)

    def update(self, rows: Tensor, offset: int = 0, t: Tensor | None = None, sq_total: Tensor | None = None,
               bias: TritonTableUpdate | None = None, second: Tensor | None = None) -> None:
        """Update the rows this part (and a ``second`` part's ``rows``) owns, zeroing their scratch
        and owner entries, and those of the riding ``bias`` table (see :meth:`scatter`). ``t``:
        Adam's step count, this step counted; ``sq_total``: the step's Σ g² (grad_cap > 0)."""
        k = _check_rows(rows, self.p.device, offset)
        _check_step(self.rule, self.p.device, t, sq_total)
        self._check_second(second, offset + k, rows)
        if bias is not None:
            self._check_bias(bias)
        if k or second is not None:
            riding = None if bias is None else [bias.p, bias.scratch, *_rule_pointers(bias.p, bias.state, None, None)[:4]]
            _launch_update_rows(rows, self.p, self.scratch, self.owner, _rule_pointers(self.p, self.state, t, sq_total), k,
                                self.n_rows, self.width, offset, self._args, riding, second)

    def _check_second(self, second: Tensor | None, offset: int, rows: Tensor) -> None:
        if second is not None:
            _check_rows(second, self.p.device, offset)
            _check_same_dtype(rows, second)

    def _check_bias(self, bias: TritonTableUpdate) -> None:
        if not isinstance(bias, TritonTableUpdate) or bias.width != 1 or bias.n_rows != self.n_rows or bias.rule != self.rule:
            raise ValueError("bias must be the update of a bias table (N) with this table's rows and rule")


class TritonDenseUpdate:
    """The update of the flat dense buffer ``p`` (contiguous float32, any shape, read flat) with
    its full-size ``state`` tables, bound and checked once (the rule's constants: those of
    :class:`UpdateRule`)."""

    def __init__(self, p: Tensor, state: dict[str, Tensor | None], *, method: str, lr: float, momentum: float = 0.0,
                 lmbd: float = 0.0, decay: float = 0.0, beta1: float = 0.0, eps: float = 1e-6, grad_cap: float = 0.0) -> None:
        self.rule = UpdateRule(method, lr, momentum=momentum, lmbd=lmbd, decay=decay, beta1=beta1, eps=eps, grad_cap=grad_cap)
        _check_flat(p, "p")
        _check_device(p.device)
        self.p = p
        self.state = _check_state(state, self.rule, p)
        self._args = self.rule._kernel_args()

    def add_sq_norm(self, g: Tensor, sq_total: Tensor) -> None:
        """Add Σ g² of the dense gradient ``g`` to ``sq_total`` (grad_cap)."""
        _check_float(g, "g", self.p.device, self.p.numel())
        dense_sq_norm(g, sq_total)

    def update(self, g: Tensor, t: Tensor | None = None, sq_total: Tensor | None = None) -> None:
        """Update the whole buffer from ``g`` (same size, left unchanged)."""
        _check_float(g, "g", self.p.device, self.p.numel())
        _check_step(self.rule, self.p.device, t, sq_total)
        if self.p.numel():
            _launch_dense_update(self.p, g, _rule_pointers(self.p, self.state, t, sq_total), self._args)
