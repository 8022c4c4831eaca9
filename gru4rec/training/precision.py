"""Training precision: float32, or bfloat16 operands for the training step's matrix products.

Only the products change. Their results come back as float32, so the bias, the softmax or
log-sum-exp of the loss, the GRU gates and the optimiser work in float32 on float32 master
weights. (No float16: its 5-bit exponent would need loss scaling for the small gradients of the
score matrix; bfloat16 keeps float32's range, and GPUs multiply both at the same speed.)
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor

from gru4rec.errors import ConfigError
from gru4rec.kernels.cpu_features import cpu_has_bf16_matmul

__all__ = ["PRECISIONS", "Matmuls", "check_precision"]

#: Training precisions: ``float32`` (default) or ``bfloat16`` operands for the step's matrix products.
PRECISIONS = ("float32", "bfloat16")


def check_precision(precision: str, device: torch.device, reference: bool = False, *, warn: bool = True) -> torch.dtype | None:
    """The 16-bit operand type of ``precision`` (None for float32); ConfigError when ``precision``
    is unknown or does not apply (the reference step); with ``warn``, a warning where it would be
    slow (the :class:`~gru4rec.training.trainer.Trainer` warns; an early check of the name passes
    ``warn=False``)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "float32":
        return None
    if reference:
        raise ConfigError(f"precision={precision!r} is a mode of the fast training step; the reference step runs in float32 only")
    if warn and precision == "bfloat16" and device.type == "cpu" and cpu_has_bf16_matmul() is False:
        # A warning to the caller of the Python API about the option they chose (it is slow here).
        warnings.warn(
            "precision='bfloat16': this CPU has no bfloat16 matrix instructions (AVX-512 BF16 or AMX), "
            "so the products are emulated and training is many times slower than in float32 "
            "(23x for the diginetica configuration on an AVX2-only AMD EPYC); use precision='float32' here",
            stacklevel=3,
        )
    return torch.bfloat16


class Matmuls:
    """The training step's matrix products, in the parameters' type or in mixed precision.

    With ``low`` = None every method is the plain float32 operation and ``cast`` returns its
    argument. With ``low`` = bfloat16 the step casts each operand once (``cast``) and the
    products run on the 16-bit copies (with float32 accumulation inside the BLAS); results come
    back in ``dtype``. On GPUs this uses the tensor cores; on CPUs with AVX-512 BF16 (or AMX)
    bfloat16 products are several times faster than float32 ones.
    """

    def __init__(self, low: torch.dtype | None, dtype: torch.dtype) -> None:
        self.low, self.dtype = low, dtype

    def cast(self, t: Tensor) -> Tensor:
        """``t`` as a product operand (a bfloat16 copy in mixed precision, else ``t`` itself)."""
        return t if self.low is None else t.to(self.low)

    def mm(self, a: Tensor, b: Tensor) -> Tensor:
        """``a·b`` in ``dtype``."""
        out = torch.mm(a, b)
        return out if self.low is None else out.to(self.dtype)

    def addmm(self, bias: Tensor, a: Tensor, b: Tensor) -> Tensor:
        """``bias + a·b`` in ``dtype`` (the bias added in ``dtype``, never rounded to 16 bits)."""
        if self.low is None:
            return torch.addmm(bias, a, b)
        return torch.mm(a, b).to(self.dtype).add_(bias)

    def mm_into(self, out: Tensor, a: Tensor, b: Tensor) -> None:
        """``out ← a·b`` (``out`` in ``dtype``: a gradient buffer of the optimiser)."""
        if self.low is None:
            torch.mm(a, b, out=out)
        else:
            out.copy_(torch.mm(a, b))
