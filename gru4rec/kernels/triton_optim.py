"""GRU4Rec's optimiser as fused Triton kernels: the lazy update of the item tables at the rows a
step uses (duplicate rows allowed, no host sync).

The rule itself, and the update of the flat dense buffer, are in :mod:`gru4rec.kernels.triton_rule`
(re-exported here: this module is the whole optimiser to its callers); this one holds the item
tables' side.

Item tables: duplicate rows without a host sync
-----------------------------------------------
A step's row indices repeat (an item is clicked by several sessions, sampled as a negative, and
both), and the gradients of one row must be summed before the rule runs once on the row: the rule
is not linear in g. ``torch.unique`` would tell how many distinct rows there are, but that number
lives on the device and reading it stalls the captured CUDA graph. Here every table has two
full-size tables of zeros, ``scratch`` (N×W float32) and ``owner`` (N int32), and a step is:

1. :meth:`TritonTableUpdate.scatter` (once per part of the gradient): ``scratch[rows[k]] += g[k]`` (atomic
   adds) and ``owner[rows[k]] = max(owner[rows[k]], offset + k + 1)`` (atomic max). After every
   part is in, ``scratch`` holds each row's summed gradient and ``owner`` names one position per
   row, the last one, that *owns* the row. Positions are numbered across the parts of one table
   (``offset`` = the number of positions in the earlier parts), so an owner is unique even when a
   row is in two parts (shared-embedding mode: Wy gets the input rows and the score columns).
2. (grad_cap > 0) :meth:`TritonTableUpdate.add_sq_norm`: each owning position adds ‖scratch[row]‖² to the 0-dim
   ``sq_total`` (atomic add); :meth:`TritonDenseUpdate.add_sq_norm` adds the dense gradient's Σ g². Every norm
   kernel of the step runs before any update, since the updates consume the scratch table.
3. :meth:`TritonTableUpdate.update` (once per part): the owning position reads scratch[row] (times s, computed
   in the kernel from ``sq_total``), zeroes it and owner[row], and applies the rule to p[row] and
   its state rows. Exactly one program touches each row, so nothing races; the others do nothing.
4. :meth:`TritonDenseUpdate.update`: the rule over the whole flat buffer, one kernel.

Both tables are zero again after the step. Positions whose row is outside [0, N) are skipped
(checking them on the host would sync); rows must be in range for the update to mean anything.

Per step: a table's scatter and update are one launch each for up to two parts of its gradient
(``second``), and a bias table with the rows of the last part rides in them (``bias``): shared
mode's Wy and By take 2 launches together, the dense buffer 1; with grad_cap > 0 one norm
launch per table and one for the dense buffer more, and the caller's zeroing of ``sq_total``.
The per-step scalars (Adam's ``t``, ``sq_total``) are read on the device, launch grids depend on
tensor shapes only, and no tensor is allocated, so every call can be captured in a CUDA graph.

Determinism: the summed gradient of a duplicated row and ``sq_total`` are float sums done by
atomics, whose order varies between runs (the last bit may differ); everything else is exact.

This module imports Triton at the top: it is imported only where the fused GPU path is chosen
(:func:`gru4rec.kernels.triton_support.triton_unavailable`). On CPU tensors its kernels run in
Triton's interpreter (``TRITON_INTERPRET=1``, set before this module is imported): the tests.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gru4rec.kernels.triton_rule import (
    INT32_MAX,
    TritonDenseUpdate,
    UpdateRule,
    apply_rule,
    bias_corrections,
    check_device,
    check_float,
    check_sq_total,
    check_state,
    check_step,
    clip_scale,
    dense_sq_norm,
    rule_pointers,
)

__all__ = ["TritonDenseUpdate", "TritonTableUpdate", "UpdateRule", "dense_sq_norm"]

#: Elements of one row tile (positions × columns); rows wider than _MAX_BLOCK_W are walked in
#: column chunks by the same program, which is what lets it zero the owner entry last.
_ROW_TILE = 1024
_MAX_BLOCK_W = 128


# ---------------------------------------------------------------------------------------- rule


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
    scale = clip_scale(sq_ptr, grad_cap, CLIP)
    bias1, bias2 = bias_corrections(t_ptr, beta1, decay, METHOD)
    cols = tl.arange(0, BLOCK_W)
    s_base = row[:, None] * W
    for w0 in range(0, W, BLOCK_W):
        c = (w0 + cols)[None, :]
        mask = own[:, None] & (c < W)
        idx = s_base + c
        g = tl.load(scratch_ptr + idx, mask=mask, other=0.0) * scale
        tl.store(scratch_ptr + idx, tl.zeros((BLOCK_K, BLOCK_W), dtype=tl.float32), mask=mask)
        apply_rule(p_ptr, acc_ptr, dacc_ptr, m_ptr, vel_ptr, idx, mask, g, lr, momentum, lmbd, decay, gain,
                    beta1_gain, eps, bias1, bias2, METHOD, HAS_MOMENTUM, HAS_LMBD)
    if HAS_BIAS:  # the same owner updates the bias table's row, if the row is one of the bias's
        own_b = own & (k >= bias_from)
        gb = tl.load(bscratch_ptr + row, mask=own_b, other=0.0) * scale
        tl.store(bscratch_ptr + row, tl.zeros((BLOCK_K,), dtype=tl.float32), mask=own_b)
        apply_rule(bp_ptr, bacc_ptr, bdacc_ptr, bm_ptr, bvel_ptr, row, own_b, gb, lr, momentum, lmbd, decay, gain,
                    beta1_gain, eps, bias1, bias2, METHOD, HAS_MOMENTUM, HAS_LMBD)
    tl.store(owner_ptr + row, tl.zeros((BLOCK_K,), dtype=tl.int32), mask=own)


# ---------------------------------------------------------------------------------------- checks


def _row_blocks(width: int) -> tuple[int, int]:
    """(positions, columns) of a row tile: about _ROW_TILE elements, powers of two."""
    block_w = min(triton.next_power_of_2(max(width, 1)), _MAX_BLOCK_W)
    return max(_ROW_TILE // block_w, 1), block_w


def _table_shape(p: object, name: str = "p") -> tuple[int, int]:
    """(N, W) of an item table: N×W, or N (a bias table, N×1)."""
    if not isinstance(p, Tensor) or p.dim() not in (1, 2):
        raise ValueError(f"{name} must be a 1-D or 2-D tensor (an item table: N×W, or N)")
    check_float(p, name, p.device)
    n, w = p.shape[0], (p.shape[1] if p.dim() == 2 else 1)
    if n * w == 0:
        raise ValueError(f"an item table must not be empty, got shape {tuple(p.shape)}")
    return n, w


def _check_scratch(scratch: object, owner: object, n: int, width: int, device: torch.device) -> Tensor:
    """``scratch``: N·W float32 sums; ``owner``: N int32 owners; both on ``device``. Returns ``scratch``."""
    sums = check_float(scratch, "scratch", device, n * width)
    if not isinstance(owner, Tensor) or owner.dtype != torch.int32 or not owner.is_contiguous() or owner.dim() != 1:
        raise ValueError("owner must be a contiguous 1-D int32 tensor")
    if owner.device != device or owner.shape[0] != n:
        raise ValueError(
            f"owner must hold one int32 per row of the table ({n}) on {device}, got shape {tuple(owner.shape)} on {owner.device}"
        )
    return sums


def _check_table(p: Tensor, scratch: object, owner: object) -> tuple[int, int]:
    """(N, W) of the item table ``p``, with its scratch and owner tables checked against it."""
    n, w = _table_shape(p)
    if _check_scratch(scratch, owner, n, w, p.device).data_ptr() == p.data_ptr():
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
    if offset + rows.shape[0] > INT32_MAX:
        raise ValueError(f"offset + len(rows) = {offset + rows.shape[0]} does not fit the int32 owner table")
    return rows.shape[0]


def _check_same_dtype(rows: Tensor, second: Tensor) -> None:
    if second.dtype != rows.dtype:
        raise ValueError(f"the second part's rows must be {rows.dtype} like the first's, got {second.dtype}")


def _check_grad_rows(g: object, k: int, width: int, device: torch.device) -> None:
    grads = check_float(g, "g", device, k * width)
    if grads.dim() == 0 or grads.shape[0] != k:
        raise ValueError(f"g must have one gradient row per position ({k}), got shape {tuple(grads.shape)}")


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


# ---------------------------------------------------------------------------------------- bound


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
        check_device(p.device)
        self.p, self.scratch, self.owner = p, scratch, owner
        self.state = check_state(state, self.rule, p)
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
        check_sq_total(sq_total, self.p.device)
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
        check_step(self.rule, self.p.device, t, sq_total)
        self._check_second(second, offset + k, rows)
        if bias is not None:
            self._check_bias(bias)
        if k or second is not None:
            riding = None if bias is None else [bias.p, bias.scratch, *rule_pointers(bias.p, bias.state, None, None)[:4]]
            _launch_update_rows(rows, self.p, self.scratch, self.owner, rule_pointers(self.p, self.state, t, sq_total), k,
                                self.n_rows, self.width, offset, self._args, riding, second)

    def _check_second(self, second: Tensor | None, offset: int, rows: Tensor) -> None:
        if second is not None:
            _check_rows(second, self.p.device, offset)
            _check_same_dtype(rows, second)

    def _check_bias(self, bias: TritonTableUpdate) -> None:
        if not isinstance(bias, TritonTableUpdate) or bias.width != 1 or bias.n_rows != self.n_rows or bias.rule != self.rule:
            raise ValueError("bias must be the update of a bias table (N) with this table's rows and rule")


