"""The training step on the fused GPU kernels (Triton): the backend ``triton``.

:class:`TritonOps` is chosen by :func:`gru4rec.training.backend.select_backend` (float32 tables
on CUDA with scratch rows, ``GRU4REC_FUSED=1`` or ``fused_gpu=True``; on CPU tensors under
Triton's interpreter, which is how the tests run it). It keeps the PyTorch row and column
operations of :class:`~gru4rec.training.ops.TorchOps` (gathers that are one kernel each already)
and replaces the three chains of small kernels that dominate a GPU step:

* the GRU cell (:class:`TritonGRUCell`): the gate arithmetic between a layer's products, two
  launches forward and two backward (``gru4rec/kernels/triton_gru.py``);
* the loss and dL/dscores: two launches for any of the six losses
  (``gru4rec/kernels/triton_losses.py``);
* the step's start (:class:`TritonStepInputs`, ``gru4rec/kernels/triton_step.py``): schedule
  rows, columns, their bias and the reset of new sessions in one launch; the dropped-out input
  rows in one; all of the step's dropout masks from their draws in one;
* the optimiser's update (:class:`TritonUpdate`): duplicates summed through the scratch tables,
  grad_cap, and the rule, one or two launches per item table and one for the flat buffer of the
  dense weights (``gru4rec/kernels/triton_optim.py``).

The matrix products stay cuBLAS. Every launch takes its buffers from the caller and reads its
per-step scalars on the device, so the step stays capturable as a CUDA graph. This module imports
Triton; nothing imports it but the backend, when it is chosen.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.config.activations import Activation
from gru4rec.kernels import triton_gru, triton_losses, triton_step
from gru4rec.kernels.triton_activations import activation_code
from gru4rec.kernels.triton_optim import TritonDenseUpdate, TritonTableUpdate
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.batching import Schedule
from gru4rec.training.cell import GRUCell, LayerCache
from gru4rec.training.losses import LossGradFn, masks_through_bias
from gru4rec.training.ops import FusedUpdate, OptimizerTables, SparseGrad, StepBatch, StepInputs, TorchOps
from gru4rec.training.precision import Matmuls
from gru4rec.training.sampling import LogQ

__all__ = ["TritonGRUCell", "TritonOps", "TritonUpdate", "triton_loss_grad"]


class TritonGRUCell:
    """The GRU cell of :mod:`gru4rec.training.cell` by the Triton kernels: float32 products, any
    elementwise candidate activation."""

    fused = True

    def __init__(self, act: Activation) -> None:
        self.act = activation_code(act)  # parsed once, not at every launch

    def forward(
        self, v: Tensor, h: Tensor, h_c: Tensor, wrz: Tensor, wh: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = h.shape[1]
        rz = torch.addmm(v[:, n:], h_c, wrz)
        hr = triton_gru.gru_gates(rz, h, torch.empty_like(h))  # rz ← σ(rz) in place
        c = torch.addmm(v[:, :n], hr, wh)
        out = triton_gru.gru_output(c, h, rz, mask, torch.empty_like(h), self.act)  # c ← f(c) in place
        return rz, hr, c, out

    def backward(self, d: Tensor, cache: LayerCache, g_wh: Tensor, g_wrz: Tensor, g_bh: Tensor) -> Tensor:
        h, rz, n = cache.h, cache.rz, cache.h.shape[1]
        d_v = h.new_empty((h.shape[0], 3 * n))
        triton_gru.gru_backward_out(d, cache.mask, rz, cache.c, h, d_v, g_bh, self.act)  # d_c, d_z and their sums
        torch.mm(cache.hr.t(), d_v[:, :n], out=g_wh)
        triton_gru.gru_backward_reset(torch.mm(d_v[:, :n], cache.wh.t()), h, rz, d_v, g_bh)  # d_r and its sum
        torch.mm(cache.h_c.t(), d_v[:, n:], out=g_wrz)
        return d_v


def triton_loss_grad(config: Config) -> LossGradFn:
    """The loss and dL/dx of ``config`` by the Triton kernels: two launches, the gradient written
    over the scores (as the fused CPU cross-entropy does; the step reads them no more) and the
    loss as a float64 0-dim tensor (the epoch loop's step losses are float64)."""
    loss, xe = config.loss, masks_through_bias(config)
    act = None if xe else activation_code(config.final_activation)  # parsed once, not at every step
    constants: dict[str, Any] = dict(loss=loss, act=act, bpreg=float(config.bpreg) if loss == "bpr-max" else 0.0,
                     smoothing=float(config.smoothing) if xe else 0.0,
                     inv_batch=1.0 / float(config.batch_size))

    def loss_grad(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
        loss_out = x.new_empty((), dtype=torch.float64)  # the epoch loop's type: no conversion there
        triton_losses.loss_grad(x, col_valid, row_valid, n_cols.to(x.dtype), grad=x, per_row=x.new_empty(x.shape[0]),
                                loss_out=loss_out, **constants)
        return loss_out, x

    return loss_grad


class TritonUpdate:
    """The optimiser's update by the Triton kernels, bound once to its tables: each item table's
    gradient parts are added into its scratch table (the last position of a row owns it), the
    owners apply the rule to their rows, and the flat buffer of the dense weights takes one
    launch. A table's gradient in two parts (shared mode's ``Wy``: the input rows and the score
    columns) takes one scatter and one update launch for both. The bias table ``By`` has the score
    columns' rows, as the columns' part of ``Wy`` does: it rides in those launches instead of
    taking two of its own. Per step, shared mode: 2 launches for the item tables, 1 for the
    dense buffer (with grad_cap, 2 norm launches and a zeroing more). With grad_cap the squared
    norms of the dense gradient and of every summed row are added on the device first, and every update reads the clip scale from there."""

    def __init__(self, optimizer: OptimizerTables) -> None:
        rule = dict(optimizer.rule, grad_cap=optimizer.grad_cap)
        self.t = optimizer.t
        self.clip = optimizer.grad_cap > 0
        self.dense = TritonDenseUpdate(optimizer.flat, vars(optimizer.state["dense"]), **rule) if optimizer.flat.numel() else None
        self.tables: dict[str, TritonTableUpdate] = {}
        for name, p in optimizer.sparse.items():
            st = optimizer.state[name]  # its scratch table: the PyTorch rule's, zeros between steps
            owner = torch.zeros(p.shape[0], device=p.device, dtype=torch.int32)
            self.tables[name] = TritonTableUpdate(p.detach(), vars(st), st.scratch, owner, **rule)
        self.sq_total = torch.zeros((), device=optimizer.flat.device, dtype=torch.float32)

    def __call__(self, g_dense: Tensor, sparse_grads: dict[str, SparseGrad | list[SparseGrad]]) -> None:
        parts = {name: grads if isinstance(grads, list) else [grads] for name, grads in sparse_grads.items()}
        riding = _riding_bias(parts)  # the bias table's gradient, carried by the Wy part of the same rows
        # (table, rows, g, offset, (bias update, g_b) or None, second part (rows, g) or None)
        jobs: list[tuple[TritonTableUpdate, Tensor, Tensor, int, tuple[TritonTableUpdate, Tensor] | None,
                         tuple[Tensor, Tensor] | None]] = []
        for name, grads in parts.items():
            if name == "By" and riding is not None:
                continue
            bias_at = riding if name == "Wy" else None
            if len(grads) == 2 and bias_at in (None, 1):  # two parts, one launch (shared mode's Wy)
                bias = (self.tables["By"], parts["By"][0][1]) if bias_at == 1 else None
                jobs.append((self.tables[name], *grads[0], 0, bias, grads[1]))
                continue
            for i, ((rows, g), offset) in enumerate(zip(grads, _offsets(grads))):
                bias = (self.tables["By"], parts["By"][0][1]) if bias_at == i else None
                jobs.append((self.tables[name], rows, g, offset, bias, None))
        for table, rows, g, offset, bias, second in jobs:
            table.scatter(rows, g, offset, bias, second)
        sq_total = None
        if self.clip:
            sq_total = self.sq_total.zero_()
            if self.dense is not None:
                self.dense.add_sq_norm(g_dense, sq_total)
            for table, rows, _, offset, bias, second in jobs:
                table.add_sq_norm(rows, sq_total, offset, None if bias is None else bias[0], None if second is None else second[0])
        if self.dense is not None:
            self.dense.update(g_dense, self.t, sq_total)
        for table, rows, _, offset, bias, second in jobs:
            table.update(rows, offset, self.t, sq_total, None if bias is None else bias[0], None if second is None else second[0])


def _riding_bias(parts: dict[str, list[SparseGrad]]) -> int | None:
    """Which part of Wy's gradient has the rows of By's (the score columns, the same tensor in
    the fast step): By's update then rides in that part's launches. None: By goes on its own."""
    if "By" not in parts or "Wy" not in parts or len(parts["By"]) != 1:
        return None
    by_rows = parts["By"][0][0]
    return next((i for i, (rows, _) in enumerate(parts["Wy"]) if rows is by_rows), None)


def _offsets(parts: list[SparseGrad]) -> list[int]:
    """Each part's first position among all of a table's positions (shapes only: no sync)."""
    out, total = [], 0
    for rows, _ in parts:
        out.append(total)
        total += rows.shape[0]
    return out


class TritonStepInputs:
    """The step's inputs gathered by one launch (``gru4rec/kernels/triton_step.py``) into
    buffers allocated once: a CUDA graph captures the launch with them."""

    def __init__(self, by: Tensor, batch_size: int, n_sample: int, logq: LogQ | None, mask_in_bias: bool) -> None:
        self.by, self.logq, self.mask_in_bias = by, logq, mask_in_bias
        B, C, device = batch_size, batch_size + n_sample, by.device
        ints = lambda n: torch.empty(n, dtype=torch.int64, device=device)  # noqa: E731
        floats = lambda n: torch.empty(n, dtype=torch.float32, device=device)  # noqa: E731
        cols, col_valid = ints(C), floats(C)  # targets and active are their first B entries
        self.batch = StepBatch(inputs=ints(B), targets=cols[:B], active=col_valid[:B], samples=cols[B:], cols=cols,
                               col_valid=col_valid, n_cols=torch.empty((), dtype=torch.float32, device=device), bias=floats(C))

    def __call__(self, schedule: Schedule, t: Tensor, sample_row: Tensor, store: Tensor | None, hidden: Tensor) -> StepBatch:
        b = self.batch
        triton_step.step_inputs(schedule.inputs, schedule.targets, schedule.active, schedule.keep, store, t, sample_row,
                                self.by.detach(), None if self.logq is None else (self.logq.in_batch, self.logq.sampled),
                                mask_in_bias=self.mask_in_bias, inputs=b.inputs, targets=b.targets, active=b.active,
                                cols=b.cols, col_valid=b.col_valid, n_cols=b.n_cols, bias=b.bias, hidden=hidden)
        return b


class TritonOps(TorchOps):
    """The operations of the fused GPU kernels (float32 tables, scratch rows)."""

    name = "triton"
    fused = True

    def gather_rows(self, table: Tensor, rows: Tensor, mask: Tensor | None) -> Tensor:
        return triton_step.gather_rows(table.detach(), rows, mask, table.new_empty((rows.shape[0], table.shape[1])))

    def dropout_threshold(self, u: Tensor, split: int, p_first: float, p_rest: float) -> None:
        triton_step.dropout_threshold(u, split, p_first, p_rest)

    def gru_cell(self, act: Activation, matmuls: Matmuls) -> GRUCell:
        if matmuls.low is None:
            return TritonGRUCell(act)
        return super().gru_cell(act, matmuls)  # bfloat16 operands: the cell's products cast, as PyTorch does

    def loss_grad(self, config: Config) -> LossGradFn:
        return triton_loss_grad(config)

    def step_inputs(self, net: GRU4RecNet, batch_size: int, n_sample: int, logq: LogQ | None, mask_in_bias: bool) -> StepInputs | None:
        return TritonStepInputs(net.By, batch_size, n_sample, logq, mask_in_bias)

    def fused_update(self, optimizer: OptimizerTables) -> FusedUpdate | None:
        return TritonUpdate(optimizer)
