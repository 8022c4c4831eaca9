"""The reference training step: the model's forward pass and :func:`~gru4rec.training.losses.make_loss`,
differentiated by autograd.

It is the plain statement of a step — gather the step's rows, run the layers, score, subtract
logQ, take the loss, backpropagate one step deep, update — that the hand-written
:class:`~gru4rec.training.step.FastStep` is tested against (float64, same seed, dropout
included). It runs in float32 or float64 only, never in mixed precision.

With item attributes (``net.attributes``) it is the only step that runs: the leaves are then the
step's composed rows and biases (the candidates', and in shared mode the inputs' rows), with the
id part of the items that id dropout drops left out (:meth:`DropoutMasks.keep_ids`), and
:meth:`~gru4rec.items.rows.ComposedRows.backward` turns their gradients into the id rows' and
biases' and the attribute tables' (row-wise, summed per row by the optimiser like every item
table) and the projection's (a dense gradient). Without attributes the step is the plain one,
unchanged.

With click context (``net.Wc``) the step's ``context`` (B×5) enters layer 0's projection and
``Wc`` is one more dense parameter autograd differentiates; without it nothing changes.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gru4rec.items.rows import ComposedRows, RowGrads
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.dropout import DropoutMasks
from gru4rec.training.losses import LossFn
from gru4rec.training.ops import SparseGrad
from gru4rec.training.optim import Optimizer, item_table_grads
from gru4rec.training.sampling import LogQ

__all__ = ["ReferenceStep"]


class ReferenceStep:
    """The autograd step of a trainer, bound once to its network, optimiser, loss, dropout masks
    and logQ terms; called like :class:`~gru4rec.training.step.FastStep`."""

    def __init__(self, net: GRU4RecNet, optimizer: Optimizer, loss_fn: LossFn, dropout: DropoutMasks, logq: LogQ | None) -> None:
        self.net, self.optimizer, self.loss_fn, self.dropout, self.logq = net, optimizer, loss_fn, dropout, logq
        #: The projection of the attributes' numerics: a dense parameter whose gradient
        #: ComposedRows.backward gives (autograd never sees it: the composed rows are the leaves).
        rows = net.attributes
        proj = None if rows is None else rows.projection
        self._dense = [p for p in optimizer.dense.values() if p is not proj]
        self._proj_at = None if proj is None else [i for i, p in enumerate(optimizer.dense.values()) if p is proj][0]

    def __call__(self, hidden: list[Tensor], inputs: Tensor, targets: Tensor, samples: Tensor, cols: Tensor,
                 col_valid: Tensor, active: Tensor, n_cols: Tensor, context: Tensor | None = None) -> Tensor:
        net = self.net
        if net.attributes is not None:
            return self._composed(net.attributes, hidden, inputs, targets, samples, cols, col_valid, active, n_cols, context)
        # The step's rows as leaves of their own: gradients exist for these rows only.
        x_in = net.input_table.detach().index_select(0, inputs).requires_grad_()
        wy = net.Wy.detach().index_select(0, cols).requires_grad_()
        by = net.By.detach().index_select(0, cols).requires_grad_()
        self.dropout.draw()  # every mask of the step, as the fast step draws them
        loss, grads, new_hidden = self._forward_backward(hidden, x_in, wy, by, targets, samples, col_valid, active, n_cols,
                                                         context)
        self.optimizer.step(list(grads[3:]), item_table_grads(net, inputs, cols, grads[0], grads[1], grads[2]))
        for h, h_new in zip(hidden, new_hidden):
            h.copy_(h_new.detach())
        return loss.detach()

    def _forward_backward(self, hidden: list[Tensor], x_in: Tensor, wy: Tensor, by: Tensor, targets: Tensor, samples: Tensor,
                          col_valid: Tensor, active: Tensor, n_cols: Tensor,
                          context: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...], list[Tensor]]:
        """The step's loss by autograd from its leaves (the input rows ``x_in``, the candidates'
        rows ``wy`` and biases ``by``; the step's masks drawn): the loss, the gradients of x_in,
        wy, by and the dense parameters, and the new hidden states."""
        with torch.enable_grad():
            x = self.dropout.drop_embedding(x_in)
            new_hidden = self.net.run_layers(x, hidden, None if self.dropout.hidden is None else self.dropout.drop_hidden, context)
            raw = torch.addmm(by, new_hidden[-1], wy.t())
            if self.logq is not None:
                raw = raw - self.logq.columns(targets, samples)
            loss = self.loss_fn(raw, col_valid, active, n_cols)
            grads = torch.autograd.grad(loss, [x_in, wy, by, *self._dense])
        return loss, grads, new_hidden

    def _composed(self, rows: ComposedRows, hidden: list[Tensor], inputs: Tensor, targets: Tensor, samples: Tensor,
                  cols: Tensor, col_valid: Tensor, active: Tensor, n_cols: Tensor, context: Tensor | None = None) -> Tensor:
        """The step of a network with item attributes: the composed rows and biases are the leaves."""
        net, dropout = self.net, self.dropout
        dropout.draw()  # every mask of the step (and the id dropout's salt), as the fast step draws them
        keep_cols, keep_inputs = dropout.keep_ids(cols), dropout.keep_ids(inputs)
        with torch.no_grad():  # the composition's own backward is ComposedRows.backward
            x_in = net.input_rows(inputs, keep_inputs).requires_grad_()
            wy, by = net.scored_rows(cols, keep_cols)
            wy.requires_grad_()
            by.requires_grad_()
        loss, grads, new_hidden = self._forward_backward(hidden, x_in, wy, by, targets, samples, col_valid, active, n_cols,
                                                         context)
        g_in, g_wy, g_by = grads[0], grads[1], grads[2]
        scored = rows.backward(cols, g_wy, g_by, keep_cols)
        assert scored.id_bias is not None  # given the biases' gradient
        parts = [scored]
        sparse: dict[str, SparseGrad | list[SparseGrad]] = {"By": (scored.id.rows, scored.id_bias)}
        if net.composes_input:
            parts.append(rows.backward(inputs, g_in, keep=keep_inputs))
        else:
            sparse[net.input_table_name] = (inputs, g_in)
        sparse["Wy"] = [(p.id.rows, p.id.grad) for p in parts]
        for name in rows.sparse_parameters():
            # A column no item has a code in has no rows to update (its width is 0: a static fact).
            got = [(p.tables[name].rows, p.tables[name].grad) for p in parts if p.tables[name].rows.shape[0]]
            if got:
                sparse[f"attributes.{name}"] = got
        dense = list(grads[3:])
        if self._proj_at is not None:
            dense.insert(self._proj_at, _projection_grad(parts))
        self.optimizer.step(dense, sparse)
        net.tables_changed()  # the fused CPU rules write the tables through their data pointers
        for h, h_new in zip(hidden, new_hidden):
            h.copy_(h_new.detach())
        return loss.detach()


def _projection_grad(parts: list[RowGrads]) -> Tensor:
    """The projection's gradient summed over the compositions of a step (candidates, inputs)."""
    grads = [p.projection for p in parts if p.projection is not None]
    total = grads[0]
    for g in grads[1:]:
        total = total + g
    return total
