"""The training step's dropout masks: drawn in place into one fixed buffer from the trainer's own
generator, so that a step creates no tensor for them, a CUDA graph can replay the draws, and a
checkpoint can save the generator's state.

Inverted dropout: a unit is kept with probability 1 − p and a kept value is scaled by 1/(1 − p).
Embedding dropout acts on the rows that feed layer 0 (not in one-hot mode: the model sets its
probability to 0 there), hidden dropout on every layer's output — which is both the next layer's
input and the state carried to the next step.

Every mask of a step is drawn at the step's start (:meth:`DropoutMasks.draw`): one uniform draw
over one buffer — the embedding mask, then each layer's hidden mask — and one threshold pass per
probability, however many layers there are (a GPU step launches two or three kernels for all of
its dropout, not three per mask).

**Id dropout** (a network with item attributes and ``dropout_p_id`` > 0): a step drops the id
part of a share of its items, which are then composed from their attributes alone
(:mod:`gru4rec.items.rows`). Whether item i is kept is a function of (i, the step's salt) — a
32-bit integer hash of the two compared with p — so that every occurrence of an item in a step
(a target, a sample, an input) agrees, whichever step form asks and in whatever order, at a
cost in the step's items, never in the catalogue's size. The salt is one integer drawn per step
from the same generator, after the masks (a plain network draws exactly what it drew before).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gru4rec.network.gru import GRU4RecNet

__all__ = ["DropoutMasks", "Threshold", "Uniform", "keep_masks"]

_M32 = 0xFFFFFFFF

#: ``threshold(u, split, p_first, p_rest)``: the uniform draws in ``u`` (flat) become the masks in
#: place, with probability ``p_first`` before position ``split`` and ``p_rest`` from there on.
Threshold = Callable[[Tensor, int, float, float], None]
#: ``uniform(u, generator)``: ``u`` := torch.rand's draws from ``generator`` (in place; the
#: training backend's ``ops.dropout_uniform``: torch.rand itself, or the same draws by a kernel).
Uniform = Callable[[Tensor, torch.Generator], None]


def _keep_mask(mask: Tensor, p: float) -> Tensor:
    """The uniform draws in ``mask`` become the dropout mask in place: 1/(1 − p) where u ≥ p, else 0."""
    return mask.ge_(p).mul_(1.0 / (1.0 - p))


def keep_masks(u: Tensor, split: int, p_first: float, p_rest: float) -> None:
    """:data:`Threshold` in PyTorch: 1/(1 − p) where u ≥ p, else 0, one pass per part."""
    if split > 0:
        _keep_mask(u[:split], p_first)
    if split < u.numel():
        _keep_mask(u[split:], p_rest)


class DropoutMasks:
    """The mask buffers of one trainer (B × d₀ for the embedding, B × Lᵢ per layer; None where
    that dropout is off), views into one flat buffer, and the generator they are drawn from."""

    def __init__(self, net: GRU4RecNet, batch_size: int, seed: int, threshold: Threshold, uniform: Uniform) -> None:
        """``threshold``: how uniform draws become masks (the training backend's
        ``ops.dropout_threshold``: :func:`keep_masks` or a fused kernel); ``uniform``: how they
        are drawn from ``generator`` (``ops.dropout_uniform``: torch.rand, or its draws by a kernel)."""
        self.threshold, self.uniform = threshold, uniform
        p = net.Wy
        self.generator = torch.Generator(device=p.device)
        self.generator.manual_seed(seed)
        self.p_embed, self.p_hidden = net.dropout_p_embed, net.dropout_p_hidden
        self.p_id = net.dropout_p_id
        #: The step's id-dropout salt (one int64, drawn in place by :meth:`draw`).
        self._salt = torch.zeros(1, device=p.device, dtype=torch.int64)
        #: An item is kept where its hash is at least this (p of the 2**32 hash values).
        self._id_threshold = int(round(self.p_id * 2**32))
        d0 = net.input_table.shape[1]
        sizes = ([batch_size * d0] if self.p_embed > 0 else []) + ([batch_size * n for n in net.sizes] if self.p_hidden > 0 else [])
        self._buffer = torch.empty(sum(sizes), device=p.device, dtype=p.dtype)
        views = list(torch.split(self._buffer, sizes)) if sizes else []
        #: Where the embedding mask ends in the buffer (0 without embedding dropout).
        self._split = batch_size * d0 if self.p_embed > 0 else 0
        #: The embedding mask (B × d₀), or None without embedding dropout.
        self.embed = views.pop(0).view(batch_size, d0) if self.p_embed > 0 else None
        #: One mask per layer (B × Lᵢ), or None without hidden dropout.
        self.hidden = [v.view(batch_size, n) for v, n in zip(views, net.sizes)] if self.p_hidden > 0 else None

    @property
    def active(self) -> bool:
        """Whether a step draws masks (from ``generator``)."""
        return self.embed is not None or self.hidden is not None or self.p_id > 0

    def draw(self) -> None:
        """New masks for a step: one uniform draw over the buffer, then the thresholds (uniform +
        compare is ~5x faster than ``bernoulli_`` on the CPU, and as graph-safe); then, with id
        dropout, the step's salt."""
        if self._buffer.numel():
            self.uniform(self._buffer, self.generator)
            self.threshold(self._buffer, self._split, self.p_embed, self.p_hidden)
        if self.p_id > 0:
            self._salt.random_(0, 2**31, generator=self.generator)

    def keep_ids(self, items: Tensor) -> Tensor | None:
        """Which of ``items`` (int64 item indices, any shape) keep their id part in this step
        (bool, same shape; :meth:`draw` first); None without id dropout. Cold items are composed
        without an id part whatever this says."""
        if self.p_id <= 0:
            return None
        # A 32-bit multiply-xorshift mix of the item and the salt, in int64: every value is below
        # 2**32 after the mask and every multiplier below 2**31, so that no product overflows.
        x = (items * 0x5BD1E995 + self._salt) & _M32
        x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
        x = ((x ^ (x >> 15)) * 0x6A09E667) & _M32
        x = x ^ (x >> 16)
        return x >= self._id_threshold

    def drop_embedding(self, x: Tensor) -> Tensor:
        """The layer-0 input rows ``x`` (B × d₀) times the step's embedding mask (:meth:`draw` first)."""
        return x if self.embed is None else x * self.embed

    def drop_hidden(self, out: Tensor, i: int) -> Tensor:
        """Layer ``i``'s output times the step's mask for it (:meth:`draw` first)."""
        return out if self.hidden is None else out * self.hidden[i]
