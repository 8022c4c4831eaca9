"""The :class:`Trainer`: the training state of a network, and one training step over it.

The state is the slots' hidden states, the optimiser (with its state tables), the negative
sample store, the dropout masks and their generator; :meth:`Trainer.state_dict` is what a
checkpoint needs to continue the same run. Everything that does not change during training is
decided once, in the constructor: the step's implementation (hand-written or autograd), its
:class:`~gru4rec.training.backend.Backend` (the operations behind it — PyTorch, fused CPU kernels
or Triton —, whether the CPU step runs as one C call, how duplicate rows merge, graph replay), its
GRU cell, the precision of its products and its loss gradient.
"""
from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.kernels.memory import training_tables_on_huge_pages, use_huge_pages
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import Backend, select_backend
from gru4rec.training.batching import Schedule
from gru4rec.training.cpu_step import FusedCpuStep
from gru4rec.training.dropout import DropoutMasks
from gru4rec.training.losses import make_loss, masks_through_bias
from gru4rec.training.ops import StepInputs, TorchOps
from gru4rec.training.optim import Optimizer
from gru4rec.training.precision import Matmuls, check_precision
from gru4rec.training.reference import ReferenceStep
from gru4rec.training.sampling import SampleStore, make_logq
from gru4rec.training.step import FastStep

__all__ = ["Trainer", "TrainerState"]


class TrainerState(TypedDict):
    """What a checkpoint keeps of a :class:`Trainer` (:meth:`Trainer.state_dict`)."""

    optimizer: dict[str, Tensor]
    #: The sample store's generator, store and cursor; empty without a sample store.
    sampler: dict[str, Any]
    dropout_gen: Tensor


class Trainer:
    """Owns the training state of a network: hidden states, optimiser, samples, dropout RNG."""

    def __init__(
        self,
        net: GRU4RecNet,
        config: Config,
        item_support: np.ndarray,
        *,
        seed: int | None = None,
        reference: bool = False,
        precision: str = "float32",
        backend: Backend | None = None,
    ) -> None:
        """``reference``: use the plain autograd step. ``precision``: see
        :data:`~gru4rec.training.precision.PRECISIONS`. ``backend``: how the step runs (default:
        :func:`~gru4rec.training.backend.select_backend` for the network's device and dtype)."""
        self.net = net
        self.config = config
        seed = config.seed if seed is None else seed
        p = net.Wy
        self.device, self.dtype = p.device, p.dtype
        self.batch_size = B = config.batch_size
        self.n_sample = config.n_sample
        #: How the step runs, chosen once: handed to the optimiser, the fast step and the loop.
        self.backend = backend if backend is not None else select_backend(self.device, self.dtype)
        #: True: the plain autograd step (the reference the fast step is tested against); the
        #: backend chooses it for a network with item attributes (only it covers them).
        reference = self.reference = self.backend.runs_reference(net, reference=reference)
        self.optimizer = Optimizer(net.dense_parameters(), net.sparse_parameters(), config, self.backend)
        if self.device.type == "cpu" and training_tables_on_huge_pages():  # the process asked (gru4rec.kernels.memory)
            use_huge_pages(self.optimizer.tables())  # the step's scattered rows: fewer TLB misses (gru4rec.kernels.memory)
        self.hidden = net.init_hidden(B)
        self.sampler = (
            SampleStore(item_support, config.sample_alpha, config.n_sample, config.sample_store_size, self.device, seed=seed + 1,
                        search=self.ops.cdf_search)
            if config.n_sample > 0
            else None
        )
        self._no_samples = torch.empty(0, dtype=torch.int64, device=self.device)
        self._ones_s = torch.ones(config.n_sample, device=self.device, dtype=self.dtype)
        logq = make_logq(item_support, config.logq, config.sample_alpha, self.device, self.dtype)
        #: The dropout masks, drawn in place from their own generator.
        self.dropout = DropoutMasks(net, B, seed + 2, threshold=self.backend.ops.dropout_threshold,
                                    uniform=self.backend.ops.dropout_uniform)
        self.matmuls = Matmuls(check_precision(precision, self.device, reference), self.dtype)
        #: The fast step's GRU cell (fused where the kernels have it: tanh, float32 products).
        self.cell = self.ops.gru_cell(net.hidden_act, self.matmuls)
        #: The fused gather of a replayed step's inputs (None: PyTorch ops; always for the reference step).
        self._fused_inputs: StepInputs | None = None
        if reference:
            self._step: FastStep | ReferenceStep = ReferenceStep(net, self.optimizer, make_loss(config), self.dropout, logq)
        else:
            self._fused_inputs = self.ops.step_inputs(net, B, config.n_sample, logq, masks_through_bias(config))
            self._step = FastStep(net, self.optimizer, self.backend, self.cell, self.matmuls, self.ops.loss_grad(config), self.dropout,
                                  logq, mask_in_bias=masks_through_bias(config))
        #: The whole CPU step as one C call where the backend runs it and it covers the configuration
        #: (None: the step above; the backend says once why not).
        self._cpu_step: FusedCpuStep | None = None if reference else self.backend.cpu_step(
            net, config, self.optimizer, self.dropout, logq, self.hidden, float32_products=self.matmuls.low is None)

    @property
    def ops(self) -> TorchOps:
        """The row and column operations (PyTorch, fused CPU kernels or Triton): the backend's."""
        return self.backend.ops

    @property
    def uses_dropout(self) -> bool:
        """Whether a step draws dropout masks (from ``dropout_gen``)."""
        return self.dropout.active

    @property
    def dropout_gen(self) -> torch.Generator:
        """The generator of the dropout masks (a CUDA graph registers it, a checkpoint saves it)."""
        return self.dropout.generator

    def reset_hidden(self) -> None:
        """Zero every slot's hidden state (the start of an epoch)."""
        for h in self.hidden:
            h.zero_()

    def train_step(self, inputs: Tensor, targets: Tensor, active: Tensor, keep: Tensor, samples: Tensor | None = None,
                   context: Tensor | None = None) -> Tensor:
        """One step over the B slots (one row of a :class:`~gru4rec.training.batching.Schedule`); returns
        the loss (0-dim device tensor, sum over active rows / B).

        ``active``: float 0/1 (B); ``keep``: float 0/1 (B×1), 0 where a slot starts a new session.
        An inactive slot does not exist (docs/behaviour.md §3): it must carry items of an active
        slot (the schedule gives it the first active slot's), so that its zero gradient touches no
        other row. ``samples`` (S ids) default to the next row of the sample store. ``context``
        (B×5): the input clicks' context, for a network with click context (the reference step or
        FastStep: the backend gives such a network no C step and no graph replay).
        """
        if samples is None:
            samples = self.sampler.next() if self.sampler is not None else self._no_samples
        if self._cpu_step is not None:
            return self._cpu_step(inputs, targets, active, keep, samples)
        for h in self.hidden:
            h.mul_(keep)
        cols = torch.cat((targets, samples))  # C = B + S columns: row i's positive is column i
        col_valid = torch.cat((active, self._ones_s)) if self.n_sample > 0 else active
        n_cols = active.sum() + self.n_sample
        return self._step(self.hidden, inputs, targets, samples, cols, col_valid, active, n_cols, context=context)

    def train_step_at(self, schedule: Schedule, t: Tensor, sample_row: Tensor) -> Tensor:
        """Step ``t`` of ``schedule`` with row ``sample_row`` of the sample store, both 0-dim int64
        device tensors read on the device: the form of a step that a CUDA graph captures and
        replays (:func:`gru4rec.kernels.gpu.counter_driven_step`). Where the backend gathers a
        step's inputs in one fused launch (the Triton ops), that launch takes the schedule rows,
        builds the columns and their bias and resets the first layer's new sessions."""
        store = self.sampler.store if self.sampler is not None else None
        if self._fused_inputs is not None:
            batch = self._fused_inputs(schedule, t, sample_row, store, self.hidden[0])
            if len(self.hidden) > 1:
                keep = schedule.keep.index_select(0, t.view(1)).squeeze(0)
                for h in self.hidden[1:]:
                    h.mul_(keep)
            step = self._step
            assert isinstance(step, FastStep)  # the fused gather is never built for the reference step
            return step(self.hidden, batch.inputs, batch.targets, batch.samples, batch.cols, batch.col_valid,
                        batch.active, batch.n_cols, bias=batch.bias)
        row = t.view(1)
        samples = store.index_select(0, sample_row.view(1)).squeeze(0) if store is not None else None
        return self.train_step(schedule.inputs.index_select(0, row).squeeze(0), schedule.targets.index_select(0, row).squeeze(0),
                               schedule.active.index_select(0, row).squeeze(0), schedule.keep.index_select(0, row).squeeze(0), samples)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> TrainerState:
        """The optimiser's state, the sample store's and the dropout generator's: what a checkpoint keeps."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict() if self.sampler is not None else {},
            "dropout_gen": self.dropout_gen.get_state(),
        }

    def load_state_dict(self, state: TrainerState) -> None:
        """Continue from a :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.dropout_gen.set_state(state["dropout_gen"])
