"""Fused Triton kernels for one GRU layer's elementwise arithmetic, forward and backward.

The same split as :class:`gru4rec.training.cell.FusedGRUCell` (whose CPU kernels are in
``cpu_kernels.c``): the matrix products stay torch (cuBLAS), and everything between them is one
launch. For one layer of n units and B rows (layouts: ``v`` and dL/dv are [candidate | reset |
update], B × 3n; ``rz`` is [reset | update], B × 2n; f = the candidate activation)::

    rz = torch.addmm(v[:, n:], h, Wrz)
    gru_gates(rz, h, hr)                           rz ← σ(rz) in place;  hr = h ⊙ r
    c = torch.addmm(v[:, :n], hr, Wh)
    gru_output(c, h, rz, mask, out, act)           c ← f(c) in place;  out = lerp(h, c, z) ⊙ mask

    gru_backward_out(d, mask, rz, c, h, d_v, g_bh, act)
                                                   d ← d ⊙ mask;  d_c = d ⊙ z ⊙ f'(c);
                                                   d_z = d ⊙ (c − h) ⊙ z(1 − z);
                                                   g_bh[:n] = Σ_b d_c,  g_bh[2n:] = Σ_b d_z
    dhr = torch.mm(d_v[:, :n], Wh.t())
    gru_backward_reset(dhr, h, rz, d_v, g_bh)      d_r = dhr ⊙ h ⊙ r(1 − r);  g_bh[n:2n] = Σ_b d_r

Four launches per layer and step. f' is taken from the output c, as
:meth:`gru4rec.config.activations.Activation.derivative` does. The column sums (the bias gradient) use
no atomics: each program owns a block of columns and walks down the B rows, so they come out the
same on every run (they add in another order than ``torch.sum``: equal to float32 round-off).

Every tensor is float32 and is addressed through its own strides (a column slice of a wider
tensor, a slice of a flat gradient buffer are fine); outputs are the caller's buffers, so that a
CUDA graph can capture the calls. The candidate activation is a constexpr code with two float
parameters, from :func:`activation_code`. On CPU tensors the kernels run only under Triton's
interpreter (``TRITON_INTERPRET=1``, :mod:`gru4rec.kernels.triton_support`), which is how they
are tested without a GPU. The block sizes are not tuned yet.
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gru4rec.kernels.triton_activations import (
    ACT_ELU,
    ACT_LEAKY,
    ACT_LINEAR,
    ACT_RELU,
    ACT_SELU,
    ACT_TANH,
    activate,
    activation_args,
    activation_code,
    sigmoid,
    slope,
)
from gru4rec.kernels.triton_support import interpreting

__all__ = [
    "ACT_ELU",
    "ACT_LEAKY",
    "ACT_LINEAR",
    "ACT_RELU",
    "ACT_SELU",
    "ACT_TANH",
    "activation_code",
    "gru_backward_out",
    "gru_backward_reset",
    "gru_gates",
    "gru_output",
]

# Tiles. Forward: a 2-D grid of BLOCK_B × BLOCK_N tiles. Backward: one program per BLOCK_N
# columns, walking down the rows BLOCK_B at a time (the column sums stay in registers).
_FWD_BLOCK_B, _FWD_BLOCK_N = 16, 64
_BWD_BLOCK_B, _BWD_BLOCK_N = 32, 32


@triton.jit
def _lerp(a, b, w):
    """torch.lerp(a, b, w): a + w(b − a) for |w| < 0.5, b − (b − a)(1 − w) otherwise."""
    diff = b - a
    return tl.where(tl.abs(w) < 0.5, a + w * diff, b - diff * (1.0 - w))


# ---------------------------------------------------------------------------------------------
# Kernels. s_*0 / s_*1: row and column strides of each tensor (in elements).


@triton.jit
def _gru_gates_kernel(rz_ptr, s_rz0, s_rz1, h_ptr, s_h0, s_h1, hr_ptr, s_hr0, s_hr1, B, n,
                      BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rw, cl = rows[:, None], cols[None, :]
    ok = (rw < B) & (cl < n)
    r_ptrs = rz_ptr + rw * s_rz0 + cl * s_rz1
    z_ptrs = r_ptrs + n * s_rz1
    r = sigmoid(tl.load(r_ptrs, mask=ok, other=0.0))
    z = sigmoid(tl.load(z_ptrs, mask=ok, other=0.0))
    h = tl.load(h_ptr + rw * s_h0 + cl * s_h1, mask=ok, other=0.0)
    tl.store(r_ptrs, r, mask=ok)
    tl.store(z_ptrs, z, mask=ok)
    tl.store(hr_ptr + rw * s_hr0 + cl * s_hr1, h * r, mask=ok)


@triton.jit
def _gru_output_kernel(c_ptr, s_c0, s_c1, h_ptr, s_h0, s_h1, rz_ptr, s_rz0, s_rz1, m_ptr, s_m0, s_m1,
                       out_ptr, s_o0, s_o1, B, n, p0, p1,
                       ACT: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rw, cl = rows[:, None], cols[None, :]
    ok = (rw < B) & (cl < n)
    c_ptrs = c_ptr + rw * s_c0 + cl * s_c1
    c = activate(tl.load(c_ptrs, mask=ok, other=0.0), ACT, p0, p1)
    h = tl.load(h_ptr + rw * s_h0 + cl * s_h1, mask=ok, other=0.0)
    z = tl.load(rz_ptr + rw * s_rz0 + (cl + n) * s_rz1, mask=ok, other=0.0)
    out = _lerp(h, c, z)
    if HAS_MASK:
        out = out * tl.load(m_ptr + rw * s_m0 + cl * s_m1, mask=ok, other=0.0)
    tl.store(c_ptrs, c, mask=ok)
    tl.store(out_ptr + rw * s_o0 + cl * s_o1, out, mask=ok)


@triton.jit
def _gru_backward_out_kernel(d_ptr, s_d0, s_d1, m_ptr, s_m0, s_m1, rz_ptr, s_rz0, s_rz1, c_ptr, s_c0, s_c1,
                             h_ptr, s_h0, s_h1, dv_ptr, s_dv0, s_dv1, g_ptr, s_g, B, n, p0, p1,
                             ACT: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cl = cols[None, :]
    col_ok = cols < n
    sum_c = tl.zeros((BLOCK_N,), dtype=tl.float32)
    sum_z = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        rw = (b0 + tl.arange(0, BLOCK_B))[:, None]
        ok = (rw < B) & (cl < n)
        d = tl.load(d_ptr + rw * s_d0 + cl * s_d1, mask=ok, other=0.0)
        if HAS_MASK:
            d = d * tl.load(m_ptr + rw * s_m0 + cl * s_m1, mask=ok, other=0.0)
        z = tl.load(rz_ptr + rw * s_rz0 + (cl + n) * s_rz1, mask=ok, other=0.0)
        c = tl.load(c_ptr + rw * s_c0 + cl * s_c1, mask=ok, other=0.0)
        h = tl.load(h_ptr + rw * s_h0 + cl * s_h1, mask=ok, other=0.0)
        d_c = d * z * slope(c, ACT, p0, p1)
        d_z = (d * (c - h)) * (z * (1.0 - z))
        dv_ptrs = dv_ptr + rw * s_dv0 + cl * s_dv1
        tl.store(dv_ptrs, d_c, mask=ok)
        tl.store(dv_ptrs + 2 * n * s_dv1, d_z, mask=ok)
        sum_c += tl.sum(tl.where(ok, d_c, 0.0), axis=0)
        sum_z += tl.sum(tl.where(ok, d_z, 0.0), axis=0)
    tl.store(g_ptr + cols * s_g, sum_c, mask=col_ok)
    tl.store(g_ptr + (cols + 2 * n) * s_g, sum_z, mask=col_ok)


@triton.jit
def _gru_backward_reset_kernel(t_ptr, s_t0, s_t1, h_ptr, s_h0, s_h1, rz_ptr, s_rz0, s_rz1,
                               dv_ptr, s_dv0, s_dv1, g_ptr, s_g, B, n,
                               BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cl = cols[None, :]
    col_ok = cols < n
    sum_r = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        rw = (b0 + tl.arange(0, BLOCK_B))[:, None]
        ok = (rw < B) & (cl < n)
        t = tl.load(t_ptr + rw * s_t0 + cl * s_t1, mask=ok, other=0.0)
        h = tl.load(h_ptr + rw * s_h0 + cl * s_h1, mask=ok, other=0.0)
        r = tl.load(rz_ptr + rw * s_rz0 + cl * s_rz1, mask=ok, other=0.0)
        d_r = (t * h) * (r * (1.0 - r))
        tl.store(dv_ptr + rw * s_dv0 + (cl + n) * s_dv1, d_r, mask=ok)
        sum_r += tl.sum(tl.where(ok, d_r, 0.0), axis=0)
    tl.store(g_ptr + (cols + n) * s_g, sum_r, mask=col_ok)


# ---------------------------------------------------------------------------------------------
# Launchers: check the arguments (ValueError naming the one at fault), then one launch each.


def _check(t: Any, name: str, shape: tuple[int, ...], device: torch.device) -> Tensor:
    """``t`` is a float32 tensor of ``shape`` on ``device``; else ValueError naming it."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a float32 tensor of shape {shape}, got {type(t).__name__}")
    if t.dtype != torch.float32 or tuple(t.shape) != shape or t.device != device:
        raise ValueError(f"{name} must be a float32 tensor of shape {shape} on {device}, got {t.dtype} {tuple(t.shape)} on {t.device}")
    return t


def _state(h: Any) -> tuple[int, int, torch.device]:
    """(B, n, device) of the state ``h`` (a float32 B × n matrix), which sets the others' shapes."""
    if not isinstance(h, Tensor) or h.dim() != 2 or h.dtype != torch.float32:
        got = f"{h.dtype} {tuple(h.shape)}" if isinstance(h, Tensor) else type(h).__name__
        raise ValueError(f"h must be a float32 B × n matrix, got {got}")
    if h.device.type == "cpu" and not interpreting():
        raise ValueError("h is on the CPU, where the Triton kernels run only in the interpreter (TRITON_INTERPRET=1)")
    return h.shape[0], h.shape[1], h.device


def _fwd_grid(B: int, n: int) -> tuple[int, int]:
    return triton.cdiv(B, _FWD_BLOCK_B), triton.cdiv(n, _FWD_BLOCK_N)


def gru_gates(rz: Tensor, h: Tensor, hr: Tensor) -> Tensor:
    """``rz`` (B × 2n reset and update pre-activations) becomes σ(rz) in place; ``hr`` (B × n)
    receives h ⊙ r. Returns ``hr``."""
    B, n, dev = _state(h)
    _check(rz, "rz", (B, 2 * n), dev)
    _check(hr, "hr", (B, n), dev)
    if B and n:
        _gru_gates_kernel[_fwd_grid(B, n)](rz, *rz.stride(), h, *h.stride(), hr, *hr.stride(), B, n,
                                           BLOCK_B=_FWD_BLOCK_B, BLOCK_N=_FWD_BLOCK_N)
    return hr


def gru_output(c: Tensor, h: Tensor, rz: Tensor, mask: Tensor | None, out: Tensor, act: Any) -> Tensor:
    """``c`` (B × n candidate pre-activations) becomes f(c) in place; ``out`` (B × n) receives
    the layer's output lerp(h, c, z) (times the dropout ``mask`` unless None). Returns ``out``."""
    B, n, dev = _state(h)
    code, p0, p1 = activation_args(act)
    _check(c, "c", (B, n), dev)
    _check(rz, "rz", (B, 2 * n), dev)
    _check(out, "out", (B, n), dev)
    m = h if mask is None else _check(mask, "mask", (B, n), dev)
    if B and n:
        _gru_output_kernel[_fwd_grid(B, n)](c, *c.stride(), h, *h.stride(), rz, *rz.stride(), m, *m.stride(),
                                            out, *out.stride(), B, n, p0, p1, ACT=code, HAS_MASK=mask is not None,
                                            BLOCK_B=_FWD_BLOCK_B, BLOCK_N=_FWD_BLOCK_N)
    return out


def gru_backward_out(d: Tensor, mask: Tensor | None, rz: Tensor, c: Tensor, h: Tensor, d_v: Tensor, g_bh: Tensor, act: Any) -> Tensor:
    """From ``d`` = dL/d(out) (B × n; times the dropout ``mask`` unless None): the candidate and
    update parts of ``d_v`` = dL/dv (B × 3n), d_c = d ⊙ z ⊙ f'(c) and d_z = d ⊙ (c − h) ⊙ z(1 − z),
    and their column sums into ``g_bh[:n]`` and ``g_bh[2n:]`` (``g_bh``: 3n). The reset parts
    are :func:`gru_backward_reset`'s. Returns ``d_v``."""
    B, n, dev = _state(h)
    code, p0, p1 = activation_args(act)
    _check(d, "d", (B, n), dev)
    _check(rz, "rz", (B, 2 * n), dev)
    _check(c, "c", (B, n), dev)
    _check(d_v, "d_v", (B, 3 * n), dev)
    _check(g_bh, "g_bh", (3 * n,), dev)
    m = h if mask is None else _check(mask, "mask", (B, n), dev)
    if n:
        _gru_backward_out_kernel[(triton.cdiv(n, _BWD_BLOCK_N),)](
            d, *d.stride(), m, *m.stride(), rz, *rz.stride(), c, *c.stride(), h, *h.stride(),
            d_v, *d_v.stride(), g_bh, g_bh.stride(0), B, n, p0, p1,
            ACT=code, HAS_MASK=mask is not None, BLOCK_B=_BWD_BLOCK_B, BLOCK_N=_BWD_BLOCK_N)
    return d_v


def gru_backward_reset(dhr: Tensor, h: Tensor, rz: Tensor, d_v: Tensor, g_bh: Tensor) -> Tensor:
    """From ``dhr`` = dL/d(h ⊙ r) = d_v[:, :n]·Whᵀ (B × n): the reset part of ``d_v``,
    d_r = dhr ⊙ h ⊙ r(1 − r), into ``d_v[:, n:2n]`` and its column sums into ``g_bh[n:2n]``.
    Returns ``d_v``."""
    B, n, dev = _state(h)
    _check(dhr, "dhr", (B, n), dev)
    _check(rz, "rz", (B, 2 * n), dev)
    _check(d_v, "d_v", (B, 3 * n), dev)
    _check(g_bh, "g_bh", (3 * n,), dev)
    if n:
        _gru_backward_reset_kernel[(triton.cdiv(n, _BWD_BLOCK_N),)](
            dhr, *dhr.stride(), h, *h.stride(), rz, *rz.stride(), d_v, *d_v.stride(), g_bh, g_bh.stride(0), B, n,
            BLOCK_B=_BWD_BLOCK_B, BLOCK_N=_BWD_BLOCK_N)
    return d_v
