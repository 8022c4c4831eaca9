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

* **graph replay**: whether the epoch loop replays a captured CUDA graph of the step
  (:mod:`gru4rec.kernels.gpu`; CUDA only, ``GRU4REC_CUDA_GRAPHS=0`` turns it off).

The environment switches are those of :mod:`gru4rec.kernels.switches`; they are read here, when
the backend is chosen, and nowhere in the training code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gru4rec.kernels.cpu import cpu_kernels as built_cpu_kernels
from gru4rec.kernels.switches import cuda_graphs_allowed, fused_gpu_requested
from gru4rec.kernels.triton_support import triton_unavailable
from gru4rec.training.ops import CpuKernelOps, TorchOps

__all__ = ["BACKENDS", "Backend", "select_backend"]

#: The names of the ops implementations (:attr:`Backend.name`).
BACKENDS = ("torch", "cpu-kernels", "triton")


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

    @property
    def name(self) -> str:
        """``torch``, ``cpu-kernels`` or ``triton``."""
        return self.ops.name

    def describe(self) -> str:
        """One line for logs and benchmarks, e.g. ``cuda:0 float32, triton ops, scratch rows, graph replay``."""
        rows = "unique rows" if self.unique_rows else "scratch rows"
        replay = ", graph replay" if self.graph_replay else ""
        return f"{self.device} {str(self.dtype).removeprefix('torch.')}, {self.name} ops, {rows}{replay}"


def select_backend(
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    *,
    unique_rows: bool | None = None,
    cpu_kernels: bool | None = None,
    fused_gpu: bool | None = None,
    graph_replay: bool | None = None,
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
    if cpu_kernels and not applies:
        raise ValueError("the fused CPU kernels apply to float32 tables on the CPU with unique rows only")
    found = built_cpu_kernels() if applies and cpu_kernels is not False else None
    if cpu_kernels and found is None:
        raise ValueError("the fused CPU kernels are not available here (see the warning, or GRU4REC_CPU_KERNELS)")
    return Backend(device, dtype, unique, TorchOps() if found is None else CpuKernelOps(found), replay)
