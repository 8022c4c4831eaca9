"""The environment switches of the fast paths, read here and nowhere else.

=========================  ===========================================================  =======
variable                   what it does                                                 default
=========================  ===========================================================  =======
``GRU4REC_CPU_KERNELS``    ``0``: never the fused CPU kernels (``gru4rec/kernels/cpu.py``)   on
``GRU4REC_CPU_STEP``       ``0``: never the one-call CPU step (``training/cpu_step.py``)     on
``GRU4REC_CUDA_GRAPHS``    ``0``: no CUDA-graph replay of the training step (``gpu.py``)     on
``GRU4REC_FUSED``          ``1``: the fused GPU kernels (Triton, ``triton_*.py``) on CUDA    off
``GRU4REC_MALLOPT``        ``0``: leave glibc's thresholds for freed memory alone            on
``GRU4REC_HUGE_PAGES``     ``0``: no huge pages for the training tables (``memory.py``)      on
``GRU4REC_CACHE_DIR``      where the built CPU kernels are kept                 ``~/.cache/gru4rec``
=========================  ===========================================================  =======

Each switch is read when it is asked for (a process may set it before it trains), and the
backend of a trainer (:mod:`gru4rec.training.backend`) asks once, when the trainer is built.
"""
from __future__ import annotations

import os

__all__ = ["cache_dir_override", "cpu_kernels_allowed", "cuda_graphs_allowed", "fused_cpu_step_allowed", "fused_gpu_requested",
           "huge_pages_allowed", "mallopt_allowed"]


def _flag(name: str, default: bool) -> bool:
    """``name`` as a boolean: ``0`` is off, any other value on; unset is ``default``."""
    value = os.environ.get(name)
    return default if value is None or value.strip() == "" else value.strip() != "0"


def cpu_kernels_allowed() -> bool:
    """``GRU4REC_CPU_KERNELS`` (default on)."""
    return _flag("GRU4REC_CPU_KERNELS", True)


def fused_cpu_step_allowed() -> bool:
    """``GRU4REC_CPU_STEP`` (default on)."""
    return _flag("GRU4REC_CPU_STEP", True)


def cuda_graphs_allowed() -> bool:
    """``GRU4REC_CUDA_GRAPHS`` (default on)."""
    return _flag("GRU4REC_CUDA_GRAPHS", True)


def fused_gpu_requested() -> bool:
    """``GRU4REC_FUSED`` (default off: the fused GPU kernels wait for a GPU run that shows equal
    losses at a higher speed)."""
    return _flag("GRU4REC_FUSED", False)


def mallopt_allowed() -> bool:
    """``GRU4REC_MALLOPT`` (default on)."""
    return _flag("GRU4REC_MALLOPT", True)


def huge_pages_allowed() -> bool:
    """``GRU4REC_HUGE_PAGES`` (default on)."""
    return _flag("GRU4REC_HUGE_PAGES", True)


def cache_dir_override() -> str | None:
    """``GRU4REC_CACHE_DIR``, or None when unset or empty."""
    return os.environ.get("GRU4REC_CACHE_DIR") or None
