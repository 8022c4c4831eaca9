"""Keep freed tensor memory for reuse instead of handing it back to the system (CPU training).

PyTorch's CPU allocator calls ``malloc``/``free`` directly. glibc serves large requests (over a
dynamic threshold of 128 KiB to 32 MiB) with fresh ``mmap`` regions and unmaps them on ``free``, so
a temporary of a few megabytes — a step's score matrix, its gathered item rows, the optimiser's
scratch over the dense weights — costs a page fault per 4 KiB page *every step*. Measured on the
rsc15 configuration (2 cores), that was half of the step's time (2.3 ms → 1.1 ms per step).

:func:`keep_freed_memory` raises glibc's mmap and trim thresholds once per process, so these
blocks are recycled from the heap like small ones. It is what the usual advice of preloading
jemalloc/tcmalloc for PyTorch on CPUs achieves, without preloading anything. It changes nothing
but the allocator's thresholds (the process keeps up to ~1 GiB of freed memory for reuse), applies
only to glibc on Linux, and is skipped with ``GRU4REC_MALLOPT=0``.
"""
from __future__ import annotations

import ctypes
import sys

from gru4rec.kernels.switches import mallopt_allowed

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap/trim thresholds (once per process). Returns whether they are set."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux") or not mallopt_allowed():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): leave the allocator alone
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _done = bool(
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
        and mallopt(_M_TRIM_THRESHOLD, 1 << 30)
        and mallopt(_M_TOP_PAD, 64 << 20)
    )
    return _done
