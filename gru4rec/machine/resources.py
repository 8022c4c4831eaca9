"""Peak memory of this process, as the per-epoch records report it (``EpochInfo``, run folders,
TensorBoard): the host's peak resident set size and, on CUDA, the peak memory torch allocated.

Both are peaks since the process (or the last ``torch.cuda.reset_peak_memory_stats``) started,
so a sequence of epochs shows when memory grew.
"""
from __future__ import annotations

import resource
import sys

import torch

__all__ = ["peak_device_memory_mb", "peak_host_memory_mb"]


def peak_host_memory_mb() -> float:
    """Peak resident set size of this process in MiB (``getrusage``; KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def peak_device_memory_mb(device: torch.device) -> float | None:
    """Peak memory torch allocated on ``device`` in MiB (``torch.cuda.max_memory_allocated``);
    None off CUDA."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20
