"""Whether the fused GPU kernels (Triton, ``gru4rec/kernels/triton_*.py``) can run on a device.

Triton compiles its kernels for CUDA devices. With ``TRITON_INTERPRET=1`` (read by Triton when a
kernel module is imported) it runs the same kernels on CPU tensors instead, one program at a time
in NumPy: slow, but it is how every kernel is tested without a GPU (``tests/conftest.py`` sets it
where no CUDA device is present). Triton comes with CUDA builds of torch, or ``pip install
gru4rec[gpu]``.
"""
from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["interpreting", "require", "triton_unavailable"]


def interpreting() -> bool:
    """Whether Triton runs its kernels in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip() not in ("", "0")


def triton_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device``, or None when they can: a CUDA device
    with Triton installed, or CPU tensors under the interpreter (tests)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install 'gru4rec[gpu]')"
    if device.type == "cuda":
        return None if torch.cuda.is_available() and not interpreting() else "CUDA is not available, or TRITON_INTERPRET is set"
    if device.type == "cpu":
        return None if interpreting() else "on the CPU the Triton kernels run only in the interpreter (TRITON_INTERPRET=1)"
    return f"the Triton kernels do not run on {device.type} devices"


def require(condition: bool, message: str) -> None:
    """A ValueError with ``message`` unless ``condition``: the kernels' argument checks."""
    if not condition:
        raise ValueError(message)
