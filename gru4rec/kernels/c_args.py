"""The arguments of the C kernels (:mod:`gru4rec.kernels.cpu`): the ctypes types of their
parameters, and the checks that a tensor passed by its address is what the C code reads —
contiguous, on the CPU, of the dtype and size it assumes — each returning the address (or the
size) the call passes. A wrong argument is a ValueError naming it, never a read out of bounds.

The checks run on every argument of every kernel call of a training step (~30 a step): dtypes
are compared by identity and ``is_cpu`` read instead of building ``t.device``, which halves their cost.
"""
from __future__ import annotations

import ctypes

import torch
from torch import Tensor

__all__ = ["F32", "FLOAT", "I64", "INT64", "VOIDP", "check_float", "check_float_vector", "check_index", "check_matrix",
           "check_scores", "optional_float"]

#: The ctypes types of the kernels' parameters: an address, an int64_t, a float.
VOIDP, INT64, FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
#: The tensor dtypes the kernels read (compared by identity).
F32, I64 = torch.float32, torch.int64


def check_scores(x: Tensor, name: str) -> tuple[int, int]:
    """(B, C) of a score matrix with each row's positive in its own column (B ≤ C)."""
    if x.dim() != 2 or x.shape[0] > x.shape[1]:
        raise ValueError(f"{name} must be a B×C score matrix with B ≤ C, got {tuple(x.shape)}")
    check_float(x, name, x.numel())
    return x.shape[0], x.shape[1]


def check_matrix(t: Tensor, name: str) -> tuple[int, int]:
    if t.dim() != 2:
        raise ValueError(f"{name} must be a matrix, got shape {tuple(t.shape)}")
    check_float(t, name, t.numel())
    return t.shape[0], t.shape[1]


def optional_float(t: Tensor | None, name: str, numel: int) -> int | None:
    """The address of an optional float32 buffer (None: NULL)."""
    return None if t is None else check_float(t, name, numel)


def check_float(t: Tensor, name: str, numel: int) -> int:
    if t.dtype is not F32 or not t.is_cpu or not t.is_contiguous() or t.numel() != numel:
        raise ValueError(
            f"{name} must be a contiguous float32 CPU tensor of {numel} elements, got {t.dtype} {tuple(t.shape)} on {t.device}"
        )
    return t.data_ptr()


def check_float_vector(t: Tensor, name: str) -> int:
    """Number of elements of ``t`` (a contiguous 1-D float32 CPU tensor of any length)."""
    if t.dtype is not F32 or not t.is_cpu or not t.is_contiguous() or t.dim() != 1:
        raise ValueError(f"{name} must be a contiguous 1-D float32 CPU tensor, got {t.dtype} {tuple(t.shape)} on {t.device}")
    return t.shape[0]


def check_index(t: Tensor, name: str, bound: int) -> int:
    """Number of indices in ``t`` (contiguous int64 on the CPU). Their range is the caller's
    contract (they come from the step's own tables): checking it would cost a pass per call."""
    if t.dtype is not I64 or not t.is_cpu or not t.is_contiguous() or t.dim() != 1:
        raise ValueError(f"{name} must be a contiguous 1-D int64 CPU tensor (indices below {bound})")
    return t.shape[0]
