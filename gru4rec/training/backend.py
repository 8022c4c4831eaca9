"""The backend of a training run: how each part of the step runs, decided once.

A :class:`Backend` is chosen when a :class:`~gru4rec.training.trainer.Trainer` is built (or an
:class:`~gru4rec.training.optim.Optimizer` on its own) and handed to the optimiser, the fast step
and the epoch loop, which never ask again. It fixes:

* the **device** and the tables' **dtype**;
* **unique rows**: whether duplicate rows of the item tables are made unique (a sort-free pass
  that reads its count on the host: the CPU) or summed through a zeroed scratch table, so that
  nothing is read on the host (a GPU, whose step is replayed from a CUDA graph);
* the **ops**, one of three implementations of the step's row, column, cell, loss and update
  work (:mod:`gru4rec.training.ops`):

  ==============  =========================================================================
  ``torch``       PyTorch operations, any device and dtype: the code the others are held to
  ``cpu-kernels`` the fused C kernels (``gru4rec/kernels/cpu_kernels.c``): float32 on the CPU
                  with unique rows, the default there wherever they build
  ``triton``      the fused GPU kernels (``gru4rec/kernels/triton_*.py``): float32 on CUDA
                  with scratch-table rows; off unless asked for (``GRU4REC_FUSED=1``) until a
                  GPU run has shown equal losses at a higher speed
  ==============  =========================================================================

* the **one-call step**: whether, with the ``cpu-kernels`` ops, the whole step runs as one C call
  (:mod:`gru4rec.training.cpu_step`) where it covers the configuration
  (``GRU4REC_CPU_STEP=0`` turns it off);
* **graph replay**: whether the epoch loop replays a captured CUDA graph of the step
  (:mod:`gru4rec.kernels.gpu`; CUDA only, ``GRU4REC_CUDA_GRAPHS=0`` turns it off).

So a trainer's step takes one of five forms, all chosen here (:meth:`Backend.step_form`):

=================  ==================================================================================
``reference``      autograd (:mod:`gru4rec.training.reference`): the step the others are tested against
``c-step``         the one-call C step: the CPU's default wherever it covers the configuration
``cpu-kernels``    :class:`~gru4rec.training.step.FastStep` over the fused CPU kernels: the CPU's step
                   for what the C step declines (other embedding modes and losses, ``grad_cap``,
                   bfloat16 products, another candidate activation), and where it is turned off
``torch``          FastStep over PyTorch operations: CUDA's step (the one CUDA graphs replay), and the
                   CPU's where the kernels cannot be built
``triton``         FastStep over the Triton kernels: CUDA with ``GRU4REC_FUSED=1`` only
=================  ==================================================================================

A network with **item attributes** (composed item rows, :mod:`gru4rec.items.rows`) is covered by
the forms of :data:`ATTRIBUTE_FORMS`: FastStep where rows are unique (``torch`` and ``cpu-kernels``
ops on the CPU: it composes the step's distinct items once each,
:mod:`gru4rec.training.composed`) and the reference step. The C step reads plain ``Wy`` rows and
declines such a network (said once, INFO, with what FastStep costs instead); on the scratch-row
backends (a GPU, CUDA graphs, the Triton ops) the trainer runs the reference step
(:meth:`Backend.runs_reference` says so once, INFO). There FastStep would compose the C columns
and hand their duplicate codes to the optimiser's scratch table, without a host sync for
categorical and numeric columns (a multi column's valid codes are a boolean selection: a sync,
which a CUDA graph cannot hold); not written, as no GPU has run it yet.

A network with **click context** (``Wc``, docs/attributes.md) runs FastStep, which adds the
clicks' context to layer 0's projection, or the reference step: not the C step (said once, INFO)
and not a replayed CUDA graph (the epoch loop runs its steps as they are).

A fast path that is lost says so once: a configuration that the C step does not cover is an
INFO line naming why and what it costs; a torch-internals binding that fails (MKL's ``sgemm_``
for the C step, torch's generator state for the dropout draws) a WARNING naming the cause.
``tests/test_step_contract.py`` runs every form available on the machine against the reference.

The environment switches are those of :mod:`gru4rec.kernels.switches`; they are read here, when
the backend is chosen, and nowhere in the training code.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.kernels.cpu import cpu_kernels as built_cpu_kernels
from gru4rec.kernels.cpu import lost_fast_path, sgemm_binding
from gru4rec.kernels.switches import cuda_graphs_allowed, fused_cpu_step_allowed, fused_gpu_requested
from gru4rec.kernels.triton_support import triton_unavailable
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.cpu_step import FusedCpuStep, StepOptimizer, covers, fused_cpu_step
from gru4rec.training.dropout import DropoutMasks
from gru4rec.training.ops import CpuKernelOps, TorchOps
from gru4rec.training.sampling import LogQ

__all__ = ["ATTRIBUTE_FORMS", "BACKENDS", "STEP_FORMS", "Backend", "select_backend"]

log = logging.getLogger(__name__)

#: The names of the ops implementations (:attr:`Backend.name`).
BACKENDS = ("torch", "cpu-kernels", "triton")
#: The forms of a trainer's step (:meth:`Backend.step_form`; see the module docstring).
STEP_FORMS = ("reference", "c-step", *BACKENDS)

#: The step forms that cover a network with item attributes: FastStep with unique rows (the CPU's
#: ``torch`` and ``cpu-kernels`` ops) and the reference step (the C step reads plain Wy rows).
ATTRIBUTE_FORMS = ("reference", "torch", "cpu-kernels")
#: What the reference step costs where a fast step would have run (scratch-row backends: GPU),
#: measured on the CPU (benchmarks/README.md, "Training with item attributes").
ATTRIBUTE_COST = ("the autograd step is slower: about 1.6x FastStep's time with attributes (CPU, synthetic intents, "
                  "2 categorical columns); on a GPU a multi column's step syncs with the host (its valid codes)")
#: What FastStep with attributes costs where the C step runs the plain network (benchmarks/README.md).
ATTRIBUTE_STEP_COST = ("FastStep with 2 categorical attributes takes 1.1-1.2x plain FastStep's time and 1.3-1.6x "
                       "the plain C step's (batch 128 to 32; synthetic intents, 128 units, 2,048 samples, one thread)")

#: What FastStep costs where the C step would have run (benchmarks/README.md, round 4).
C_STEP_COST = "FastStep takes up to 1.25x the C step's time (rsc15's shapes)"

_declined: set[str] = set()


@dataclass(frozen=True)
class Backend:
    """How a training run computes its step (see the module docstring)."""

    device: torch.device
    dtype: torch.dtype
    #: Duplicate item rows made unique (True: the CPU) or summed through a scratch table.
    unique_rows: bool
    #: The step's row, column, cell, loss and update operations.
    ops: TorchOps
    #: Whether the epoch loop replays a captured CUDA graph of the step.
    graph_replay: bool
    #: Whether the step runs as one C call where it covers the configuration (``cpu-kernels`` ops only).
    one_call_step: bool = False

    @property
    def name(self) -> str:
        """``torch``, ``cpu-kernels`` or ``triton``."""
        return self.ops.name

    def describe(self) -> str:
        """One line for logs and benchmarks, e.g. ``cuda:0 float32, triton ops, scratch rows, graph replay``."""
        rows = "unique rows" if self.unique_rows else "scratch rows"
        replay = ", graph replay" if self.graph_replay else ""
        one_call = ", one-call step" if self.one_call_step else ""
        return f"{self.device} {str(self.dtype).removeprefix('torch.')}, {self.name} ops, {rows}{one_call}{replay}"

    def cpu_step(self, net: GRU4RecNet, config: Config, optimizer: StepOptimizer, dropout: DropoutMasks, logq: LogQ | None,
                 hidden: list[Tensor], *, float32_products: bool) -> FusedCpuStep | None:
        """The whole step as one C call, bound to the trainer's state, where this backend runs it
        and it covers ``config``; None: the trainer's FastStep runs. A configuration it does not
        cover is said once per reason (INFO), with what FastStep costs instead."""
        if not self.one_call_step:
            return None
        if net.attributes is not None:  # the C step reads plain Wy rows: ATTRIBUTE_FORMS only
            why = "the network composes its item rows from attributes"
            if why not in _declined:
                _declined.add(why)
                log.info("the CPU step runs as FastStep over the fused kernels, not as one C call: %s; %s", why, ATTRIBUTE_STEP_COST)
            return None
        step: FusedCpuStep | None
        if net.uses_context:  # click context: FastStep adds ctx·Wc, the C step has no Wc
            step, why_not = None, "the network takes click context (the C step has no Wc)"
        else:
            step, why_not = fused_cpu_step(net, config, optimizer, self.ops.kernels, dropout, logq, hidden,
                                           float32_products=float32_products)
        if step is None and why_not not in _declined:
            _declined.add(why_not)
            log.info("the CPU step runs as FastStep over the fused kernels, not as one C call: %s; %s", why_not, C_STEP_COST)
        return step

    @property
    def covers_attributes(self) -> bool:
        """Whether FastStep on this backend covers item attributes: the CPU with rows made unique
        (``torch`` and ``cpu-kernels`` ops). Not the scratch-row backends (see the module
        docstring), nor unique rows on a GPU (asked for explicitly; no GPU has run it)."""
        return self.device.type == "cpu" and self.unique_rows and self.name in ATTRIBUTE_FORMS

    def runs_reference(self, net: GRU4RecNet, *, reference: bool) -> bool:
        """Whether a trainer of ``net`` runs the reference step: asked for (``reference``), or
        ``net`` has item attributes and FastStep does not cover them here
        (:attr:`covers_attributes`; said once, INFO, with what it costs)."""
        if reference or net.attributes is None or self.covers_attributes:
            return reference
        why = "the network composes its item rows from attributes, which FastStep covers with unique rows only (the CPU)"
        if why not in _declined:
            _declined.add(why)
            log.info("the training step runs as the autograd reference step: %s; %s", why, ATTRIBUTE_COST)
        return True

    def step_form(self, config: Config, *, reference: bool = False, float32_products: bool = True,
                  attributes: bool = False) -> str:
        """Which of :data:`STEP_FORMS` a trainer of ``config`` on this backend runs (without
        building it): for logs, benchmarks and the contract test. ``attributes``: the network has
        item attributes (only :data:`ATTRIBUTE_FORMS` cover them: FastStep with unique rows, or
        the reference step)."""
        if reference or (attributes and not self.covers_attributes):
            return "reference"
        if attributes:
            return self.name
        if self.one_call_step and not config.click_context:  # click context: FastStep, never the C step
            if covers(config, float32_products=float32_products) is None:
                return "c-step"
        return self.name


def select_backend(
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    *,
    unique_rows: bool | None = None,
    cpu_kernels: bool | None = None,
    fused_gpu: bool | None = None,
    graph_replay: bool | None = None,
    cpu_step: bool | None = None,
) -> Backend:
    """The backend for tables on ``device`` in ``dtype``.

    Each switch is None for the default, False to refuse, True to insist (a ValueError says why
    where it cannot be had):

    * ``unique_rows``: default True on the CPU, False elsewhere.
    * ``cpu_kernels``: the fused CPU kernels; default wherever they apply (CPU, float32, unique
      rows), are allowed (``GRU4REC_CPU_KERNELS``) and could be built.
    * ``fused_gpu``: the Triton kernels; default only on CUDA with ``GRU4REC_FUSED=1``. They need
      float32 tables and scratch rows (``unique_rows`` False). On CPU tensors they run only under
      Triton's interpreter (``TRITON_INTERPRET=1``, the tests).
    * ``graph_replay``: default on CUDA unless ``GRU4REC_CUDA_GRAPHS=0``; never elsewhere.
    * ``cpu_step``: the one-call C step (:mod:`gru4rec.training.cpu_step`) wherever it covers the
      configuration; default with the fused CPU kernels unless ``GRU4REC_CPU_STEP=0``. Where
      torch's ``sgemm_`` cannot be bound the default is off, with a WARNING once naming the cause.
    """
    device = torch.device(device)
    unique = device.type == "cpu" if unique_rows is None else unique_rows
    replay = device.type == "cuda" and (cuda_graphs_allowed() if graph_replay is None else graph_replay)
    if graph_replay and not replay:
        raise ValueError("CUDA-graph replay applies to CUDA devices only")

    want_fused = (device.type == "cuda" and fused_gpu_requested()) if fused_gpu is None else fused_gpu
    if want_fused:
        # The settings first (they hold on any machine), then whether Triton can run here.
        why: str | None
        if dtype != torch.float32:
            why = f"they update float32 tables, not {dtype}"
        elif unique:
            why = "they merge duplicate rows through a scratch table (unique_rows=False)"
        elif cpu_kernels:
            why = "the fused CPU kernels were asked for too"
        else:
            why = triton_unavailable(device)
        if why is not None:
            if fused_gpu:  # insisted on
                raise ValueError(f"the fused GPU kernels cannot run here: {why}")
            raise ValueError(f"GRU4REC_FUSED=1, but the fused GPU kernels cannot run here: {why}")
        from gru4rec.training.triton_ops import TritonOps  # imports Triton: only when chosen

        return Backend(device, dtype, unique, TritonOps(), replay)

    applies = device.type == "cpu" and dtype == torch.float32 and unique
    if (cpu_kernels or cpu_step) and not applies:
        raise ValueError("the fused CPU kernels (and the C step) apply to float32 tables on the CPU with unique rows only")
    found = built_cpu_kernels() if applies and (cpu_kernels is not False or cpu_step) else None
    if (cpu_kernels or cpu_step) and found is None:
        raise ValueError("the fused CPU kernels are not available here (see the warning, or GRU4REC_CPU_KERNELS)")
    if cpu_kernels is False and cpu_step:
        raise ValueError("the C step runs the fused CPU kernels: it cannot be had with cpu_kernels=False")
    one_call = found is not None and (fused_cpu_step_allowed() if cpu_step is None else cpu_step)
    if one_call and sgemm_binding()[0] is None:
        why = sgemm_binding()[1]
        if cpu_step:
            raise ValueError(f"the C step cannot run here: {why}")
        lost_fast_path("the one-call CPU step", why, f"every CPU step runs as FastStep ({C_STEP_COST})")
        one_call = False
    return Backend(device, dtype, unique, TorchOps() if found is None else CpuKernelOps(found), replay, one_call)
