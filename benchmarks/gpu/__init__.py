"""GPU measurements: kernels and device time per step (``gpu_profile``), and the tuning window
(``gpu_paropt``, run by ``benchmarks/gpu_paropt.sh``).

On a machine without CUDA the fused kernels (Triton) run through Triton's interpreter: Triton
reads ``TRITON_INTERPRET`` when a kernel is defined, so it is set here, before any module of
this package imports one (``gpu_profile`` counts the launches a GPU would get).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
