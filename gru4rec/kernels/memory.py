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

Both change the whole process's allocator, so only a process that asks gets them: the package's
own command lines (``gru4rec``, ``run.py``, ``paropt.py`` and paropt's worker processes) call
:func:`keep_freed_memory` when they start; a program that imports gru4rec calls it itself where it
wants the speed (CPU training). Until it is called, :func:`training_tables_on_huge_pages` is False
and ``GRU4Rec(...).fit()`` leaves the allocator as it found it (tests/test_process_state.py).

:func:`use_huge_pages` backs the tables a training step reads and writes — the item tables and
their optimiser state, of which a step gathers and updates ~2,000 scattered rows, and the dense
weights with theirs — by 2 MiB pages (Linux's transparent huge pages, asked for with
``madvise``: most hosts enable them only where asked). With 4 KiB pages nearly every scattered
row is a TLB miss; DIGINETICA's step (88 MB tables) was 1.5-2 % faster with huge pages. It
changes no value, and is skipped with ``GRU4REC_HUGE_PAGES=0``.
"""
from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gru4rec.kernels.switches import huge_pages_allowed, mallopt_allowed

if TYPE_CHECKING:  # not imported at run time: the command line calls keep_freed_memory before it needs torch
    from torch import Tensor

__all__ = ["keep_freed_memory", "training_tables_on_huge_pages", "use_huge_pages"]

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems

_done: bool | None = None  # None: not asked for in this process


def keep_freed_memory() -> bool:
    """Raise glibc's mmap/trim thresholds (once per process), and let trainers built from now on
    back their tables by huge pages (:func:`training_tables_on_huge_pages`): this process asks for
    the allocator tuning. Returns whether the thresholds are set."""
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


def training_tables_on_huge_pages() -> bool:
    """Whether a trainer asks for huge pages for its tables (:func:`use_huge_pages`): only in a
    process that asked for the allocator tuning (:func:`keep_freed_memory`), as a table freed into
    the heap keeps its pages' advice for whatever the process allocates there next."""
    return _done is not None


_MADV_HUGEPAGE = 14  # mark the range for transparent huge pages (Linux 2.6.38)
_MADV_COLLAPSE = 25  # and collapse its pages into huge ones now, not when khugepaged passes (Linux 6.1)
_HUGE_PAGE = 2 << 20


def use_huge_pages(tensors: Iterable[Tensor]) -> int:
    """Ask Linux to back the whole 2 MiB pages inside each CPU tensor by huge pages, at once where
    the kernel can (``MADV_COLLAPSE``), else as its background collapsing gets there. Returns
    the bytes collapsed now (0 elsewhere than Linux, with ``GRU4REC_HUGE_PAGES=0``, where the
    host disables transparent huge pages, or for tensors under 2 MiB)."""
    if not sys.platform.startswith("linux") or not huge_pages_allowed():
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    collapsed = 0
    for t in tensors:
        if t.device.type != "cpu":
            continue
        address = t.data_ptr()
        start = -(-address // _HUGE_PAGE) * _HUGE_PAGE
        end = (address + t.numel() * t.element_size()) // _HUGE_PAGE * _HUGE_PAGE
        if end > start and madvise(start, end - start, _MADV_HUGEPAGE) == 0 and madvise(start, end - start, _MADV_COLLAPSE) == 0:
            collapsed += end - start
    return collapsed
