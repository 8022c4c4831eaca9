"""The CPU's training step as one C call: :class:`FusedCpuStep`.

:class:`~gru4rec.training.step.FastStep` runs a step as ~40 PyTorch operators and fused-kernel
calls with Python between them; on small configurations (rsc15's: 100 units, batch 32) the Python
is about a quarter of the step (``perf``: docs/speed-history.md, "Round 3"). ``g4r_train_step`` of
``gru4rec/kernels/cpu_step.c`` is the same step — the same kernels, in the same order, and
MKL's ``sgemm_`` (the one torch links) for the products — in one call. What it covers:

* the fused CPU kernels (float32 tables on the CPU, distinct score rows), float32 products;
* shared embedding (the input rows are ``Wy``'s), the tanh GRU cell, up to 8 layers;
* the cross-entropy losses without smoothing (their masked columns through the bias), and BPR-max
  after an elu-A or linear final activation (the loss kernel applies elu-A, as FastStep's does);
* any dropout, logQ, and any optimiser without ``grad_cap``: the call ends with the optimiser's
  update — its own rules, bound once (:attr:`Optimizer.fused_tables`), Adam's corrections set
  before each call (:meth:`Optimizer.begin_fused_step`) — and By's gradient summed in C, so no
  torch operator runs between the step and the update (on DIGINETICA's shapes the first one
  after the step's ~12 ms took 0.12 ms, its code out of the cache).

Anything else — or a torch library that exports no ``sgemm_``, or a big-endian machine — runs
FastStep (:func:`covers` and :func:`fused_cpu_step` say why). The backend chooses (its
:meth:`~gru4rec.training.backend.Backend.cpu_step`): a configuration this step does not cover is an
INFO line once, a missing ``sgemm_`` a WARNING once. The results are FastStep's bit for bit:
losses, weights, optimiser state and hidden states (``tests/test_cpu_step.py``).
"""
from __future__ import annotations

import ctypes
from typing import Protocol

import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.config.values import SOFTMAX_LOSSES
from gru4rec.kernels.cpu import LAYER_FIELDS, MAX_LAYERS, CpuKernels, StepStruct, TablesUpdate, sgemm_binding
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.dropout import DropoutMasks
from gru4rec.training.sampling import LogQ

__all__ = ["FusedCpuStep", "StepOptimizer", "covers", "fused_cpu_step"]


class StepOptimizer(Protocol):
    """What the C step binds of the optimiser (:class:`gru4rec.training.optim.Optimizer`, not
    imported here: it imports the backend, which builds this step): the flat dense buffer and its
    gradient, each dense parameter's gradient view, the id scratch tables of its unique rows and
    its fused update of every table."""

    flat: Tensor
    flat_grad: Tensor
    grad_views: dict[str, Tensor]
    _slot: Tensor
    _mark: Tensor

    @property
    def fused_tables(self) -> TablesUpdate | None: ...

    def begin_fused_step(self) -> None: ...

def covers(config: Config, *, float32_products: bool) -> str | None:
    """None where the C step covers ``config`` (with float32 products or not), else why not: the
    configuration's side of :func:`fused_cpu_step`, which the backend names when it declines."""
    if config.embedding_mode != "shared":
        return f"embedding mode {config.embedding_mode!r} (the C step has the shared one)"
    act = config.final_activation
    if config.loss in SOFTMAX_LOSSES:
        if config.smoothing > 0:
            return f"loss {config.loss!r} with smoothing (the C step has it without)"
    elif config.loss != "bpr-max" or act.name not in ("elu", "linear"):
        return f"loss {config.loss!r} with final_act {act.name!r} (the C step has cross-entropy, and bpr-max after elu or linear)"
    if config.hidden_activation.name != "tanh" or not float32_products:
        return "a candidate activation other than tanh, or 16-bit products"
    if config.grad_cap > 0:
        return "grad_cap (clipping reads all gradients before the update)"
    if len(config.layers) > MAX_LAYERS:
        return f"more than {MAX_LAYERS} layers"
    return None


def fused_cpu_step(net: GRU4RecNet, config: Config, optimizer: StepOptimizer, kernels: CpuKernels | None, dropout: DropoutMasks,
                   logq: LogQ | None, hidden: list[Tensor], *, float32_products: bool) -> tuple[FusedCpuStep | None, str]:
    """The one-call step for this configuration, or None and the reason it does not cover it.
    ``hidden``: the trainer's hidden states (advanced in place, step after step)."""
    if kernels is None or optimizer.fused_tables is None:
        return None, "no fused CPU kernels"
    why = covers(config, float32_products=float32_products)
    if why is None and (net.mode != config.embedding_mode or net.hidden_act.name != config.hidden_activation.name):
        why = "a network built for another configuration"
    if why is None and sgemm_binding()[0] is None:
        why = sgemm_binding()[1]
    if why is not None:
        return None, why
    return FusedCpuStep(net, config, optimizer, kernels, dropout, logq, hidden), ""


class FusedCpuStep:
    """:class:`~gru4rec.training.step.FastStep` for the configurations of :func:`fused_cpu_step`,
    as one C call bound once to the network's tables, the optimiser's gradient buffers, the
    trainer's hidden states, the dropout masks and its own scratch buffers."""

    def __init__(self, net: GRU4RecNet, config: Config, optimizer: StepOptimizer, kernels: CpuKernels, dropout: DropoutMasks,
                 logq: LogQ | None, hidden: list[Tensor]) -> None:
        self.optimizer, self.dropout = optimizer, dropout
        self._fn = kernels.train_step_fn
        act = config.final_activation
        B, S = config.batch_size, config.n_sample
        C, U = B + S, 2 * B + S
        N, d = net.Wy.shape
        sizes = [layer.Wh.shape[0] for layer in net.layers]
        widest = max(sizes)
        f32, i64 = torch.float32, torch.int64
        self.B, self.S, self.inv_b = B, S, 1.0 / float(B)
        scratch: dict[str, Tensor | None] = {
            "cols": torch.empty(C, dtype=i64), "rows_all": torch.empty(U, dtype=i64), "uniq": torch.empty(U, dtype=i64),
            "inverse": torch.empty(U, dtype=i64),
            "slot": optimizer._slot, "mark": optimizer._mark,
            "col_valid": torch.empty(C, dtype=f32), "wy": torch.empty(C, d, dtype=f32), "bias": torch.empty(C, dtype=f32),
            "x0": torch.empty(B, d, dtype=f32), "s": torch.empty(B, C, dtype=f32), "scores": torch.empty(B, C, dtype=f32),
            "g_rows": torch.empty(B * C, dtype=f32), "g_out": torch.empty(B, max(d, widest), dtype=f32),
            "dv": torch.empty(B, 3 * widest, dtype=f32), "t": torch.empty(B, widest, dtype=f32), "w": torch.empty(B, dtype=f32),
            "g_wy": torch.empty(U, d, dtype=f32), "g_by": torch.empty(C, dtype=f32),
            "grad": torch.empty(B, C, dtype=f32) if config.loss == "bpr-max" else None,
        }
        views = optimizer.grad_views
        masks = dropout.hidden
        layer_tensors: dict[str, list[Tensor | None]] = {name: [] for name in LAYER_FIELDS}
        for i, (layer, n) in enumerate(zip(net.layers, sizes)):
            for name, t in (("Wx", layer.Wx), ("Wrz", layer.Wrz), ("Wh", layer.Wh), ("Bh", layer.Bh), ("hidden", hidden[i]),
                            ("gWx", views[f"layers.{i}.Wx"]), ("gWrz", views[f"layers.{i}.Wrz"]), ("gWh", views[f"layers.{i}.Wh"]),
                            ("gBh", views[f"layers.{i}.Bh"]), ("mask", None if masks is None else masks[i]),
                            ("v", torch.empty(B, 3 * n, dtype=f32)), ("rz", torch.empty(B, 2 * n, dtype=f32)),
                            ("hr", torch.empty(B, n, dtype=f32)), ("c", torch.empty(B, n, dtype=f32)),
                            ("out", torch.empty(B, n, dtype=f32))):
                layer_tensors[name].append(t)
        tables = {"Wy": net.Wy, "By": net.By, "logq_in": None if logq is None else logq.in_batch,
                  "logq_sample": None if logq is None else logq.sampled, "embed_mask": dropout.embed}
        #: The tensors of others (the network's, the optimiser's, the trainer's hidden states, the
        #: dropout masks) whose addresses the C side holds, with those addresses: checked before
        #: each call (the scratch is this step's own).
        self._bound: list[tuple[Tensor, int]] = []
        st = StepStruct()
        st.sgemm = sgemm_binding()[0]
        st.B, st.S, st.N, st.d, st.n_layers = B, S, N, d, len(sizes)
        st.logit_form = int(config.loss == "xe_logit")
        st.mask_in_bias = int(config.loss in SOFTMAX_LOSSES)  # the cross-entropy losses mask columns through the bias
        st.bpr_max, st.bpreg = int(config.loss == "bpr-max"), float(config.bpreg)
        st.has_elu, st.elu_alpha = int(act.name == "elu"), float(act.params[0]) if act.name == "elu" else 0.0
        for i, n in enumerate(sizes):
            st.n[i] = n
        own = {"v", "rz", "hr", "c", "out"}  # the layers' scratch
        for name, tensors in layer_tensors.items():
            arr = getattr(st, name)
            for i, t in enumerate(tensors):
                arr[i] = self._bind(t, checked=name not in own)
        for name, t in tables.items():
            setattr(st, name, self._bind(t, checked=True))
        for name, t in scratch.items():
            setattr(st, name, self._bind(t, checked=name in ("slot", "mark")))  # the optimiser's id tables are not ours
        # the optimiser's update, by its own rules (their tables and states checked as its own are)
        tables_update = optimizer.fused_tables
        if tables_update is None:
            raise ValueError("the C step runs the optimiser's fused update: the optimiser has none (no CPU kernels)")
        updates = tables_update.updates
        dense = updates.get("dense") if optimizer.flat.numel() else None
        checked = {id(t) for t, _ in self._bound}  # Wy and By are bound above already: checked once
        for name, update in (("rule_dense", dense), ("rule_wy", updates["Wy"]), ("rule_by", updates["By"])):
            setattr(st, name, None if update is None else update.rule_ptr)
            if update is not None:
                self._bound += [(t, ptr) for t, ptr in update.bound if id(t) not in checked]
        st.g_dense = self._bind(optimizer.flat_grad, checked=True)
        st.n_dense = optimizer.flat_grad.numel()
        self._st = st
        #: The last step's numbers of distinct items: scored, and in all (scored, then input-only).
        self.counts = (ctypes.c_int64 * 2)()
        self._st_address = ctypes.addressof(st)
        self._layer_scratch = layer_tensors  # kept alive with the addresses
        self._scratch = scratch

    def _bind(self, t: Tensor | None, *, checked: bool) -> int | None:
        """``t``'s address for the C side (None: NULL); ``checked``: it belongs to someone else,
        and each call checks that it has not moved."""
        if t is None:
            return None
        if not t.is_contiguous() or not t.is_cpu:
            raise ValueError("the C step needs contiguous CPU tensors")
        if checked:
            self._bound.append((t, t.data_ptr()))
        return t.data_ptr()

    @torch.no_grad()
    def __call__(self, inputs: Tensor, targets: Tensor, active: Tensor, keep: Tensor, samples: Tensor) -> Tensor:
        """The step (see FastStep) for the B slots, ``keep`` (B×1) zeroing the states of slots
        that start a session; updates the hidden states and the weights, returns the loss (0-dim)."""
        for t, ptr in self._bound:
            if t.data_ptr() != ptr:
                raise RuntimeError("a table of the C training step has moved in memory since the step was built")
        B = self.B
        for t, dtype, numel in ((inputs, torch.int64, B), (targets, torch.int64, B), (samples, torch.int64, self.S),
                                (active, torch.float32, B), (keep, torch.float32, B)):
            if t.dtype is not dtype or not t.is_contiguous() or t.numel() != numel:
                raise ValueError(f"the C training step takes contiguous {dtype} tensors of {numel} elements, "
                                 f"got {t.dtype} {tuple(t.shape)}")
        self.dropout.draw()
        self.optimizer.begin_fused_step()
        loss = torch.empty((), dtype=torch.float32)
        self._fn(self._st_address, inputs.data_ptr(), targets.data_ptr(), samples.data_ptr(), active.data_ptr(),
                 keep.data_ptr(), self.inv_b, loss.data_ptr(), self.counts)
        return loss
