"""The start of a training step in few Triton launches: the step's rows of the epoch schedule,
its score columns and their bias read through device counters in one; the dropped-out input rows
in another; and each dropout mask made from its uniform draws in one pass.

A replayed step (``gru4rec/kernels/gpu.py``) finds its schedule row ``t`` and its sample-store
row ``r`` in two device scalars. On PyTorch ops it then takes about a dozen small kernels to
gather the four schedule rows and the samples, concatenate the columns and their validity, count
the valid columns, gather and correct the columns' bias, and reset the hidden states of new
sessions. :func:`step_inputs` does all of it in one launch:

    inputs, targets, active = schedule rows t                                       B each
    cols      = [targets | store[r]]                                                C = B + S
    col_valid = [active | 1]                                                        C
    n_cols    = Σ active + S                                                        0-dim
    bias      = By[cols] − logQ[cols] (+ MASK where col_valid = 0, when asked)      C
    h        *= keep[t]      (the first layer's state; B×n)

The logQ terms are the in-batch ones for the first B columns and the sampled ones after them
(``gru4rec/training/sampling.py``). Everything is read and written on the device; the outputs
are the caller's buffers, so the launch is captured in the step's CUDA graph.

:func:`gather_rows` is ``table[rows] ⊙ mask`` (the input rows with embedding dropout) in one
pass instead of a gather and a product; :func:`dropout_threshold` turns a step's uniform draws u
into all of its inverted-dropout masks, (u ≥ p) / (1 − p) in place, in one pass (the embedding's
p before a split, the hidden layers' after it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gru4rec.kernels.triton_losses import MASK
from gru4rec.kernels.triton_support import require

__all__ = ["dropout_threshold", "gather_rows", "step_inputs"]

_BLOCK_C = 512  # score columns per program
_BLOCK_N = 64  # hidden units per inner block of the state reset


@triton.jit
def _step_inputs_kernel(
    s_inputs, s_targets, s_active, s_keep, stride_t, stride_keep, store, stride_store, t_ptr, r_ptr,
    by_ptr, lq_in_ptr, lq_s_ptr, inputs, targets, active, cols, col_valid, n_cols, bias, h_ptr, stride_h, B, S, n,
    HAS_LOGQ: tl.constexpr, MASK_IN_BIAS: tl.constexpr, HAS_H: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(t_ptr)
    r = tl.load(r_ptr)
    j = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    in_batch = j < B
    is_sample = (j >= B) & (j < B + S)
    # the column's item and validity: a target of the schedule row, or a sample of the store row
    target = tl.load(s_targets + t * stride_t + j, mask=in_batch, other=0)
    sample = tl.load(store + r * stride_store + (j - B), mask=is_sample, other=0)
    col = tl.where(in_batch, target, sample)
    valid = tl.where(in_batch, tl.load(s_active + t * stride_t + j, mask=in_batch, other=0.0), 1.0)
    live = in_batch | is_sample
    b = tl.load(by_ptr + col, mask=live, other=0.0)
    if HAS_LOGQ:
        b -= tl.where(in_batch, tl.load(lq_in_ptr + col, mask=in_batch, other=0.0), tl.load(lq_s_ptr + col, mask=is_sample, other=0.0))
    if MASK_IN_BIAS:
        b += (1.0 - valid) * MASK
    tl.store(cols + j, col, mask=live)
    tl.store(col_valid + j, valid, mask=live)
    tl.store(bias + j, b, mask=live)
    tl.store(targets + j, target, mask=in_batch)
    tl.store(active + j, valid, mask=in_batch)
    tl.store(inputs + j, tl.load(s_inputs + t * stride_t + j, mask=in_batch, other=0), mask=in_batch)
    if HAS_H:  # h[row] *= keep[row] for this program's rows of the batch
        keep = tl.load(s_keep + t * stride_keep + j, mask=in_batch, other=1.0)
        for k in range(0, n, BLOCK_N):
            units = k + tl.arange(0, BLOCK_N)
            at = h_ptr + j[:, None] * stride_h + units[None, :]
            ok = in_batch[:, None] & (units[None, :] < n)
            tl.store(at, tl.load(at, mask=ok, other=0.0) * keep[:, None], mask=ok)
    if pid == 0:  # the number of valid columns
        total = 0.0
        for k in range(0, B, BLOCK_B):
            rows = k + tl.arange(0, BLOCK_B)
            total += tl.sum(tl.load(s_active + t * stride_t + rows, mask=rows < B, other=0.0), axis=0)
        tl.store(n_cols, total + S)


def step_inputs(schedule_inputs: Tensor, schedule_targets: Tensor, schedule_active: Tensor, schedule_keep: Tensor,
                store: Tensor | None, t: Tensor, r: Tensor, by: Tensor, logq: tuple[Tensor, Tensor] | None, *,
                mask_in_bias: bool, inputs: Tensor, targets: Tensor, active: Tensor, cols: Tensor, col_valid: Tensor,
                n_cols: Tensor, bias: Tensor, hidden: Tensor | None) -> None:
    """Fill the step's buffers (module docstring) for schedule row ``t`` and store row ``r``
    (0-dim int64 device tensors). ``schedule_*``: the epoch's T×B tables (``keep`` T×B×1);
    ``store``: the sample store (R×S int64) or None without samples; ``by``: the bias table (N);
    ``logq``: (in-batch, sampled) terms over the items, or None; ``hidden``: the first layer's
    state (B×n, unit stride along n) to reset where ``keep`` is 0, or None."""
    T, B = schedule_inputs.shape
    S = 0 if store is None else store.shape[1]
    C = B + S
    device = by.device
    for name, x, dtype in (("schedule_inputs", schedule_inputs, torch.int64), ("schedule_targets", schedule_targets, torch.int64),
                           ("schedule_active", schedule_active, torch.float32), ("schedule_keep", schedule_keep, torch.float32)):
        require(x.dtype == dtype and x.device == device and x.shape[:2] == (T, B) and x[0].is_contiguous(),
              f"{name} must be a {dtype} T×B table on {device} with contiguous rows, got {x.dtype} {tuple(x.shape)}")
    require(schedule_targets.stride(0) == schedule_inputs.stride(0) == schedule_active.stride(0),
          "the schedule's inputs, targets and active tables must share their row stride")
    for name, x, n, dtype in (
        ("inputs", inputs, B, torch.int64),
        ("targets", targets, B, torch.int64),
        ("active", active, B, torch.float32),
        ("cols", cols, C, torch.int64),
        ("col_valid", col_valid, C, torch.float32),
        ("bias", bias, C, torch.float32),
    ):
        require(x.dtype == dtype and x.device == device and tuple(x.shape) == (n,) and x.is_contiguous(),
              f"{name} must be a contiguous {dtype} vector of {n} on {device}, got {x.dtype} {tuple(x.shape)}")
    require(n_cols.shape == () and n_cols.dtype == torch.float32, "n_cols must be a 0-dim float32 tensor")
    require(t.shape == () and r.shape == () and t.dtype == r.dtype == torch.int64, "t and r must be 0-dim int64 tensors")
    require(by.dtype == torch.float32 and by.dim() == 1 and by.is_contiguous(), "by must be a contiguous float32 vector")
    if store is not None:
        require(store.dtype == torch.int64 and store.stride(1) == 1, "store must be an R×S int64 table with contiguous rows")
    if hidden is not None:
        require(
            hidden.dtype == torch.float32 and hidden.shape[0] == B and hidden.stride(1) == 1,
            "hidden must be a float32 B×n state with unit stride along n",
        )
    lq_in, lq_s = (by, by) if logq is None else logq
    h = hidden if hidden is not None else by
    grid = (triton.cdiv(C, _BLOCK_C),)
    _step_inputs_kernel[grid](
        schedule_inputs, schedule_targets, schedule_active, schedule_keep, schedule_inputs.stride(0), schedule_keep.stride(0),
        store if store is not None else schedule_inputs, store.stride(0) if store is not None else 0, t, r,
        by, lq_in, lq_s, inputs, targets, active, cols, col_valid, n_cols, bias, h, h.stride(0) if hidden is not None else 0,
        B, S, hidden.shape[1] if hidden is not None else 0,
        HAS_LOGQ=logq is not None, MASK_IN_BIAS=mask_in_bias, HAS_H=hidden is not None, BLOCK_C=_BLOCK_C,
        BLOCK_B=min(triton.next_power_of_2(max(B, 16)), 1024), BLOCK_N=_BLOCK_N,
    )


_BLOCK_ROWS, _BLOCK_D = 16, 64
_BLOCK_FLAT = 1024


@triton.jit
def _gather_rows_kernel(table, stride_table, rows, mask, stride_mask, out, stride_out, K, d,
                        HAS_MASK: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    k = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = (k[:, None] < K) & (cols[None, :] < d)
    row = tl.load(rows + k, mask=k < K, other=0)
    x = tl.load(table + row[:, None] * stride_table + cols[None, :], mask=ok, other=0.0)
    if HAS_MASK:
        x *= tl.load(mask + k[:, None] * stride_mask + cols[None, :], mask=ok, other=0.0)
    tl.store(out + k[:, None] * stride_out + cols[None, :], x, mask=ok)


@triton.jit
def _threshold_kernel(u_ptr, n, split, p_first, scale_first, p_rest, scale_rest, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    u = tl.load(u_ptr + i, mask=ok, other=0.0)
    first = i < split
    p = tl.where(first, p_first, p_rest)
    scale = tl.where(first, scale_first, scale_rest)
    tl.store(u_ptr + i, tl.where(u >= p, scale, 0.0), mask=ok)


def gather_rows(table: Tensor, rows: Tensor, mask: Tensor | None, out: Tensor) -> Tensor:
    """``out`` ← ``table[rows]`` (K×d; ``table`` N×d with unit stride along d), times ``mask``
    (K×d) unless None. Returns ``out``."""
    require(
        table.dim() == 2 and table.dtype == torch.float32 and table.stride(1) == 1,
        "table must be a float32 N×d table with unit stride along d",
    )
    K, d = rows.shape[0], table.shape[1]
    require(rows.dtype == torch.int64 and rows.dim() == 1 and rows.is_contiguous() and rows.device == table.device,
          f"rows must be a contiguous int64 vector on {table.device}")
    require(out.shape == (K, d) and out.dtype == torch.float32 and out.stride(1) == 1, f"out must be a float32 {K}×{d} buffer")
    if mask is not None:
        require(mask.shape == (K, d) and mask.dtype == torch.float32 and mask.stride(1) == 1, f"mask must be a float32 {K}×{d} tensor")
    if K and d:
        m = mask if mask is not None else out
        grid = (triton.cdiv(K, _BLOCK_ROWS), triton.cdiv(d, _BLOCK_D))
        _gather_rows_kernel[grid](table, table.stride(0), rows, m, m.stride(0), out, out.stride(0), K, d,
                                  HAS_MASK=mask is not None, BLOCK_ROWS=_BLOCK_ROWS, BLOCK_D=_BLOCK_D)
    return out


def dropout_threshold(u: Tensor, split: int, p_first: float, p_rest: float) -> Tensor:
    """The uniform draws ``u`` (contiguous float32, read flat) become inverted-dropout masks in
    place: 1/(1 − p) where u ≥ p, else 0, with p = ``p_first`` before position ``split`` and
    ``p_rest`` from there on (a step's embedding mask, then its hidden masks). Returns ``u``."""
    require(u.dtype == torch.float32 and u.is_contiguous(), "u must be a contiguous float32 tensor")
    n = u.numel()
    require(0 <= split <= n, f"split must be in [0, {n}], got {split!r}")
    for name, p, used in (("p_first", p_first, split > 0), ("p_rest", p_rest, split < n)):
        require(not used or 0.0 <= p < 1.0, f"{name} must be in [0, 1), got {p!r}")
    if n:
        scale = lambda p: 1.0 / (1.0 - p) if p < 1.0 else 0.0  # noqa: E731
        _threshold_kernel[(triton.cdiv(n, _BLOCK_FLAT),)](u, n, split, float(p_first), scale(p_first), float(p_rest),
                                                            scale(p_rest), BLOCK=_BLOCK_FLAT)
    return u
