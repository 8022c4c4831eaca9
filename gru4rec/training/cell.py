"""The GRU cell of the fast training step, forward and backward, in two implementations.

:class:`TorchGRUCell` is the cell as PyTorch code (any device, dtype, candidate activation and
precision); :class:`FusedGRUCell` runs the same arithmetic as the fused CPU kernels of
``gru4rec/kernels/cpu_kernels.c`` (float32, tanh candidate, float32 products), which are tested
against the PyTorch code. The equations and their derivative are in :mod:`gru4rec.training.step`;
for one layer of n units and B slots (layouts: ``v`` and dL/dv are [candidate | reset | update],
``rz`` is [reset | update]):

    forward    rz = σ(v_rz + h·Wrz);  hr = h ⊙ r;  c = f(v_c + hr·Wh);  out = lerp(h, c, z) ⊙ m
    backward   d ← d ⊙ m;  d_c = d ⊙ z ⊙ f'(c);  d_r = (d_c·Whᵀ) ⊙ h ⊙ r(1 − r);
               d_z = d ⊙ (c − h) ⊙ z(1 − z);  dWh = hrᵀ·d_c;  dWrz = hᵀ·[d_r | d_z];  dBh = Σ_b dL/dv
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from gru4rec.config.activations import Activation
from gru4rec.kernels.cpu import CpuKernels
from gru4rec.training.precision import Matmuls

__all__ = ["FusedGRUCell", "GRUCell", "LayerCache", "TorchGRUCell"]


class LayerCache(NamedTuple):
    """What the backward pass of one layer needs from its forward pass (products' operands as
    cast for the products: ``x_c``, ``wx``, ``h_c``, ``wh``, ``hr``)."""

    x_c: Tensor  # B × d  the layer's input
    wx: Tensor | None  # d × 3n  (None: layer 0 in one-hot mode, whose input rows are Wx_0's rows)
    h: Tensor  # B × n  the carried state (a constant of the step)
    h_c: Tensor  # B × n
    wh: Tensor  # n × n
    hr: Tensor  # B × n  h ⊙ r
    rz: Tensor  # B × 2n  [r | z]
    c: Tensor  # B × n  the candidate f(u)
    mask: Tensor | None  # B × n  the output's dropout mask (None: no dropout)


class GRUCell(Protocol):
    """One GRU layer's forward and backward pass in the layouts above."""

    #: Whether this is the fused kernels' implementation.
    fused: bool

    def forward(
        self, v: Tensor, h: Tensor, h_c: Tensor, wrz: Tensor, wh: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(rz, hr, c, out) from ``v`` = x·Wx + Bh (B × 3n), the state ``h`` (and its cast ``h_c``)."""
        ...

    def backward(self, d: Tensor, cache: LayerCache, g_wh: Tensor, g_wrz: Tensor, g_bh: Tensor) -> Tensor:
        """dL/dv (B × 3n) from ``d`` = dL/d(out); writes dL/dWh, dL/dWrz and dL/dBh into the buffers."""
        ...


class TorchGRUCell:
    """The cell as PyTorch operations: the code the fused kernels are held to."""

    fused = False

    def __init__(self, act: Activation, matmuls: Matmuls) -> None:
        self.act, self.mm = act, matmuls

    def forward(
        self, v: Tensor, h: Tensor, h_c: Tensor, wrz: Tensor, wh: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        mm, n = self.mm, h.shape[1]
        rz = torch.sigmoid(mm.addmm(v[:, n:], h_c, wrz))  # B × 2n
        hr = mm.cast(h * rz[:, :n])  # reset applied before the product
        c = self.act(mm.addmm(v[:, :n], hr, wh))  # B × n
        out = torch.lerp(h, c, rz[:, n:])  # h + z·(c − h)
        return rz, hr, c, (out if mask is None else out * mask)

    def backward(self, d: Tensor, cache: LayerCache, g_wh: Tensor, g_wrz: Tensor, g_bh: Tensor) -> Tensor:
        mm, h, rz, c = self.mm, cache.h, cache.rz, cache.c
        n = h.shape[1]
        if cache.mask is not None:
            d = d * cache.mask
        z = rz[:, n:]
        d_cand = d * z  # h_new = h + z·(c − h)
        f_prime = self.act.derivative(c)  # f'(u) from c = f(u); None where f' = 1
        if f_prime is not None:
            d_cand = d_cand * f_prime
        d_cand_c = mm.cast(d_cand)
        mm.mm_into(g_wh, cache.hr.t(), d_cand_c)
        d_r = mm.mm(d_cand_c, cache.wh.t()) * h
        d_rz = torch.cat((d_r, d * (c - h)), dim=1) * (rz * (1.0 - rz))  # B × 2n
        mm.mm_into(g_wrz, cache.h_c.t(), mm.cast(d_rz))
        d_v = torch.cat((d_cand, d_rz), dim=1)  # B × 3n
        torch.sum(d_v, 0, out=g_bh)
        return d_v


class FusedGRUCell:
    """The same cell by the fused CPU kernels: float32, tanh candidate, float32 products. The
    gates, the candidate and the output (and in the backward pass the gate derivatives and the
    bias gradient) are one pass each over B × n instead of several operators."""

    fused = True

    def __init__(self, kernels: CpuKernels) -> None:
        self.kernels = kernels

    def forward(
        self, v: Tensor, h: Tensor, h_c: Tensor, wrz: Tensor, wh: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = h.shape[1]
        rz = torch.addmm(v[:, n:], h_c, wrz)
        hr = self.kernels.gru_gates(rz, h)  # rz ← σ(rz) in place
        c = torch.addmm(v[:, :n], hr, wh)
        out = self.kernels.gru_output(c, h, rz, mask)  # c ← tanh(c) in place
        return rz, hr, c, out

    def backward(self, d: Tensor, cache: LayerCache, g_wh: Tensor, g_wrz: Tensor, g_bh: Tensor) -> Tensor:
        h, rz, n = cache.h, cache.rz, cache.h.shape[1]
        d_v = self.kernels.gru_backward_out(d, cache.mask, rz, cache.c, h)  # candidate and update parts
        torch.mm(cache.hr.t(), d_v[:, :n], out=g_wh)
        self.kernels.gru_backward_reset(torch.mm(d_v[:, :n], cache.wh.t()), h, rz, d_v, g_bh)  # reset part, dBh
        torch.mm(cache.h_c.t(), d_v[:, n:], out=g_wrz)
        return d_v
