"""Suite-wide fixtures."""
from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def python_sigint_handler() -> Iterator[None]:
    """Every test sees SIGINT as an interactive ``make test`` has it: Python's own handler, which
    raises KeyboardInterrupt. A shell starts background jobs (``make test &``, ``nohup``, CI
    runners) with SIGINT ignored, and Python then keeps it ignored, so the Ctrl-C tests would
    test nothing there; the inherited handler is put back after each test."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


def _triton_interpreter_without_cuda() -> None:
    """Without a CUDA device, the Triton kernels (gru4rec/kernels/triton_*.py) are tested on CPU
    tensors through Triton's interpreter. Triton reads the switch when a kernel is defined, so it
    is set before any test module imports one."""
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_triton_interpreter_without_cuda()
