"""What the CPU can do, from ``/proc/cpuinfo``: its feature flags (the fused kernels are built
for them) and whether it multiplies bfloat16 matrices natively (for ``precision='bfloat16'``)."""
from __future__ import annotations

import platform

__all__ = ["cpu_flags", "cpu_has_bf16_matmul"]


def cpu_has_bf16_matmul() -> bool | None:
    """Whether the CPU has bfloat16 matrix instructions (AVX-512 BF16 or AMX-BF16), which make
    bfloat16 products several times faster than float32 ones; without them bfloat16 products are
    emulated and slower. None where it cannot be told (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        return None
    return None


def cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` builds for them), or '' where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
