r"""One training step with the backward pass written out: the mathematics of GRU4Rec's training.

Shapes: B slots, S shared samples, C = B + S score columns, n units in a layer, L units in the
last one, d₀ the width of the rows that feed layer 0. A step (docs/behaviour.md §3–§6):

1. **Rows.** The input rows x = E[inputs] (B×d₀; ``Wy`` in shared mode, the rows of ``Wx_0`` in
   one-hot mode) and the candidate rows ``Wy[cols]`` (C×L), ``By[cols]`` (C), cols = [targets |
   samples]. Only these rows take part, so no gradient is ever N rows long.
2. **GRU layers** (Cho form; the reset gate acts before the recurrent product). For a layer with
   input x, carried state h (B×n, a constant of the step: gradients flow one step deep) and
   dropout mask m::

       v      = x·Wx + Bh                         B×3n   [candidate | reset | update]
       [r|z]  = σ(v_rz + h·Wrz)                   B×2n
       c      = f(v_c + (h ⊙ r)·Wh)               B×n    f = hidden_act
       out    = (h + z ⊙ (c − h)) ⊙ m             B×n    the next layer's input and the new state

   (one-hot mode, layer 0: v = Wx_0[inputs] + Bh.) With click context layer 0 adds the input
   clicks' context: v = x·Wx + ctx·Wc + Bh (B×5 · 5×3n₀), and its backward dWc = ctxᵀ·d_v.
3. **Scores** of the last output x_L against the columns, with logQ subtracted (docs/behaviour.md §4) and, for the
   cross-entropy losses, −10³⁰ on masked columns (inactive slots' targets)::

       s = x_L·Wy[cols]ᵀ + By[cols] − logQ[cols]      B×C

4. **Loss gradient** G = dL/ds (B×C), in closed form per loss (:mod:`gru4rec.training.losses`).
5. **Backward pass**, from the scores down::

       dWy[cols] = Gᵀ·x_L  (C×L)     dBy[cols] = Σ_b G  (C)     d = dL/dx_L = G·Wy[cols]  (B×L)

   and for each layer, top to bottom, from d = dL/d(out)::

       d    ← d ⊙ m
       d_c  = d ⊙ z ⊙ f'(c)                       dWh  = (h ⊙ r)ᵀ·d_c
       d_r  = (d_c·Whᵀ) ⊙ h ⊙ r(1 − r)            dWrz = hᵀ·[d_r | d_z]
       d_z  = d ⊙ (c − h) ⊙ z(1 − z)              dBh  = Σ_b d_v,   d_v = [d_c | d_r | d_z]  (B×3n)
       dWx  = xᵀ·d_v                              d    ← d_v·Wxᵀ   (the layer input's gradient)

   The last d, times the embedding mask, is the gradient of the input rows (in one-hot mode d_v
   of layer 0 itself).
6. **Update**: the dense weights as a whole, the item tables at the step's rows
   (:mod:`gru4rec.training.optim`).

Distinct rows. Where the optimiser makes rows unique (the CPU), the products of step 3 and 5 run
over the K ≤ C distinct items of the columns (:class:`ScoreRows`): their B×K scores are spread to
the C columns and the C columns of G summed back per item, so each product takes one row per
item instead of one per column, and each Wy row's gradient comes out exactly once.

Everything here is device tensors only (nothing is read on the host), so on a GPU the step can be
captured as a CUDA graph. The gradients of the dense weights are written straight into the
optimiser's flat gradient buffer. :mod:`gru4rec.training.reference` is the same step by autograd;
tests hold the two equal.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import Backend
from gru4rec.training.cell import GRUCell, LayerCache
from gru4rec.training.composed import Part, StepComposition
from gru4rec.training.dropout import DropoutMasks
from gru4rec.training.losses import LossGradFn
from gru4rec.training.ops import TorchOps
from gru4rec.training.optim import Optimizer, SparseGrad, UniqueGrad, item_table_grads
from gru4rec.training.precision import Matmuls
from gru4rec.training.sampling import LogQ

__all__ = ["FastStep", "ScoreRows"]


class ScoreRows(NamedTuple):
    """The Wy rows of a step's products where they are its distinct items (see
    :meth:`FastStep._score_rows`): ``uniq[:n_scored]`` are the items of the C score columns,
    ``col_rows`` (C) the row of each column; in shared mode ``uniq[n_scored:]`` are the items
    that are only inputs and ``input_rows`` (B) the row of each input (None otherwise)."""

    uniq: Tensor
    n_scored: int
    col_rows: Tensor
    input_rows: Tensor | None


class FastStep:
    """The hand-written step of a trainer, bound once to its network, optimiser, backend (whose
    operations are PyTorch, fused CPU kernels or Triton), GRU cell, products (:class:`Matmuls`), loss gradient,
    dropout masks and logQ terms. With bfloat16 products only the matrix products take 16-bit
    operands; the loss and its softmax, the gates and the optimiser stay in float32."""

    def __init__(self, net: GRU4RecNet, optimizer: Optimizer, backend: Backend, cell: GRUCell, matmuls: Matmuls,
                 loss_grad: LossGradFn, dropout: DropoutMasks, logq: LogQ | None, *, mask_in_bias: bool) -> None:
        self.net, self.optimizer, self.backend, self.cell, self.mm = net, optimizer, backend, cell, matmuls
        self.loss_grad, self.dropout, self.logq = loss_grad, dropout, logq
        #: Whether the masked columns enter the loss through the bias (the cross-entropy losses).
        self.mask_in_bias = mask_in_bias
        # Each layer's gradient buffers: views into the optimiser's flat gradient (no Wx view for
        # layer 0 in one-hot mode, whose Wx_0 is an item table).
        views = optimizer.grad_views
        self._layer_grads = [
            (views[f"layers.{i}.Wh"], views[f"layers.{i}.Wrz"], views[f"layers.{i}.Bh"], views.get(f"layers.{i}.Wx"))
            for i in range(len(net.layers))
        ]
        #: The gradient buffer of the context projection Wc (a network with click context), else None.
        self._wc_grad = views.get("Wc")
        #: The composition of the Wy rows with item attributes (None without); it needs the
        #: distinct rows of unique-row backends (the backend runs the reference step elsewhere).
        self._composition: StepComposition | None = None
        if net.attributes is not None:
            if not backend.unique_rows:
                raise ValueError("FastStep covers item attributes with unique rows only (Backend.runs_reference)")
            self._composition = StepComposition(net, optimizer)
        #: The projections' views of the flat gradient, by name (none: no numeric attribute column).
        self._projection_grads = {} if self._composition is None else \
            {name: views[name] for name in self._composition.projection_names}

    @property
    def ops(self) -> TorchOps:
        """The row and column operations (PyTorch, fused CPU kernels or Triton): the backend's."""
        return self.backend.ops

    @torch.no_grad()
    def __call__(self, hidden: list[Tensor], inputs: Tensor, targets: Tensor, samples: Tensor, cols: Tensor,
                 col_valid: Tensor, active: Tensor, n_cols: Tensor, bias: Tensor | None = None,
                 context: Tensor | None = None) -> Tensor:
        """The step for the B slots' ``inputs`` and ``targets`` (B), the ``samples`` (S), the
        columns ``cols`` = [targets | samples] (C), their validity ``col_valid`` (C) and the
        slots' ``active`` (B) and ``n_cols`` (valid columns); updates ``hidden`` and the weights,
        returns the loss (0-dim). ``bias``: the columns' bias (:meth:`TorchOps.column_bias`) where
        the caller has it already (a fused gather of the step's inputs). ``context`` (B×5): the
        input clicks' context, for a network with click context (and only there)."""
        net, ops, cell, mm, comp = self.net, self.ops, self.cell, self.mm, self._composition
        self.dropout.draw()  # every mask of the step (with id dropout, its salt: the composition needs it)
        rows = self._score_rows(inputs, cols)
        composed, keep = None, None  # with attributes: the distinct items' composed rows and which kept their id part
        keep_in = None  # with separately composed input rows: which inputs kept their id part
        if comp is None:
            wy = mm.cast(net.Wy.index_select(0, cols if rows is None else rows.uniq[: rows.n_scored]))  # C×L or K×L
            if bias is None:
                bias = ops.column_bias(net.By, cols, targets.shape[0], self.logq, col_valid if self.mask_in_bias else None)  # C
        else:  # the K (shared: K') distinct items composed once each, their biases spread to the C columns
            assert rows is not None and bias is None  # unique rows (the constructor), no fused gather
            items = rows.uniq if rows.input_rows is not None else rows.uniq[: rows.n_scored]
            keep = self.dropout.keep_ids(items)
            composed, item_bias = comp.compose(items, keep, bias=True)
            assert item_bias is not None
            wy = mm.cast(composed[: rows.n_scored])
            bias = ops.column_bias(item_bias, rows.col_rows, targets.shape[0], None, col_valid if self.mask_in_bias else None)
            if self.logq is not None:
                bias.sub_(self.logq.columns(targets, samples))

        # Forward, keeping what the backward pass needs (the products' operands as cast).
        if composed is not None and rows is not None and rows.input_rows is not None:  # shared: composed input rows
            x = ops.gather_rows(composed, rows.input_rows, self.dropout.embed)
        elif comp is not None and comp.separate_input:  # separate and one-hot modes: E's or Wx_0's composed rows
            keep_in = self.dropout.keep_ids(inputs)
            x = comp.compose_input(inputs, keep_in)
            if self.dropout.embed is not None:
                x.mul_(self.dropout.embed)
        else:
            x = ops.gather_rows(net.input_table, inputs, self.dropout.embed)  # B×d₀ input rows, dropped out
        caches: list[LayerCache] = []
        outs: list[Tensor] = []
        for i, layer in enumerate(net.layers):
            h = hidden[i]
            projects = i > 0 or net.mode != "none"  # layer 0 in none mode adds its Wx_0 rows
            x_c = mm.cast(x)
            wx = mm.cast(layer.Wx) if projects else None
            v = mm.addmm(layer.Bh, x_c, wx) if wx is not None else x + layer.Bh  # B×3n
            if i == 0 and net.Wc is not None:
                assert context is not None  # a network with click context steps with its clicks' context
                ctx_c = mm.cast(context)
                v = mm.addmm(v, ctx_c, mm.cast(net.Wc))  # + ctx·Wc
            h_c, wrz, wh = mm.cast(h), mm.cast(layer.Wrz), mm.cast(layer.Wh)
            mask = None if self.dropout.hidden is None else self.dropout.hidden[i]
            rz, hr, c, x = cell.forward(v, h, h_c, wrz, wh, mask)
            caches.append(LayerCache(x_c, wx, h, h_c, wh, hr, rz, c, mask))
            outs.append(x)
        x_c = mm.cast(x)
        if rows is None:
            scores = mm.addmm(bias, x_c, wy.t())  # B×C
        else:  # one product row per distinct item, spread to the C columns
            scores = ops.spread_columns(mm.mm(x_c, wy.t()), rows.col_rows, bias)
        loss, g_scores = self.loss_grad(scores, col_valid, active, n_cols)
        # dL/d(rows of wy): the columns of one item summed where rows are distinct items
        g_rows = g_scores if rows is None else ops.merge_columns(g_scores, rows.col_rows, rows.n_scored)

        # Backward, one step deep (the carried hidden state is a constant).
        x_last = x_c
        d = mm.mm(mm.cast(g_rows), wy)  # dL/d(output of the last layer), B×L
        for i in range(len(net.layers) - 1, -1, -1):
            cache = caches[i]
            g_wh, g_wrz, g_bh, g_wx = self._layer_grads[i]
            d_v = cell.backward(d, cache, g_wh, g_wrz, g_bh)  # B×3n
            if i == 0 and self._wc_grad is not None:
                mm.mm_into(self._wc_grad, ctx_c.t(), mm.cast(d_v))  # dWc = ctxᵀ·d_v
            if cache.wx is None:
                d = d_v  # layer 0 in none mode: the gradient of the Wx_0 rows themselves
                break
            assert g_wx is not None  # a layer with Wx in the step has its gradient view
            d_v_c = mm.cast(d_v)
            mm.mm_into(g_wx, cache.x_c.t(), d_v_c)
            d = mm.mm(d_v_c, cache.wx.t())  # dL/d(layer input)
        for h, out in zip(hidden, outs):
            h.copy_(out)
        embed_mask = self.dropout.embed
        g_in = d if embed_mask is None else d * embed_mask  # B×d₀
        grads = self._item_grads(inputs, cols, rows, g_rows, x_last, g_in)
        if comp is not None:
            grads = self._composed_grads(comp, grads, inputs, keep, keep_in)
        self.optimizer.step(self.optimizer.flat_grad, grads)
        if comp is not None:
            net.tables_changed()  # the fused CPU rules write the tables through their data pointers
        return loss

    def _score_rows(self, inputs: Tensor, cols: Tensor) -> ScoreRows | None:
        """Which Wy rows the products use (None: the C columns themselves).

        Where the optimiser makes rows unique (CPU), the rows are the K ≤ C distinct items of the
        columns (with 2,048 popularity samples of a small catalogue, K is a third below C). In
        shared mode the inputs' items, whose rows share the table, follow them. On a GPU finding
        distinct rows would sync, so there the rows are the C columns."""
        opt = self.optimizer
        if not self.backend.unique_rows:
            return None
        n_cols = cols.shape[0]
        if self.net.mode != "shared":
            uniq, inverse, k = opt.unique(cols)
            return ScoreRows(uniq, k, inverse, None)
        uniq, inverse, k = opt.unique(torch.cat((cols, inputs)), n_first=n_cols)
        return ScoreRows(uniq, k, inverse[:n_cols], inverse[n_cols:])

    def _item_grads(self, inputs: Tensor, cols: Tensor, rows: ScoreRows | None, g_rows: Tensor, x_c: Tensor,
                    g_in: Tensor) -> dict[str, UniqueGrad | SparseGrad | list[SparseGrad]]:
        """The item tables' gradient rows, from dL/d(scores of the rows of :meth:`_score_rows`)
        ``g_rows`` (B×C, or B×K for distinct rows), the last layer's output ``x_c`` (as cast for
        the products) and the input rows' gradient ``g_in``. With distinct rows, one product
        gives each Wy row's gradient exactly once."""
        mm = self.mm
        g_by = self.ops.sum_rows(g_rows)
        if rows is None:
            return item_table_grads(self.net, inputs, cols, g_in, mm.mm(mm.cast(g_rows).t(), x_c), g_by)
        scored = rows.uniq[: rows.n_scored]
        if rows.input_rows is None:
            g_wy = mm.mm(mm.cast(g_rows).t(), x_c)
            return {"Wy": UniqueGrad(scored, g_wy), "By": UniqueGrad(scored, g_by), self.net.input_table_name: (inputs, g_in)}
        # shared: the scored rows' gradient, then the input rows' (items that are only inputs
        # follow the scored ones and keep their bias, and the bias's momentum, untouched)
        g_wy = g_in.new_empty((rows.uniq.shape[0], x_c.shape[1]))
        mm.mm_into(g_wy[: rows.n_scored], mm.cast(g_rows).t(), x_c)
        g_wy[rows.n_scored:].zero_()
        self.ops.add_rows(g_wy, rows.input_rows, g_in)
        return {"Wy": UniqueGrad(rows.uniq, g_wy), "By": UniqueGrad(scored, g_by)}

    def _composed_grads(self, comp: StepComposition, grads: dict[str, UniqueGrad | SparseGrad | list[SparseGrad]],
                        inputs: Tensor, keep: Tensor | None,
                        keep_in: Tensor | None) -> dict[str, UniqueGrad | SparseGrad | list[SparseGrad]]:
        """The item tables' gradients with attributes: ``Wy``'s and ``By``'s distinct rows
        (:meth:`_item_grads`) are the composed rows' and biases', which the composition's
        backward spreads to the id rows and biases (as they are: distinct already; not where
        ``keep`` dropped the id part), the attribute tables and the projection (into its view of
        the flat gradient); in the separate and one-hot modes the input rows' gradient (the B
        inputs', ``keep_in``) likewise to ``E`` or ``Wx_0`` and the input attribute tables."""
        wy, by = grads.pop("Wy"), grads.pop("By")
        assert isinstance(wy, UniqueGrad) and isinstance(by, UniqueGrad)  # unique rows (the constructor)
        parts = [Part(wy.rows, wy.grad, by.grad, keep, distinct=True)]
        if comp.separate_input:
            g_in = grads.pop(self.net.input_table_name)
            assert isinstance(g_in, tuple)  # (inputs, rows): _item_grads' plain input gradient
            parts.append(Part(inputs, g_in[1], None, keep_in, input=True))
        composed, projections = comp.grads(parts)
        for name, g in projections.items():
            self._projection_grads[name].copy_(g)
        grads.update(composed)
        return grads
