"""The training step's row and column operations, as PyTorch code or as fused CPU kernels.

The fast step and the optimiser call these operations without asking which implementation they
run: the backend (:func:`gru4rec.training.backend.select_backend`) decides once — by device,
dtype, how duplicate rows are merged, the caller's switches, ``GRU4REC_CPU_KERNELS`` /
``GRU4REC_FUSED`` and whether the kernels could be built or imported — and holds one of

* :class:`TorchOps`: PyTorch operations on any device and dtype. On a GPU they never read a
  device value on the host, so the step stays capturable as a CUDA graph. It is the code the
  fused kernels are tested against (``tests/test_cpu_kernels.py``, ``tests/test_triton_*.py``).
* :class:`CpuKernelOps`: the same operations by the kernels of ``gru4rec/kernels/cpu_kernels.c``
  (float32 tables on the CPU whose duplicate rows are made unique): one pass over memory where
  PyTorch takes several operators. Only rounding may differ.
* ``TritonOps`` (:mod:`gru4rec.training.triton_ops`, imported only when chosen): the cell, the
  loss and the optimiser's updates by the Triton kernels of ``gru4rec/kernels/triton_*.py``.

The ops also choose the fast step's GRU cell (:meth:`TorchOps.gru_cell`: the fused one needs the
tanh candidate and float32 products), its loss gradient (:meth:`TorchOps.loss_grad`) and, where
they replace the optimiser's whole update, that update (:meth:`TorchOps.fused_update`).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.config.activations import Activation
from gru4rec.kernels.cpu import CpuKernels, lost_fast_path
from gru4rec.training.cell import FusedGRUCell, GRUCell, TorchGRUCell
from gru4rec.training.dropout import keep_masks
from gru4rec.training.losses import MASK, LossGradFn, make_loss_grad
from gru4rec.training.precision import Matmuls
from gru4rec.training.sampling import CdfSearch, LogQ, torch_cdf_search

__all__ = ["CpuKernelOps", "FusedUpdate", "OptimizerTables", "StepBatch", "StepInputs", "TorchOps"]

#: Row indices (K) and the gradient rows (K×…) of one item table; duplicate rows allowed.
SparseGrad = tuple[Tensor, Tensor]


class OptimizerTables(Protocol):
    """What a fused update binds of the optimiser (:class:`gru4rec.training.optim.Optimizer`):
    its rule's constants, the flat dense buffer, the item tables and every state table."""

    rule: dict[str, Any]
    grad_cap: float
    flat: Tensor
    sparse: dict[str, Any]
    state: dict[str, Any]
    t: Tensor


class StepBatch(NamedTuple):
    """A step's inputs as the fast step takes them: the B slots' ``inputs``, ``targets`` and
    ``active``, the ``samples`` (S), the columns ``cols`` = [targets | samples] with their
    validity ``col_valid`` and ``bias`` (C), and ``n_cols`` (the valid columns, 0-dim)."""

    inputs: Tensor
    targets: Tensor
    active: Tensor
    samples: Tensor
    cols: Tensor
    col_valid: Tensor
    n_cols: Tensor
    bias: Tensor


class StepInputs(Protocol):
    """A fused gather of a replayed step's inputs: schedule row ``t`` and sample-store row
    ``sample_row`` (0-dim device tensors), the columns and their bias, and the first layer's
    ``hidden`` state reset where a session starts."""

    def __call__(self, schedule: Any, t: Tensor, sample_row: Tensor, store: Tensor | None, hidden: Tensor) -> StepBatch: ...


class FusedUpdate(Protocol):
    """The optimiser's update after its step count: the dense gradient (the flat buffer, which
    it may overwrite) and each item table's gradient parts (duplicate rows allowed)."""

    def __call__(self, g_dense: Tensor, sparse_grads: dict[str, SparseGrad | list[SparseGrad]]) -> None: ...


class TorchOps:
    """The operations as PyTorch code."""

    #: The backend's name for these ops (:data:`gru4rec.training.backend.BACKENDS`).
    name = "torch"
    #: Whether these are fused kernels (CPU or GPU) rather than PyTorch operations.
    fused = False
    #: The fused CPU kernels behind these operations (None: PyTorch).
    kernels: CpuKernels | None = None

    # ---------------------------------------------------------------- the score columns

    def column_bias(self, by: Tensor, cols: Tensor, n_in: int, logq: LogQ | None, valid: Tensor | None) -> Tensor:
        """The bias of the C score columns ``cols``: ``By[cols]`` minus logQ (in-batch terms for
        the first ``n_in`` columns, sampled terms for the rest), plus MASK where ``valid`` (if
        given) is 0 — masked columns then leave a softmax through the bias."""
        bias = by.index_select(0, cols)
        if logq is not None:
            bias = bias - logq.columns(cols[:n_in], cols[n_in:])
        if valid is not None:
            bias = bias + (1.0 - valid) * MASK
        return bias

    def spread_columns(self, s: Tensor, col_rows: Tensor, bias: Tensor) -> Tensor:
        """The B×C scores from the B×K scores of distinct rows: ``s[:, col_rows] + bias``."""
        return s.index_select(1, col_rows).add_(bias)

    def merge_columns(self, g: Tensor, col_rows: Tensor, n_rows: int) -> Tensor:
        """The B×K gradient of the distinct rows' scores: the B×C columns of ``g`` summed by row."""
        return g.new_zeros((g.shape[0], n_rows)).index_add_(1, col_rows, g)

    def sum_rows(self, g: Tensor) -> Tensor:
        """The column sums of ``g`` (B×K): the bias rows' gradient from dL/d(their scores)."""
        return g.sum(0)

    # ---------------------------------------------------------------- rows of the item tables

    def gather_rows(self, table: Tensor, rows: Tensor, mask: Tensor | None) -> Tensor:
        """``table[rows]`` (K×d), times ``mask`` (K×d) unless None: the step's input rows."""
        x = table.index_select(0, rows)
        return x if mask is None else x.mul_(mask)

    def dropout_uniform(self, u: Tensor, generator: torch.Generator) -> None:
        """``u`` := uniform draws in [0, 1) from ``generator`` (:data:`gru4rec.training.dropout.Uniform`): torch.rand."""
        torch.rand(u.shape, generator=generator, out=u)

    def dropout_threshold(self, u: Tensor, split: int, p_first: float, p_rest: float) -> None:
        """The uniform draws ``u`` become the step's dropout masks in place, with ``p_first``
        before position ``split`` and ``p_rest`` after (:data:`gru4rec.training.dropout.Threshold`)."""
        keep_masks(u, split, p_first, p_rest)

    def add_rows(self, table: Tensor, rows: Tensor, src: Tensor) -> None:
        """``table[rows[i]] += src[i]`` in place (repeated rows add up): ``index_add_``."""
        table.index_add_(0, rows, src)

    def unique(self, rows: Tensor, mark: Tensor, slot: Tensor, arange: Tensor, n_first: int | None) -> tuple[Tensor, Tensor, int]:
        """The distinct values of ``rows``, each position's index among them, and how many of them
        occur in the first ``n_first`` positions (default: all); those come first, ascending.
        ``mark`` (zeros over the ids, left so), ``slot`` (int64 over the ids) and ``arange``
        (0, 1, … over the ids) are the caller's scratch tables. Syncs on a GPU (``nonzero``)."""
        n = rows.shape[0]
        n_first = n if n_first is None else n_first
        mark.index_fill_(0, rows[:n_first], 1)
        first = mark.nonzero().squeeze(1)
        mark.index_fill_(0, rows[n_first:], 1)
        mark.index_fill_(0, first, 0)
        rest = mark.nonzero().squeeze(1)  # ascending here; the kernel keeps order of appearance
        mark.index_fill_(0, rest, 0)
        uniq = torch.cat((first, rest))
        slot.index_copy_(0, uniq, arange[: uniq.shape[0]])
        return uniq, slot.index_select(0, rows), first.shape[0]

    def cdf_search(self, cdf: Tensor) -> CdfSearch:
        """The negative sampler's inverse-CDF lookup in ``cdf`` (:class:`~gru4rec.training.sampling.SampleStore`)."""
        return torch_cdf_search(cdf)

    # ---------------------------------------------------------------- the step's building blocks

    def gru_cell(self, act: Activation, matmuls: Matmuls) -> GRUCell:
        """The GRU cell of the fast step for the candidate activation ``act`` and ``matmuls``."""
        return TorchGRUCell(act, matmuls)

    def loss_grad(self, config: Config) -> LossGradFn:
        """The fast step's loss and dL/dscores for ``config``."""
        return make_loss_grad(config)

    def step_inputs(self, net: Any, batch_size: int, n_sample: int, logq: LogQ | None, mask_in_bias: bool) -> StepInputs | None:
        """A fused gather of a replayed step's inputs for ``net``'s tables, or None: the trainer
        gathers them with PyTorch operations (:meth:`gru4rec.training.trainer.Trainer.train_step_at`)."""
        return None

    def fused_update(self, optimizer: OptimizerTables) -> FusedUpdate | None:
        """The optimiser's whole update (duplicates summed, clipped, applied) as fused kernels
        bound to ``optimizer``'s tables, or None: the optimiser runs its own code."""
        return None


class CpuKernelOps(TorchOps):
    """The operations by the fused CPU kernels (float32 CPU tensors)."""

    name = "cpu-kernels"
    fused = True

    def __init__(self, kernels: CpuKernels) -> None:
        self.kernels: CpuKernels = kernels

    def column_bias(self, by: Tensor, cols: Tensor, n_in: int, logq: LogQ | None, valid: Tensor | None) -> Tensor:
        logq_in, logq_sample = (None, None) if logq is None else logq
        return self.kernels.column_bias(cols, n_in, by, logq_in, logq_sample, valid)

    def spread_columns(self, s: Tensor, col_rows: Tensor, bias: Tensor) -> Tensor:
        return self.kernels.gather_columns(s, col_rows, bias)

    def merge_columns(self, g: Tensor, col_rows: Tensor, n_rows: int) -> Tensor:
        return self.kernels.sum_columns(g, col_rows, n_rows)

    def sum_rows(self, g: Tensor) -> Tensor:
        return self.kernels.sum_rows(g.contiguous())  # the one-call CPU step's sum, in its order

    def dropout_uniform(self, u: Tensor, generator: torch.Generator) -> None:
        # torch.rand's values and stream by vector loops, where this torch's generator is the one
        # the kernel knows (checked once)
        if self.kernels.torch_rand.matches_torch():
            self.kernels.torch_rand(u, generator)
        else:  # the same draws by torch.rand, one scalar at a time
            lost_fast_path("the kernel's torch.rand (dropout draws)", self.kernels.torch_rand.why_not,
                           "the dropout masks are drawn by torch.rand (about 0.4 ms a step on DIGINETICA's shapes)")
            super().dropout_uniform(u, generator)

    def dropout_threshold(self, u: Tensor, split: int, p_first: float, p_rest: float) -> None:
        self.kernels.dropout_masks(u, split, p_first, p_rest)

    def add_rows(self, table: Tensor, rows: Tensor, src: Tensor) -> None:
        if table.dim() == 2:
            self.kernels.add_rows(table, rows, src.contiguous())  # any layout of src: the kernel reads it contiguous
        else:  # a bias table: index_add_ is one pass already
            table.index_add_(0, rows, src)

    def unique(self, rows: Tensor, mark: Tensor, slot: Tensor, arange: Tensor, n_first: int | None) -> tuple[Tensor, Tensor, int]:
        n = rows.shape[0]
        uniq, inverse = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        k, k_first = self.kernels.unique(rows, mark, slot, uniq, inverse, n_first)
        return uniq[:k], inverse, k_first

    def cdf_search(self, cdf: Tensor) -> CdfSearch:
        if cdf.is_cpu and cdf.dtype is torch.float64:
            return self.kernels.inverse_cdf(cdf)  # the same answers as searchsorted from a guide table, ~10x faster
        return torch_cdf_search(cdf)

    def gru_cell(self, act: Activation, matmuls: Matmuls) -> GRUCell:
        if act.name == "tanh" and matmuls.low is None:
            return FusedGRUCell(self.kernels)
        return TorchGRUCell(act, matmuls)  # the kernels have the tanh candidate and float32 products only

    def loss_grad(self, config: Config) -> LossGradFn:
        return make_loss_grad(config, self.kernels)
