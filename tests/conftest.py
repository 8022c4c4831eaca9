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


def _quiet_triton_teardown() -> None:
    """Triton's bindings (nanobind) report 'leaked' objects on stderr while the interpreter shuts
    down — a known report of Triton's own, which it silences the same way in its compile workers.
    After the test run has printed its summary, standard error goes to /dev/null, so that the
    summary stays the last line of the run."""
    import atexit
    import os
    import sys

    def silence() -> None:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    atexit.register(silence)


_quiet_triton_teardown()
