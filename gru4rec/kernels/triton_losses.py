"""GRU4Rec's six sampled losses and their gradients dL/dscores, fused in Triton (GPU fast path).

The training step scores B rows against C = B + S columns (row i's positive is column i) and
needs the loss and dL/dx of the B×C score matrix x. ``gru4rec.training.losses._loss_grad``
writes them as a dozen PyTorch operations, each a pass over the B×C matrix; here one program per
row streams its row through column blocks: one or two reduction passes (an online softmax:
running max m and running sums rescaled by exp(m_old − m_new) whenever the max grows), then one
gradient pass that writes the gradient row (in place over x if asked: each block is read before
it is written, and the positive score is read first). A second, one-program kernel sums the
weighted per-row losses in a fixed order (deterministic, no atomics).

Notation, for row i: v_j = col_valid_j, n = n_cols, w_i = row_valid_i / batch_size, ε = 1e-24;
every loss is L = Σ_i w_i·L_i, and the gradient row is w_i·dL_i/dx_i·.

Cross-entropy and xe_logit (the caller has added MASK = −1e30 to the masked columns of x, so
exp() underflows to 0 there): p = softmax(x_i·); with label smoothing e, share = e/(n − 1) and
targets t_ij = (1 − share·n)·[j = i] + share·v_j,

    L_i = Σ_j t_ij·nll_ij,   nll_ij = −log(p_ij + ε)  (cross-entropy)  or  −log p_ij  (xe_logit)
    dL_i/dx_ik = p_ik·Σ_j t_ij·a_ij − t_ik·a_ik,   a = p/(p + ε)  (a = 1 for xe_logit).

The other losses apply the final activation first, r = f(x) (linear, relu, tanh, leaky-A, elu-A,
selu-S-A), and chain f'(x), taken from the output r (``Activation.derivative``): dL/dx = f'·dL/dr.
Let pos = r_ii, σ the logistic function, and s_ij the softmax of r_ij over the row's negatives
(v_j = 1 and j ≠ i; s = 0 elsewhere).

* bpr-max: with σ_j = σ(pos − r_ij), S = Σ_j s_j·σ_j, R = Σ_j s_j·r_j²,
  L_i = −log(S + ε) + bpreg·R;
  dL_i/dr_k = s_k·(S − σ_k²)/(S + ε) + bpreg·s_k·(r_k·(r_k + 2) − R)  (k ≠ i),
  dL_i/dr_i = (Σ_j s_j·σ_j² − S)/(S + ε).
* top1-max: with q_j = σ(r_j − pos), q2_j = σ(r_j²), t_j = q_j + q2_j, T = Σ_j s_j·t_j,
  L_i = T;  dL_i/dr_k = s_k·(t_k − T + q_k(1 − q_k) + 2·r_k·q2_k(1 − q2_k))  (k ≠ i),
  dL_i/dr_i = −Σ_j s_j·q_j(1 − q_j).
* bpr: L_i = Σ_j v_j·softplus(r_j − pos);  dL_i/dr_k = v_k·q_k − [k = i]·Σ_j v_j·q_j.
* top1: L_i = (Σ_j v_j·(q_j + q2_j) − σ(pos²))/n;
  n·dL_i/dr_k = v_k·(q_k(1 − q_k) + 2·r_k·q2_k(1 − q2_k))
               − [k = i]·(Σ_j v_j·q_j(1 − q_j) + 2·pos·σ(pos²)(1 − σ(pos²))).

All the row sums of bpr-max and top1-max are accumulated with the online max of the negatives'
softmax, so those losses take one reduction pass; cross-entropy with label smoothing takes two
(its −log(p + ε) needs the final max and sum), the others one.

The kernels run inside a captured CUDA graph: no host sync (n_cols is read by the kernel), grids
from shapes only, no allocation (the caller gives the gradient, per-row scratch and loss outputs).
Under ``TRITON_INTERPRET=1`` they run on CPU tensors (the tests).
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gru4rec.config.values import LOSSES, SOFTMAX_LOSSES
from gru4rec.kernels.triton_activations import activate, activation_args, sigmoid, slope
from gru4rec.kernels.triton_support import require

__all__ = ["EPS", "LOSSES", "MASK", "loss_grad"]

#: The ε of the log terms, as in ``gru4rec.training.losses`` (the tests hold them equal).
EPS = 1e-24
#: The logit the caller adds to masked columns of the cross-entropy losses (documentation only:
#: the kernels rely on exp(MASK − max) underflowing to 0, never on the value itself).
MASK = -1e30

_MAX_BLOCK = 2048  # columns per block: big enough to keep a row's loads wide, small enough for registers

_EPS = tl.constexpr(EPS)
# Floor of the running max over the negatives: finite (unlike −inf), so a block without any
# negative leaves exp(m_old − m_new) = exp(0) = 1 instead of exp(−inf + inf) = NaN.
_FLOOR = tl.constexpr(-1e30)


@triton.jit
def _row_start(x_ptr, grad_ptr, row_valid_ptr, stride_x, stride_g, inv_batch, BLOCK: tl.constexpr):
    """This program's row, its score and gradient rows, the block's column offsets and the
    row's weight w = row_valid / batch_size."""
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    g_row = grad_ptr + row.to(tl.int64) * stride_g
    return row, x_row, g_row, tl.arange(0, BLOCK), tl.load(row_valid_ptr + row) * inv_batch


@triton.jit
def _xe_rows_kernel(
    x_ptr, col_valid_ptr, row_valid_ptr, n_cols_ptr, grad_ptr, per_row_ptr,
    C, stride_x, stride_g, inv_batch, smoothing,
    LOGIT: tl.constexpr, SMOOTH: tl.constexpr, BLOCK: tl.constexpr,
):
    """Cross-entropy (LOGIT=False) or xe_logit of one row, with label smoothing when SMOOTH."""
    row, x_row, g_row, offs, w = _row_start(x_ptr, grad_ptr, row_valid_ptr, stride_x, stride_g, inv_batch, BLOCK)
    x_pos = tl.load(x_row + row)  # before the gradient pass may overwrite it (in place)

    # Pass 1: running max m and Σ exp(x − m); for smoothing also Σ v and (xe_logit) Σ v·x.
    m = float("-inf")
    total = 0.0
    sum_v = 0.0
    sum_vx = 0.0
    for start in range(0, C, BLOCK):
        cols = start + offs
        inb = cols < C
        xb = tl.load(x_row + cols, mask=inb, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(xb, axis=0))  # finite: every block has an in-bounds column
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(xb - m_new), axis=0)
        m = m_new
        if SMOOTH:
            v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
            sum_v += tl.sum(v, axis=0)
            if LOGIT:
                sum_vx += tl.sum(tl.where(v != 0.0, xb, 0.0), axis=0)  # out-of-bounds xb is −inf: never × 0
    log_total = tl.log(total)
    inv_total = 1.0 / total

    p_pos = tl.exp(x_pos - m) * inv_total
    if LOGIT:
        nll_pos = m + log_total - x_pos
        a_pos = 1.0
    else:
        nll_pos = -tl.log(p_pos + _EPS)
        a_pos = p_pos / (p_pos + _EPS)

    if SMOOTH:
        n = tl.load(n_cols_ptr)
        share = smoothing / (n - 1.0)
        t_pos = 1.0 - share * n
        if LOGIT:
            # Σ_j v_j·(−log p_j) = Σ_j v_j·(m + log Σ − x_j); a = 1 so Σ_j t_j·a_j = t_pos + share·Σ v.
            sum_v_nll = (m + log_total) * sum_v - sum_vx
            sum_ta = t_pos + share * sum_v
        else:
            # Pass 2: −log(p + ε) and p/(p + ε) need the final m and Σ.
            sum_v_nll = 0.0
            sum_va = 0.0
            for start in range(0, C, BLOCK):
                cols = start + offs
                inb = cols < C
                xb = tl.load(x_row + cols, mask=inb, other=float("-inf"))
                v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
                p = tl.exp(xb - m) * inv_total
                valid = v != 0.0
                sum_v_nll += tl.sum(tl.where(valid, -tl.log(p + _EPS), 0.0), axis=0)
                sum_va += tl.sum(tl.where(valid, p / (p + _EPS), 0.0), axis=0)
            sum_ta = t_pos * a_pos + share * sum_va
        loss_row = t_pos * nll_pos + share * sum_v_nll
    else:
        share = 0.0
        t_pos = 1.0
        sum_ta = a_pos
        loss_row = nll_pos
    tl.store(per_row_ptr + row, tl.where(w != 0.0, loss_row * w, 0.0))

    # Gradient pass: w·(p_k·Σ_j t_j·a_j − t_k·a_k).
    for start in range(0, C, BLOCK):
        cols = start + offs
        inb = cols < C
        xb = tl.load(x_row + cols, mask=inb, other=float("-inf"))
        p = tl.exp(xb - m) * inv_total
        is_pos = cols == row
        ta = tl.where(is_pos, t_pos * a_pos, 0.0)
        if SMOOTH:
            v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
            if LOGIT:
                a = tl.full((BLOCK,), 1.0, tl.float32)
            else:
                a = p / (p + _EPS)
            ta += tl.where(v != 0.0, share * a, 0.0)
        g = (p * sum_ta - ta) * w
        tl.store(g_row + cols, tl.where(w != 0.0, g, 0.0), mask=inb)


@triton.jit
def _rank_max_rows_kernel(
    x_ptr, col_valid_ptr, row_valid_ptr, grad_ptr, per_row_ptr,
    C, stride_x, stride_g, inv_batch, bpreg, p0, p1,
    TOP1: tl.constexpr, BPREG: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr,
):
    """bpr-max (TOP1=False; its score regularisation when BPREG) or top1-max of one row."""
    row, x_row, g_row, offs, w = _row_start(x_ptr, grad_ptr, row_valid_ptr, stride_x, stride_g, inv_batch, BLOCK)
    pos = activate(tl.load(x_row + row), ACT, p0, p1)

    # One pass: the negatives' running max m, Z = Σ e and the e-weighted sums (e = exp(r − m)),
    # all rescaled together when m grows. bpr-max: A1 = Σ e·σ, A2 = Σ e·σ², A3 = Σ e·r²;
    # top1-max: A1 = Σ e·t, A2 = Σ e·q(1 − q).
    m = _FLOOR
    z = 0.0
    acc1 = 0.0
    acc2 = 0.0
    acc3 = 0.0
    for start in range(0, C, BLOCK):
        cols = start + offs
        inb = cols < C
        v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
        neg = (v != 0.0) & (cols != row)
        r = activate(tl.load(x_row + cols, mask=inb, other=0.0), ACT, p0, p1)
        m_new = tl.maximum(m, tl.max(tl.where(neg, r, _FLOOR), axis=0))
        rescale = tl.exp(m - m_new)
        # exp only of r − m_new ≤ 0: the other columns may lie above the negatives' max.
        e = tl.where(neg, tl.exp(tl.where(neg, r - m_new, 0.0)), 0.0)
        z = z * rescale + tl.sum(e, axis=0)
        if TOP1:
            q = sigmoid(r - pos)
            t = q + sigmoid(r * r)
            acc1 = acc1 * rescale + tl.sum(e * t, axis=0)
            acc2 = acc2 * rescale + tl.sum(e * q * (1.0 - q), axis=0)
        else:
            sig = sigmoid(pos - r)
            acc1 = acc1 * rescale + tl.sum(e * sig, axis=0)
            acc2 = acc2 * rescale + tl.sum(e * sig * sig, axis=0)
            if BPREG:
                acc3 = acc3 * rescale + tl.sum(e * r * r, axis=0)
        m = m_new
    inv_z = tl.where(z > 0.0, 1.0 / z, 0.0)  # z = 0 only for a row without negatives: s = 0, not NaN

    if TOP1:
        big_t = acc1 * inv_z
        loss_row = big_t
        d_pos = -acc2 * inv_z
    else:
        big_s = acc1 * inv_z
        inv_s = 1.0 / (big_s + _EPS)
        big_r = acc3 * inv_z
        loss_row = -tl.log(big_s + _EPS)
        if BPREG:
            loss_row += bpreg * big_r
        d_pos = (acc2 * inv_z - big_s) * inv_s
    tl.store(per_row_ptr + row, tl.where(w != 0.0, loss_row * w, 0.0))

    # Gradient pass: dL/dr from the row's sums, times w·f'.
    for start in range(0, C, BLOCK):
        cols = start + offs
        inb = cols < C
        v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
        is_pos = cols == row
        neg = (v != 0.0) & (cols != row)
        r = activate(tl.load(x_row + cols, mask=inb, other=0.0), ACT, p0, p1)
        s = tl.where(neg, tl.exp(tl.where(neg, r - m, 0.0)), 0.0) * inv_z
        if TOP1:
            q = sigmoid(r - pos)
            q2 = sigmoid(r * r)
            d_r = s * (q + q2 - big_t + q * (1.0 - q) + 2.0 * r * q2 * (1.0 - q2))
        else:
            sig = sigmoid(pos - r)
            d_r = s * (big_s - sig * sig) * inv_s
            if BPREG:
                d_r += bpreg * s * (r * (r + 2.0) - big_r)
        d_r = tl.where(is_pos, d_pos, d_r)
        g = d_r * w * slope(r, ACT, p0, p1)
        tl.store(g_row + cols, tl.where(w != 0.0, g, 0.0), mask=inb)


@triton.jit
def _pairwise_rows_kernel(
    x_ptr, col_valid_ptr, row_valid_ptr, n_cols_ptr, grad_ptr, per_row_ptr,
    C, stride_x, stride_g, inv_batch, p0, p1,
    TOP1: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr,
):
    """bpr (TOP1=False) or top1 of one row: sums over the valid columns (the positive included)."""
    row, x_row, g_row, offs, w = _row_start(x_ptr, grad_ptr, row_valid_ptr, stride_x, stride_g, inv_batch, BLOCK)
    pos = activate(tl.load(x_row + row), ACT, p0, p1)

    # One pass. bpr: acc1 = Σ v·softplus(r − pos), acc2 = Σ v·q; top1: acc1 = Σ v·(q + q2),
    # acc2 = Σ v·q(1 − q).
    acc1 = 0.0
    acc2 = 0.0
    for start in range(0, C, BLOCK):
        cols = start + offs
        inb = cols < C
        v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
        r = activate(tl.load(x_row + cols, mask=inb, other=0.0), ACT, p0, p1)
        diff = r - pos
        q = sigmoid(diff)
        if TOP1:
            acc1 += tl.sum(v * (q + sigmoid(r * r)), axis=0)
            acc2 += tl.sum(v * q * (1.0 - q), axis=0)
        else:
            softplus = tl.maximum(diff, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(diff)))  # stable for any sign
            acc1 += tl.sum(v * softplus, axis=0)
            acc2 += tl.sum(v * q, axis=0)

    if TOP1:
        inv_n = 1.0 / tl.load(n_cols_ptr)
        q2_pos = sigmoid(pos * pos)
        loss_row = (acc1 - q2_pos) * inv_n
        d_pos_extra = acc2 + 2.0 * pos * q2_pos * (1.0 - q2_pos)
    else:
        inv_n = 1.0
        loss_row = acc1
        d_pos_extra = acc2
    tl.store(per_row_ptr + row, tl.where(w != 0.0, loss_row * w, 0.0))

    # Gradient pass: the column's own term, minus the row sum on the positive.
    for start in range(0, C, BLOCK):
        cols = start + offs
        inb = cols < C
        v = tl.load(col_valid_ptr + cols, mask=inb, other=0.0)
        r = activate(tl.load(x_row + cols, mask=inb, other=0.0), ACT, p0, p1)
        q = sigmoid(r - pos)
        if TOP1:
            q2 = sigmoid(r * r)
            d_r = v * (q * (1.0 - q) + 2.0 * r * q2 * (1.0 - q2))
        else:
            d_r = v * q
        d_r = tl.where(cols == row, d_r - d_pos_extra, d_r) * inv_n
        g = d_r * w * slope(r, ACT, p0, p1)
        tl.store(g_row + cols, tl.where(w != 0.0, g, 0.0), mask=inb)


@triton.jit
def _sum_kernel(per_row_ptr, loss_ptr, B, BLOCK: tl.constexpr):
    """loss = Σ per_row in one program, in a fixed order (deterministic, unlike atomics)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, B, BLOCK):
        acc += tl.load(per_row_ptr + start + offs, mask=start + offs < B, other=0.0)
    tl.store(loss_ptr, tl.sum(acc, axis=0).to(loss_ptr.dtype.element_ty))


# ------------------------------------------------------------------------------------ wrapper


def loss_grad(
    x: Tensor,
    col_valid: Tensor,
    row_valid: Tensor,
    n_cols: Tensor,
    *,
    loss: str,
    act: Any,
    bpreg: float,
    smoothing: float,
    inv_batch: float,
    grad: Tensor,
    per_row: Tensor,
    loss_out: Tensor,
    block: int | None = None,
) -> None:
    """The loss and dL/dx of the B×C float32 scores ``x`` (module docstring), in two launches.

    ``col_valid`` (C) and ``row_valid`` (B) are float 0/1 masks, ``n_cols`` a 0-dim float tensor
    (the number of valid columns, read on the device). For cross-entropy and xe_logit the caller
    has added MASK to the masked columns of ``x`` and ``act`` is ignored (it may be None);
    otherwise ``act`` is the elementwise final activation (or its :func:`activation_code`) and
    ``x`` is unmasked. ``bpreg`` counts for bpr-max only; ``smoothing`` (label smoothing, in
    [0, 1)) for the cross-entropy losses only. ``inv_batch`` is 1/batch_size.

    Writes dL/dx to ``grad`` (B×C; it may be ``x`` itself, but no other view overlapping it), the
    weighted per-row losses w_i·L_i to ``per_row`` (B) and their sum to ``loss_out`` (0-dim,
    float32 or float64: the epoch loop keeps its step losses in float64, and a float64 loss
    spares it a conversion kernel);
    inactive rows (row_valid 0) get a zero gradient row and a zero loss. ``block`` (a power of
    two) overrides the columns per block (tests); by default min(next power of two ≥ C, 2048).
    Raises ValueError for inputs of the wrong shape, dtype, device or layout, or bad constants.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {', '.join(LOSSES)}")
    require(x.dim() == 2, f"x must be B×C, got shape {tuple(x.shape)}")
    B, C = x.shape
    require(B >= 1 and C >= B, f"x must have C >= B >= 1 (row i's positive is column i), got {B}×{C}")
    device = x.device
    for name, t, shape in (
        ("x", x, (B, C)), ("col_valid", col_valid, (C,)), ("row_valid", row_valid, (B,)),
        ("n_cols", n_cols, ()), ("grad", grad, (B, C)), ("per_row", per_row, (B,)), ("loss_out", loss_out, ()),
    ):
        require(tuple(t.shape) == shape, f"{name} must have shape {shape}, got {tuple(t.shape)}")
        allowed = (torch.float32, torch.float64) if name == "loss_out" else (torch.float32,)
        require(t.dtype in allowed, f"{name} must be {' or '.join(str(a).removeprefix('torch.') for a in allowed)}, got {t.dtype}")
        require(t.device == device, f"{name} is on {t.device}, x on {device}")
        require(t.is_contiguous(), f"{name} must be contiguous")
    require(0.0 <= smoothing < 1.0, f"smoothing must be in [0, 1), got {smoothing!r}")
    require(bpreg >= 0.0, f"bpreg must be >= 0, got {bpreg!r}")
    require(inv_batch > 0.0, f"inv_batch must be > 0, got {inv_batch!r}")
    if block is None:
        block = min(max(triton.next_power_of_2(C), 16), _MAX_BLOCK)
    require(block >= 16 and block & (block - 1) == 0, f"block must be a power of two >= 16, got {block!r}")
    num_warps = 8 if block >= 2048 else 4
    common = dict(C=C, stride_x=x.stride(0), stride_g=grad.stride(0), inv_batch=float(inv_batch))

    grid = (B,)
    if loss in SOFTMAX_LOSSES:
        _xe_rows_kernel[grid](
            x, col_valid, row_valid, n_cols, grad, per_row, **common, smoothing=float(smoothing),
            LOGIT=loss == "xe_logit", SMOOTH=smoothing > 0.0, BLOCK=block, num_warps=num_warps,
        )
    else:
        require(smoothing == 0.0, f"label smoothing applies to the cross-entropy losses only, not to {loss!r}")
        if act is None:
            raise ValueError(f"loss {loss!r} needs its elementwise final activation (act)")
        code, p0, p1 = activation_args(act)
        if loss in ("bpr-max", "top1-max"):
            _rank_max_rows_kernel[grid](
                x, col_valid, row_valid, grad, per_row, **common, bpreg=float(bpreg), p0=p0, p1=p1,
                TOP1=loss == "top1-max", BPREG=loss == "bpr-max" and bpreg > 0.0, ACT=code, BLOCK=block,
                num_warps=num_warps,
            )
        else:
            _pairwise_rows_kernel[grid](
                x, col_valid, row_valid, n_cols, grad, per_row, **common, p0=p0, p1=p1,
                TOP1=loss == "top1", ACT=code, BLOCK=block, num_warps=num_warps,
            )
    _sum_kernel[(1,)](per_row, loss_out, B, BLOCK=min(max(triton.next_power_of_2(B), 16), 1024))
