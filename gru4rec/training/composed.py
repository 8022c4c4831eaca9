"""A training step's composed item rows and their backward: one statement for every step form.

A network with item attributes (``net.attributes``, a :class:`~gru4rec.items.rows.ComposedRows`
over ``Wy`` with a bias column) scores composed rows and biases, and in shared mode feeds layer
0 composed rows; id dropout (``dropout_p_id``) leaves out the id part of the items it drops. The
step forms that cover such a network — the autograd reference step
(:mod:`gru4rec.training.reference`) and :class:`~gru4rec.training.step.FastStep` with unique
rows — differ only in which items they compose (the C columns and the B inputs, or the step's
distinct items once each) and in how they get dL/d(row) and dL/d(bias) (autograd, or the
hand-written backward). Both compose with :meth:`StepComposition.compose` and hand those
gradients, as :class:`Part` s, to :meth:`StepComposition.grads`, which gives what the optimiser takes:

* ``Wy`` and ``By``: the id rows' and id biases' gradients — the composed rows' and biases' own
  (the id part of a row is the id row itself) at the items that kept their id part; a
  :class:`~gru4rec.training.optim.UniqueGrad` where the items are distinct already, so they are
  not made unique a second time;
* ``attributes.cat{c}``: each attribute table's gradient rows ([row | bias] columns), one per code
  read (:meth:`ComposedRows.table_grads`); the optimiser sums the duplicates with its sort-free
  unique-row pass (or its scratch table), as for every item table — the tables are small (tens to
  thousands of codes), so this is one mark pass and one row sum, no sort;
* the projection's dense gradient (numeric columns), summed over the parts.

A training step's items are training (warm) items — inputs, targets and samples all are — so
every composed row has an id row, unless id dropout drops it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gru4rec.items.rows import ComposedRows
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.ops import SparseGrad
from gru4rec.training.optim import Optimizer, UniqueGrad

__all__ = ["Part", "StepComposition"]

#: What the optimiser takes per item table (:meth:`gru4rec.training.optim.Optimizer.step`).
TableGrads = dict[str, UniqueGrad | SparseGrad | list[SparseGrad]]


class Part(NamedTuple):
    """One composition of a step: its ``items`` (B), dL/d(their composed rows) ``grad_rows``
    (B × width), dL/d(the composed biases) ``grad_bias`` of the first ``grad_bias.shape[0]`` items
    (the scored ones; None: none is scored — input rows have no bias) and ``keep`` (B, bool: which
    items kept their id part; None: all)."""

    items: Tensor
    grad_rows: Tensor
    grad_bias: Tensor | None
    keep: Tensor | None


class StepComposition:
    """The composition of a network's ``Wy`` rows in a training step, bound to the network and
    its optimiser (whose dense parameters hold the projection, if any)."""

    def __init__(self, net: GRU4RecNet, optimizer: Optimizer) -> None:
        rows = net.attributes
        if rows is None:
            raise ValueError("StepComposition: the network has no item attributes")
        self.net = net
        self.rows: ComposedRows = rows
        self._names = list(rows.sparse_parameters())
        dense = list(optimizer.dense.items())
        at = [i for i, (_, p) in enumerate(dense) if p is rows.projection]
        #: The projection's name among the optimiser's dense parameters (None: no numeric column).
        self.projection_name: str | None = dense[at[0]][0] if at else None
        #: Its position in their order (where the reference step inserts its gradient).
        self.projection_at: int | None = at[0] if at else None

    def compose(self, items: Tensor, keep: Tensor | None, *, bias: bool) -> tuple[Tensor, Tensor | None]:
        """The composed rows (K × width) of the training items ``items``, their id part dropped
        where ``keep`` is False, and with ``bias`` their composed biases (K; else None). Not
        differentiable: :meth:`grads` is their backward."""
        return self.rows.compose_warm(self.net.Wy, items, keep, self.net.By if bias else None)

    def grads(self, parts: list[Part], *, distinct: bool = False) -> tuple[TableGrads, Tensor | None]:
        """The sparse gradients of ``Wy``, ``By`` and each attribute table (see the module
        docstring), and the projection's dense gradient (None without numeric columns), from the
        step's compositions (the candidates', and in shared mode the inputs'). ``distinct``: one
        part whose items are distinct (FastStep's unique rows): ``Wy``'s and ``By``'s gradients
        are then handed over as unique rows, not made unique again."""
        rows = self.rows
        ids: list[SparseGrad] = []
        id_bias: list[SparseGrad] = []
        per_part: list[dict[str, tuple[Tensor, Tensor]]] = []
        projection: Tensor | None = None
        for p in parts:
            n_b = 0 if p.grad_bias is None else p.grad_bias.shape[0]
            g = p.grad_rows
            if rows.bias:  # the parts' gradient: [rows | bias], the bias 0 where nothing is scored
                g = torch.cat((g, g.new_zeros((g.shape[0], 1))), 1)
                if p.grad_bias is not None:
                    g[:n_b, rows.width] = p.grad_bias
            if p.keep is None:
                ids.append((p.items, p.grad_rows))
                if p.grad_bias is not None:
                    id_bias.append((p.items[:n_b], p.grad_bias))
            else:  # the dropped items' id rows and biases get no gradient (nor an update)
                ids.append((p.items[p.keep], p.grad_rows[p.keep]))
                if p.grad_bias is not None:
                    kept = p.keep[:n_b]
                    id_bias.append((p.items[:n_b][kept], p.grad_bias[kept]))
            per_part.append(rows.table_grads(p.items, g))
            pg = rows.projection_grad(p.items, g)
            if pg is not None:
                projection = pg if projection is None else projection + pg
        sparse: TableGrads = {}
        if distinct:
            assert len(ids) == 1 and len(id_bias) <= 1, "distinct rows come as one part"
            sparse["Wy"] = UniqueGrad(*ids[0])
            if id_bias:
                sparse["By"] = UniqueGrad(*id_bias[0])
        else:
            sparse["Wy"] = ids
            if id_bias:
                sparse["By"] = id_bias
        for name in self._names:
            got = [p[name] for p in per_part if name in p]  # a column no item has a code in: no rows to update
            if got:
                sparse[f"attributes.{name}"] = got
        return sparse, projection
