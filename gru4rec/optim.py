"""GRU4Rec's optimisers (spec §6) with lazy updates of the item tables.

Every method first turns the gradient g into a step direction ĝ (``adapt``), then applies
classical momentum and L2 in one rule shared by all methods:

    adagrad   acc ← acc + g²;             ĝ = g / sqrt(acc + ε)
    rmsprop   acc ← ρ·acc + (1 − ρ)·g²;   ĝ = g / sqrt(acc + ε)
    adadelta  acc ← ρ·acc + (1 − ρ)·g²;   ĝ = g·sqrt(dacc + ε) / sqrt(acc + ε);
              dacc ← ρ·dacc + (1 − ρ)·ĝ²  (learning rate forced to 1)
    adam      m ← β1·m + (1 − β1)·g;  acc ← β2·acc + (1 − β2)·g²;
              ĝ = (m / (1 − β1^t)) / (sqrt(acc / (1 − β2^t)) + ε)   (t = global step count)
    sgd       ĝ = g

    μ > 0:  vel ← μ·vel − lr·(ĝ + λ·p);  p ← p + vel
    μ = 0:  p ← p − lr·(ĝ + λ·p)

with ε = 1e-6. Item tables (``Wy``, ``By``, ``E``, ``Wx_0`` in one-hot mode) are updated only at
the rows a step uses. Their state is full-size but read and written only at those rows, so a
row's momentum decays only when the row is used. The gradients of duplicate indices are summed per
row first, and every duplicate then computes the same new row, which makes the scattered write
order-independent; no ``unique`` (a host sync on CUDA) is needed. ``grad_cap`` clips the global
norm of all gradients, dense and summed sparse rows together.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .config import Config

__all__ = ["Optimizer", "EPS"]

EPS = 1e-6


@dataclass
class _State:
    """Optimiser state of one parameter (full-size tensors; absent ones are None)."""

    acc: Tensor | None = None
    dacc: Tensor | None = None
    m: Tensor | None = None
    vel: Tensor | None = None
    scratch: Tensor | None = field(default=None, repr=False)  # zeros; sums duplicate rows


class Optimizer:
    """Updates a :class:`~gru4rec.model.GRU4RecNet` in place from its gradients.

    ``step(dense_grads, sparse_grads)``: ``dense_grads`` in the order of ``dense`` names;
    ``sparse_grads`` maps a table's name to (row indices K, gradient rows K×…), duplicates allowed.
    """

    def __init__(self, dense: dict[str, nn.Parameter], sparse: dict[str, nn.Parameter], config: Config) -> None:
        self.method = config.adapt
        params = config.resolved_adapt_params
        self.rho = params[0] if self.method in ("rmsprop", "adadelta") else 0.0
        self.beta1, self.beta2 = (params[0], params[1]) if self.method == "adam" else (0.0, 0.0)
        self.lr = 1.0 if self.method == "adadelta" else float(config.learning_rate)
        self.momentum = float(config.momentum)
        self.lmbd = float(config.lmbd)
        self.grad_cap = float(config.grad_cap)
        self.dense = dense
        self.sparse = sparse
        self.state: dict[str, _State] = {}
        for name, p in {**dense, **sparse}.items():
            zeros = lambda: torch.zeros_like(p, requires_grad=False)  # noqa: E731
            st = _State()
            if self.method != "sgd":
                st.acc = zeros()
            if self.method == "adadelta":
                st.dacc = zeros()
            if self.method == "adam":
                st.m = zeros()
            if self.momentum > 0:
                st.vel = zeros()
            if name in sparse:
                st.scratch = zeros()
            self.state[name] = st
        any_param = next(iter(sparse.values()))
        self.t = torch.zeros((), device=any_param.device, dtype=any_param.dtype)  # adam's step count
        self._count = torch.zeros(any_param.shape[0], device=any_param.device, dtype=any_param.dtype)

    # ------------------------------------------------------------------ the rules

    def _direction(self, g: Tensor, p: Tensor, st: _State, rows: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """ĝ and the new values of the state tensors (whole, or at ``rows``)."""

        def old(t: Tensor | None) -> Tensor:
            assert t is not None
            return t if rows is None else t.index_select(0, rows)

        new: dict[str, Tensor] = {}
        if self.method == "sgd":
            return g, new
        if self.method == "adagrad":
            acc = old(st.acc) + g * g
            new["acc"] = acc
            return g * torch.rsqrt(acc + EPS), new
        if self.method == "rmsprop":
            acc = torch.lerp(g * g, old(st.acc), self.rho)
            new["acc"] = acc
            return g * torch.rsqrt(acc + EPS), new
        if self.method == "adadelta":
            acc = torch.lerp(g * g, old(st.acc), self.rho)
            dacc_old = old(st.dacc)
            d = g * torch.sqrt(dacc_old + EPS) * torch.rsqrt(acc + EPS)
            new["acc"] = acc
            new["dacc"] = torch.lerp(d * d, dacc_old, self.rho)
            return d, new
        # adam (self.t already counts this step)
        m = torch.lerp(g, old(st.m), self.beta1)
        acc = torch.lerp(g * g, old(st.acc), self.beta2)
        new["m"], new["acc"] = m, acc
        m_hat = m / (1.0 - self.beta1**self.t)
        v_hat = acc / (1.0 - self.beta2**self.t)
        return m_hat / (torch.sqrt(v_hat) + EPS), new

    def _apply(self, p: Tensor, d: Tensor, st: _State, rows: Tensor | None) -> Tensor:
        """The parameter's new value (whole, or at ``rows``) given the direction ``d``."""
        if self.lmbd > 0:
            d = d + self.lmbd * p
        if self.momentum > 0:
            assert st.vel is not None
            vel_old = st.vel if rows is None else st.vel.index_select(0, rows)
            vel = vel_old * self.momentum - self.lr * d
            if rows is None:
                st.vel.copy_(vel)
            else:
                st.vel.index_copy_(0, rows, vel)
            return p + vel
        return p - self.lr * d

    # ------------------------------------------------------------------ one step

    @torch.no_grad()
    def step(self, dense_grads: list[Tensor], sparse_grads: dict[str, tuple[Tensor, Tensor]]) -> None:
        if self.method == "adam":
            self.t += 1
        summed: dict[str, tuple[Tensor, Tensor]] = {}
        for name, (rows, g) in sparse_grads.items():
            scratch = self.state[name].scratch
            assert scratch is not None
            scratch.index_add_(0, rows, g)
            summed[name] = (rows, scratch.index_select(0, rows))
            scratch.index_fill_(0, rows, 0.0)
        if self.grad_cap > 0:
            scale = self._clip_scale(dense_grads, summed)
            dense_grads = [g * scale for g in dense_grads]
            summed = {name: (rows, g * scale) for name, (rows, g) in summed.items()}

        for (name, p), g in zip(self.dense.items(), dense_grads):
            st = self.state[name]
            d, new = self._direction(g, p, st, None)
            for key, value in new.items():
                getattr(st, key).copy_(value)
            p.copy_(self._apply(p, d, st, None))

        for name, (rows, g) in summed.items():
            p, st = self.sparse[name], self.state[name]
            d, new = self._direction(g, p, st, rows)
            for key, value in new.items():
                getattr(st, key).index_copy_(0, rows, value)
            p.index_copy_(0, rows, self._apply(p.index_select(0, rows), d, st, rows))

    def _clip_scale(self, dense_grads: list[Tensor], summed: dict[str, tuple[Tensor, Tensor]]) -> Tensor:
        """min(1, grad_cap / ‖all gradients‖), each unique sparse row counted once."""
        total = torch.zeros((), device=self.t.device, dtype=self.t.dtype)
        for g in dense_grads:
            total = total + (g * g).sum()
        for rows, g in summed.values():
            # A row that appears c times contributes c copies of its summed gradient: divide by c.
            self._count.index_add_(0, rows, torch.ones_like(rows, dtype=self._count.dtype))
            count = self._count.index_select(0, rows)
            self._count.index_fill_(0, rows, 0.0)
            sq = (g * g).reshape(g.shape[0], -1).sum(1)
            total = total + (sq / count).sum()
        return torch.clamp(self.grad_cap / (torch.sqrt(total) + 1e-12), max=1.0)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {"t": self.t}
        for name, st in self.state.items():
            for key in ("acc", "dacc", "m", "vel"):
                value = getattr(st, key)
                if value is not None:
                    out[f"{name}.{key}"] = value
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            self.t.copy_(state["t"])
            for name, st in self.state.items():
                for key in ("acc", "dacc", "m", "vel"):
                    value = getattr(st, key)
                    if value is not None:
                        value.copy_(state[f"{name}.{key}"])
