"""GRU4Rec's optimisers (docs/behaviour.md §6) with lazy updates of the item tables.

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
row first, then each row takes one update: on the CPU the rows are made unique (a sort); on a GPU,
where ``unique`` would sync with the host, every duplicate receives its row's sum through a
zeroed scratch table and computes the same new row, so the order of the scattered writes does not
matter. ``grad_cap`` clips the global norm of all gradients, dense and summed sparse rows
together. The dense parameters live in one flat buffer (they are views into it), so their update
is a handful of operations however many layers there are.

On the CPU (float32, unique rows) the rules run as fused kernels (:mod:`gru4rec.kernels.cpu`): one
pass over each updated row or over the flat buffer instead of a dozen operations; the PyTorch
code below is the same rule, used where the kernels do not apply and held equal to them by tests.
Which one runs, and which implementation merges duplicate rows (:mod:`gru4rec.training.ops`), is
the backend's choice (:mod:`gru4rec.training.backend`), made once. With the Triton ops the whole
update — summing duplicates, clipping and the rule — is theirs (:meth:`TorchOps.fused_update`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from gru4rec.config import Config
from gru4rec.kernels.cpu import CpuKernels, TablesUpdate
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import Backend, select_backend
from gru4rec.training.ops import FusedUpdate, SparseGrad, TorchOps

__all__ = ["EPS", "Optimizer", "SparseGrad", "UniqueGrad", "item_table_grads"]

class UniqueGrad(NamedTuple):
    """Gradient rows already summed per row: every index in ``rows`` appears once (CPU path)."""

    rows: Tensor
    grad: Tensor


EPS = 1e-6


def item_table_grads(
    net: GRU4RecNet, inputs: Tensor, cols: Tensor, g_in: Tensor, g_wy: Tensor, g_by: Tensor
) -> dict[str, SparseGrad | list[SparseGrad]]:
    """Row indices and gradient rows of each item table of ``net`` from the gradients of the
    step's input rows (``g_in``, B) and candidate rows (``g_wy``, ``g_by``: C); duplicates are
    summed by the optimiser. In shared mode the input rows are rows of ``Wy`` too."""
    if net.mode == "shared":
        return {"Wy": [(inputs, g_in), (cols, g_wy)], "By": (cols, g_by)}
    return {"Wy": (cols, g_wy), "By": (cols, g_by), net.input_table_name: (inputs, g_in)}


@dataclass
class _State:
    """Optimiser state of one parameter (full-size tensors; absent ones are None)."""

    acc: Tensor | None = None
    dacc: Tensor | None = None
    m: Tensor | None = None
    vel: Tensor | None = None
    scratch: Tensor | None = field(default=None, repr=False)  # zeros; sums duplicate rows


class Optimizer:
    """Updates a :class:`~gru4rec.network.gru.GRU4RecNet` in place from its gradients.

    ``step(dense_grads, sparse_grads)``: ``dense_grads`` in the order of ``dense`` names;
    ``sparse_grads`` maps a table's name to (row indices K, gradient rows K×…), duplicates allowed.
    """

    def __init__(
        self,
        dense: dict[str, nn.Parameter],
        sparse: dict[str, nn.Parameter],
        config: Config,
        backend: Backend | None = None,
    ) -> None:
        """``backend``: how duplicate rows are summed and which code runs the rules (default:
        :func:`~gru4rec.training.backend.select_backend` for the tables' device and dtype)."""
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
        any_param = next(iter(sparse.values()))
        device, dtype = any_param.device, any_param.dtype
        if backend is None:
            backend = select_backend(device, dtype)
        elif backend.device.type != device.type or backend.dtype != dtype:
            raise ValueError(f"the backend is for {backend.device} {backend.dtype}, the tables are {device} {dtype}")
        self.backend = backend
        #: Every table's fused update ("dense": the flat buffer) in one call, bound once the state exists.
        self._fused: TablesUpdate | None = None
        # The dense parameters become views into one flat buffer, so that their whole update is
        # a handful of operations on one tensor instead of a handful per parameter.
        sizes = [p.numel() for p in dense.values()]
        self.flat = torch.cat([p.detach().reshape(-1) for p in dense.values()]) if dense else torch.zeros(0, device=device, dtype=dtype)
        self.slices: dict[str, tuple[int, int]] = {}
        start = 0
        for (name, p), n in zip(dense.items(), sizes):
            p.data = self.flat[start:start + n].view_as(p)
            self.slices[name] = (start, start + n)
            start += n
        #: Gradient buffer laid out like ``flat``; the fast training step writes into its views.
        self.flat_grad = torch.zeros_like(self.flat)
        #: Each dense parameter's slice of ``flat_grad``, shaped like the parameter.
        self.grad_views = {name: self.flat_grad[a:b].view_as(dense[name]) for name, (a, b) in self.slices.items()}
        self.state: dict[str, _State] = {"dense": self._new_state(self.flat, sparse=False)}
        for name, p in sparse.items():
            self.state[name] = self._new_state(p, sparse=True)
        self.t = torch.zeros((), device=device, dtype=dtype)  # adam's step count
        #: The rule's constants as the fused updates take them (CPU kernels, Triton): decay is rho
        #: (rmsprop, adadelta) or beta2 (adam); the bias corrections come per step.
        self.rule: dict[str, Any] = dict(method=self.method, lr=self.lr, momentum=self.momentum, lmbd=self.lmbd,
                         decay=self.beta2 if self.method == "adam" else self.rho, beta1=self.beta1, eps=EPS)
        if self.kernels is not None:
            tables = {"dense": self.flat, **sparse}
            self._fused = self.kernels.tables_update(
                {name: self.kernels.table_update(p, vars(self.state[name]), **self.rule) for name, p in tables.items()})
        #: The update of every table from the (summed) gradients: fused or PyTorch.
        self._apply = self._apply_fused if self.kernels is not None else self._apply_torch
        #: The whole update as fused GPU kernels (summing, clipping and the rule), or None.
        self._fused_update: FusedUpdate | None = self.ops.fused_update(self)
        # Every sparse table's rows index these (an attribute table may have a row more than the items).
        n_rows = max(p.shape[0] for p in sparse.values())
        if self._fused_update is not None:
            pass  # its kernels sum the duplicates and count nothing
        elif not self.unique_rows:  # counts of duplicate positions, for grad_cap's norm
            self._count = torch.zeros(n_rows, device=device, dtype=dtype)
        else:
            self._mark = torch.zeros(n_rows, device=device, dtype=torch.uint8)
            self._slot = torch.zeros(n_rows, device=device, dtype=torch.int64)
            self._arange = torch.arange(n_rows, device=device)

    @property
    def unique_rows(self) -> bool:
        """How duplicate rows are summed (see _sum_duplicates): the backend's; unique rows on the CPU by default."""
        return self.backend.unique_rows

    @property
    def ops(self) -> TorchOps:
        """The row operations (PyTorch, fused CPU kernels or Triton): the backend's."""
        return self.backend.ops

    @property
    def kernels(self) -> CpuKernels | None:
        """The fused CPU kernels, or None: the PyTorch code."""
        return self.backend.ops.kernels

    def tables(self) -> list[Tensor]:
        """Every table a step reads and writes here: the dense weights' flat buffer and its
        gradient, the item tables, and the state of each."""
        state = [t for st in self.state.values() for t in vars(st).values() if isinstance(t, Tensor)]
        return [self.flat, self.flat_grad, *self.sparse.values(), *state]

    def _new_state(self, p: Tensor, *, sparse: bool) -> _State:
        sparse = sparse and not self.unique_rows  # only the scratch method needs a scratch table
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
        if sparse:
            st.scratch = zeros()
        return st

    # ------------------------------------------------------------------ the rules

    def _direction(self, g: Tensor, st: _State, rows: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """ĝ = g·scale from the gradient ``g`` (a tensor this optimiser owns: it may be
        overwritten), updating the method's state — in place for a whole tensor, at ``rows``
        otherwise. ``scale`` None means the first element is ĝ itself. (Returning the factor
        lets the momentum update fuse the product: one pass less over every row.)"""

        def read(t: Tensor | None) -> Tensor:
            assert t is not None
            return t if rows is None else t.index_select(0, rows)

        def write(t: Tensor | None, value: Tensor) -> None:
            assert t is not None
            if rows is not None:
                t.index_copy_(0, rows, value)

        if self.method == "sgd":
            return g, None
        acc = read(st.acc)
        if self.method == "adagrad":
            acc.addcmul_(g, g)
        else:
            decay = self.beta2 if self.method == "adam" else self.rho
            acc.mul_(decay).addcmul_(g, g, value=1.0 - decay)
        write(st.acc, acc)
        if self.method in ("adagrad", "rmsprop"):
            return g, torch.add(acc, EPS).rsqrt_()
        if self.method == "adadelta":
            dacc = read(st.dacc)
            g.mul_(torch.add(dacc, EPS).sqrt_()).mul_(torch.add(acc, EPS).rsqrt_())
            dacc.mul_(self.rho).addcmul_(g, g, value=1.0 - self.rho)
            write(st.dacc, dacc)
            return g, None
        # adam; self.t already counts this step
        m = read(st.m)
        m.lerp_(g, 1.0 - self.beta1)
        write(st.m, m)
        v_hat = acc / (1.0 - self.beta2**self.t)
        return torch.div(m, 1.0 - self.beta1**self.t).div_(v_hat.sqrt_().add_(EPS)), None

    def _delta(self, direction: tuple[Tensor, Tensor | None], p: Tensor, st: _State, rows: Tensor | None) -> Tensor:
        """The change of the parameter (whole, or its ``rows``) for ĝ = g·scale (g overwritten)."""
        g, scale = direction
        if self.lmbd > 0 or self.momentum <= 0:
            d = g if scale is None else g.mul_(scale)
            if self.lmbd > 0:
                d.add_(p if rows is None else p.index_select(0, rows), alpha=self.lmbd)
            if self.momentum <= 0:
                return d.mul_(-self.lr)
            g, scale = d, None
        assert st.vel is not None
        vel = st.vel if rows is None else st.vel.index_select(0, rows)
        vel.mul_(self.momentum)
        if scale is None:
            vel.add_(g, alpha=-self.lr)
        else:
            vel.addcmul_(g, scale, value=-self.lr)
        if rows is not None:
            st.vel.index_copy_(0, rows, vel)
        return vel

    # ------------------------------------------------------------------ one step

    @torch.no_grad()
    def step(self, dense_grads: list[Tensor] | Tensor, sparse_grads: dict[str, UniqueGrad | SparseGrad | list[SparseGrad]]) -> None:
        """One update. ``dense_grads``: one gradient per dense parameter (in order), or the flat
        gradient (``flat_grad``, which the fast step fills in place; it is overwritten).
        ``sparse_grads``: per item table, (row indices, gradient rows) — or a list of such parts,
        which saves concatenating the gradients — with duplicate rows allowed; or a
        :class:`UniqueGrad` whose rows are already unique (only where ``unique_rows``)."""
        self._count_step()
        if isinstance(dense_grads, Tensor):
            g_dense = dense_grads
        else:
            g_dense = torch.cat([g.reshape(-1) for g in dense_grads]) if dense_grads else self.flat_grad.zero_()
        if self._fused_update is not None:
            self._fused_update(g_dense, sparse_grads)  # scratch rows: never UniqueGrad
            return
        summed = {
            name: parts if isinstance(parts, UniqueGrad) else self._sum_duplicates(name, parts if isinstance(parts, list) else [parts])
            for name, parts in sparse_grads.items()
        }
        if self.grad_cap > 0:
            scale = self._clip_scale(g_dense, summed)
            g_dense.mul_(scale)
            for _, g in summed.values():
                g.mul_(scale)

        self._apply(g_dense, summed)

    @property
    def fused_tables(self) -> TablesUpdate | None:
        """The fused CPU update of every table ("dense": the flat buffer; the item tables by
        name), or None without the CPU kernels."""
        return self._fused

    def begin_fused_step(self) -> None:
        """For a training step that runs :attr:`fused_tables`' rules itself (the one-call CPU
        step, :mod:`gru4rec.training.cpu_step`), before it: what :meth:`step` does before its
        own update — Adam counts the step and sets its bias corrections on the rules."""
        self._count_step()
        if self.method == "adam" and self._fused is not None:
            self._fused.set_bias(*self._bias_corrections())

    def _count_step(self) -> None:
        """A step's update begins: Adam counts it (its bias corrections use the count)."""
        if self.method == "adam":
            self.t += 1

    def _bias_corrections(self) -> tuple[float, float]:
        """Adam's 1 − β1^t and 1 − β2^t at the current step count."""
        return float(1.0 - self.beta1**self.t), float(1.0 - self.beta2**self.t)

    def _apply_fused(self, g_dense: Tensor, summed: dict[str, tuple[Tensor, Tensor]]) -> None:
        """The update by the fused kernels (one pass per table, all tables in one parallel region)."""
        bias = self._bias_corrections() if self.method == "adam" else (None, None)
        grads: dict[str, tuple[Tensor | None, Tensor]] = {"dense": (None, g_dense)} if self.flat.numel() else {}
        grads.update(summed)
        assert self._fused is not None  # bound where there are kernels (``_apply`` is this method only then)
        self._fused(grads, *bias)  # every table in one call

    def _apply_torch(self, g_dense: Tensor, summed: dict[str, tuple[Tensor, Tensor]]) -> None:
        """The update as PyTorch code (the rule the kernels are tested against)."""
        if self.flat.numel():
            st = self.state["dense"]
            self.flat.add_(self._delta(self._direction(g_dense, st, None), self.flat, st, None))

        for name, (rows, g) in summed.items():
            p, st = self.sparse[name], self.state[name]
            delta = self._delta(self._direction(g, st, rows), p, st, rows)
            if self.unique_rows:
                p.index_add_(0, rows, delta)
            else:  # duplicates all compute the same new row: the write order does not matter
                p.index_copy_(0, rows, p.index_select(0, rows).add_(delta))

    def _sum_duplicates(self, name: str, parts: list[SparseGrad]) -> SparseGrad:
        """(rows, gradient rows) with each row's gradients summed.

        On the CPU the rows are made unique (fewer rows to update afterwards). On a GPU that
        would sync with the host (the number of unique rows is data-dependent), so every position
        keeps its row and receives the row's sum through a zeroed full-size scratch table:
        duplicates then compute identical new values and the scattered writes agree.
        """
        rows = parts[0][0] if len(parts) == 1 else torch.cat([r for r, _ in parts])
        if self.unique_rows:
            uniq, inverse, _ = self.unique(rows)
            first = parts[0][1]
            total = first.new_zeros((uniq.shape[0], *first.shape[1:]))
            start = 0
            for r, g in parts:
                self.ops.add_rows(total, inverse[start:start + r.shape[0]], g)
                start += r.shape[0]
            return uniq, total
        scratch = self.state[name].scratch
        assert scratch is not None
        for r, g in parts:
            scratch.index_add_(0, r, g)
        total = scratch.index_select(0, rows)
        scratch.index_fill_(0, rows, 0.0)
        return rows, total

    def unique(self, rows: Tensor, n_first: int | None = None) -> tuple[Tensor, Tensor, int]:
        """The distinct rows, each position's index among them, and how many of them occur in
        the first ``n_first`` positions (default: all); those come first, in ascending order.
        ``unique_rows`` only: it syncs on a GPU. A mark table over the items is several times
        faster than ``torch.unique`` for the catalogue sizes of GRU4Rec."""
        return self.ops.unique(rows, self._mark, self._slot, self._arange, n_first)

    def _clip_scale(self, g_dense: Tensor, summed: dict[str, tuple[Tensor, Tensor]]) -> Tensor:
        """min(1, grad_cap / ‖all gradients‖), each unique sparse row counted once."""
        total = (g_dense * g_dense).sum()
        for rows, g in summed.values():
            if self.unique_rows:
                total = total + (g * g).sum()
                continue
            # A row that appears c times contributes c copies of its summed gradient: divide by c.
            self._count.index_add_(0, rows, torch.ones_like(rows, dtype=self._count.dtype))
            count = self._count.index_select(0, rows)
            self._count.index_fill_(0, rows, 0.0)
            sq = (g * g).reshape(g.shape[0], -1).sum(1)
            total = total + (sq / count).sum()
        return torch.clamp(self.grad_cap / (torch.sqrt(total) + 1e-12), max=1.0)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Tensor]:
        """``t`` and ``{param}.{acc|dacc|m|vel}`` for every parameter (views, not copies)."""
        out: dict[str, Tensor] = {"t": self.t}
        for name, st in self.state.items():
            for key in ("acc", "dacc", "m", "vel"):
                value = getattr(st, key)
                if value is None:
                    continue
                if name == "dense":
                    for pname, (a, b) in self.slices.items():
                        out[f"{pname}.{key}"] = value[a:b].view_as(self.dense[pname])
                else:
                    out[f"{name}.{key}"] = value
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for key, value in self.state_dict().items():
                value.copy_(state[key])
