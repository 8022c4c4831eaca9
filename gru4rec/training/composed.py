"""A training step's composed item rows and their backward: one statement for every step form.

A network with item attributes composes its rows (:class:`~gru4rec.items.rows.ComposedRows`):
``net.attributes`` the rows and biases of ``Wy`` that it scores, and its input rows — ``Wy``'s
composed rows in shared mode, in the separate and one-hot modes the rows of ``E`` or ``Wx_0``
composed by ``net.input_attributes`` (:attr:`GRU4RecNet.input_composition`). Id dropout
(``dropout_p_id``) leaves out the id part of the items it drops. The step forms that cover such
a network — the autograd reference step (:mod:`gru4rec.training.reference`) and
:class:`~gru4rec.training.step.FastStep` with unique rows — differ only in which items they
compose (the C columns and the B inputs, or the step's distinct items once each) and in how
they get dL/d(row) and dL/d(bias) (autograd, or the hand-written backward). Both compose with
:meth:`StepComposition.compose` / :meth:`StepComposition.compose_input` and hand those gradients,
as :class:`Part` s, to :meth:`StepComposition.grads`, which gives what the optimiser takes, per
composition:

* its id table's (``Wy``; ``E`` or ``Wx_0`` for separate input rows) and, for scored rows,
  ``By``'s gradients — the composed rows' and biases' own (the id part of a row is the id row
  itself) at the items that kept their id part; a :class:`~gru4rec.training.optim.UniqueGrad`
  where the part's items are distinct already, so they are not made unique a second time;
* each attribute table's gradient rows (``attributes.cat{c}``, ``input_attributes.cat{c}``;
  [row | bias] columns where the rows have a bias) (:meth:`ComposedRows.table_grads`): with the
  fused CPU kernels a one-code column's come summed per code, one pass, and are handed over as
  unique rows where the step has one part; otherwise one row per code read, and the optimiser
  sums the duplicates with its sort-free unique-row pass (or its scratch table), as for every item
  table — the tables are small (tens to thousands of codes), so one mark pass and one row sum;
* its projection's dense gradient (numeric columns), summed over the parts.

A training step's items are training (warm) items — inputs, targets and samples all are — so
every composed row has an id row, unless id dropout drops it.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from gru4rec.items.rows import ComposedRows, RowGrad
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.ops import SparseGrad
from gru4rec.training.optim import Optimizer, UniqueGrad

__all__ = ["Part", "StepComposition"]

#: What the optimiser takes per item table (:meth:`gru4rec.training.optim.Optimizer.step`).
TableGrads = dict[str, UniqueGrad | SparseGrad | list[SparseGrad]]


class Part(NamedTuple):
    """One composition of a step: its ``items`` (B), dL/d(their composed rows) ``grad_rows``
    (B × width), dL/d(the composed biases) ``grad_bias`` of the first ``grad_bias.shape[0]`` items
    (the scored ones; None: none is scored — input rows have no bias), ``keep`` (B, bool: which
    items kept their id part; None: all), whether the rows are layer 0's ``input`` rows (else the
    scored rows of ``Wy``) and whether the ``items`` are ``distinct``."""

    items: Tensor
    grad_rows: Tensor
    grad_bias: Tensor | None
    keep: Tensor | None
    input: bool = False
    distinct: bool = False


class _Side(NamedTuple):
    """One composition of a network: its rows, the names of its id table and its tables' prefix."""

    rows: ComposedRows
    id_name: str
    prefix: str


class StepComposition:
    """The compositions of a network's rows in a training step, bound to the network and its
    optimiser (whose dense parameters hold the projections, if any)."""

    def __init__(self, net: GRU4RecNet, optimizer: Optimizer) -> None:
        if net.attributes is None:
            raise ValueError("StepComposition: the network has no item attributes")
        self.net = net
        self._kernels = optimizer.kernels  # the fused CPU kernels compose and differentiate in one pass each
        self._unique = optimizer.unique_rows  # whether the optimiser takes rows already unique (UniqueGrad)
        self._output = _Side(net.attributes, "Wy", "attributes.")
        inputs = net.input_attributes
        #: The composition of the input rows: the output one in shared mode (the same rows).
        self._input = self._output if inputs is None else _Side(inputs, net.input_table_name, "input_attributes.")
        sides = [self._output] if self._input is self._output else [self._output, self._input]
        dense = {id(p): name for name, p in optimizer.dense.items()}
        #: The optimiser's names of the compositions' projections (dense parameters), by rows object.
        self._projection_names = {id(side.rows): dense[id(side.rows.projection)]
                                  for side in sides if side.rows.projection is not None}
        #: The optimiser's dense names of every projection (which the composition's backward gives).
        self.projection_names: frozenset[str] = frozenset(self._projection_names.values())

    @property
    def separate_input(self) -> bool:
        """Whether the input rows are a composition of their own (separate and one-hot modes)."""
        return self._input is not self._output

    def compose(self, items: Tensor, keep: Tensor | None, *, bias: bool) -> tuple[Tensor, Tensor | None]:
        """The composed ``Wy`` rows (K × L) of the training items ``items``, their id part dropped
        where ``keep`` is False, and with ``bias`` their composed biases (K; else None). Not
        differentiable: :meth:`grads` is their backward."""
        return self._output.rows.compose_warm(self.net.Wy, items, keep, self.net.By if bias else None, self._kernels)

    def compose_input(self, items: Tensor, keep: Tensor | None) -> Tensor:
        """Layer 0's composed input rows (B × d₀) of the training items ``items`` (``Wy``'s in
        shared mode), their id part dropped where ``keep`` is False. Not differentiable."""
        return self._input.rows.compose_warm(self.net.input_table, items, keep, None, self._kernels)[0]

    def grads(self, parts: list[Part]) -> tuple[TableGrads, dict[str, Tensor]]:
        """The sparse gradients of each composition's id table, ``By`` and attribute tables (see
        the module docstring) and the projections' dense gradients by their optimiser names
        (none without numeric columns), from the step's compositions (the candidates', the
        inputs'). A table whose gradient comes from one ``distinct`` part is handed over as
        unique rows, not made unique again."""
        ids: dict[str, list[tuple[SparseGrad, bool]]] = {}
        per_table: dict[str, list[SparseGrad]] = {}
        dense: dict[str, Tensor] = {}
        for p in parts:
            side = self._input if p.input else self._output
            rows = side.rows
            n_b = 0 if p.grad_bias is None else p.grad_bias.shape[0]
            kept = p.keep
            ids.setdefault(side.id_name, []).append(
                ((p.items, p.grad_rows) if kept is None else (p.items[kept], p.grad_rows[kept]), p.distinct))
            if p.grad_bias is not None:  # the dropped items' id rows and biases get no gradient (nor an update)
                scored = p.items[:n_b]
                ids.setdefault("By", []).append(
                    ((scored, p.grad_bias) if kept is None else (scored[kept[:n_b]], p.grad_bias[kept[:n_b]]), p.distinct))
            for name, got in rows.table_grads(p.items, p.grad_rows, p.grad_bias, kernels=self._kernels).items():
                per_table.setdefault(side.prefix + name, []).append(got)  # a column no item has a code in: none
            pg = rows.projection_grad(p.items, p.grad_rows, p.grad_bias)
            if pg is not None:
                name = self._projection_names[id(rows)]
                dense[name] = pg if name not in dense else dense[name] + pg
        sparse: TableGrads = {}
        for name, grads in ids.items():
            if len(grads) == 1 and grads[0][1]:
                sparse[name] = UniqueGrad(*grads[0][0])
            else:
                sparse[name] = [g for g, _ in grads]
        for name, table_parts in per_table.items():  # one part summed per code (the fused kernels'): unique rows as they are
            one = table_parts[0]
            sparse[name] = UniqueGrad(*one) if self._unique and len(table_parts) == 1 and isinstance(one, RowGrad) else table_parts
        return sparse, dense
