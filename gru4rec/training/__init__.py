"""Training: the session-parallel schedule, negative sampling, the losses, the optimiser, the
step and the epoch loop.

Reading order, from the data to the loop:

=====================  ==========================================================================
``batching``           the session-parallel schedule of an epoch (:func:`build_schedule`)
``sampling``           shared negative samples (:class:`SampleStore`) and the logQ correction
``losses``             the six losses (:func:`make_loss`) and their gradients (:func:`make_loss_grad`)
``optim``              the optimisers with lazy item-table updates (:class:`Optimizer`)
``precision``          float32 or bfloat16 products (:data:`PRECISIONS`, :class:`Matmuls`)
``dropout``            the step's dropout masks
``cell``               the GRU cell's forward and backward pass, PyTorch or fused
``ops``                the step's row and column operations, PyTorch or fused
``step``               one step with the backward pass written out: the mathematics
``cpu_step``           that step as one C call, where it covers the configuration
``reference``          the same step by autograd, which the fast one is tested against
``backend``            the step's form (ops, the C step, graph replay), chosen once
``trainer``            the training state and one step over it (:class:`Trainer`)
``resume``             checkpoints at step boundaries and resuming from them (:class:`TrainingCheckpoint`)
``loop``               the epoch loop (:func:`train_epochs`, :class:`EpochStats`)
``fit``                one training run of ``fit``: network, trainer, checkpoint, epochs (:class:`TrainingRun`)
=====================  ==========================================================================

The public names below are imported from their modules on first use, so that importing one
module of this package (the evaluator imports ``batching``) does not import the others.
"""
from __future__ import annotations

from typing import Any

_LAZY = {
    "EpochStats": "loop",
    "train_epochs": "loop",
    "reorder": "loop",
    "TrainingRun": "fit",
    "WarmStart": "fit",
    "Trainer": "trainer",
    "TrainingCheckpoint": "resume",
    "EpochPosition": "resume",
    "Matmuls": "precision",
    "PRECISIONS": "precision",
    "check_precision": "precision",
    "Optimizer": "optim",
    "SampleStore": "sampling",
    "Schedule": "batching",
    "assign_slots": "batching",
    "build_schedule": "batching",
    "MASK": "losses",
    "make_loss": "losses",
    "make_loss_grad": "losses",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
