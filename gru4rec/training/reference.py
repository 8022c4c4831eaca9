"""The reference training step: the model's forward pass and :func:`~gru4rec.training.losses.make_loss`,
differentiated by autograd.

It is the plain statement of a step — gather the step's rows, run the layers, score, subtract
logQ, take the loss, backpropagate one step deep, update — that the hand-written
:class:`~gru4rec.training.step.FastStep` is tested against (float64, same seed, dropout
included). It runs in float32 or float64 only, never in mixed precision.

With item attributes (``net.attributes``) the leaves are the step's composed rows and biases
(the candidates' and the inputs' rows), with the id part of the items that id dropout drops
left out (:meth:`DropoutMasks.keep_ids`), and
:class:`~gru4rec.training.composed.StepComposition` (FastStep's too) composes them and turns
their gradients into the id rows' and biases' and the attribute tables' (row-wise, summed per row
by the optimiser like every item table) and the projections' (dense gradients). Without
attributes the step is the plain one, unchanged.

With click context (``net.Wc``) the step's ``context`` (B×5) enters layer 0's projection and
``Wc`` is one more dense parameter autograd differentiates; without it nothing changes.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.composed import Part, StepComposition
from gru4rec.training.dropout import DropoutMasks
from gru4rec.training.losses import LossFn
from gru4rec.training.optim import Optimizer, item_table_grads
from gru4rec.training.sampling import LogQ

__all__ = ["ReferenceStep"]


class ReferenceStep:
    """The autograd step of a trainer, bound once to its network, optimiser, loss, dropout masks
    and logQ terms; called like :class:`~gru4rec.training.step.FastStep`."""

    def __init__(self, net: GRU4RecNet, optimizer: Optimizer, loss_fn: LossFn, dropout: DropoutMasks, logq: LogQ | None) -> None:
        self.net, self.optimizer, self.loss_fn, self.dropout, self.logq = net, optimizer, loss_fn, dropout, logq
        #: The composition of the step's rows with item attributes (None without): its
        #: backward gives the projections' gradients (autograd never sees a projection: the
        #: composed rows are the leaves).
        self._composition = None if net.attributes is None else StepComposition(net, optimizer)
        composed = frozenset() if self._composition is None else self._composition.projection_names
        #: The dense parameters autograd differentiates, by name (the optimiser's, less the projections).
        self._dense = {name: p for name, p in optimizer.dense.items() if name not in composed}

    def __call__(self, hidden: list[Tensor], inputs: Tensor, targets: Tensor, samples: Tensor, cols: Tensor,
                 col_valid: Tensor, active: Tensor, n_cols: Tensor, context: Tensor | None = None) -> Tensor:
        net = self.net
        if net.attributes is not None:
            return self._composed(hidden, inputs, targets, samples, cols, col_valid, active, n_cols, context)
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
            grads = torch.autograd.grad(loss, [x_in, wy, by, *self._dense.values()])
        return loss, grads, new_hidden

    def _composed(self, hidden: list[Tensor], inputs: Tensor, targets: Tensor, samples: Tensor,
                  cols: Tensor, col_valid: Tensor, active: Tensor, n_cols: Tensor, context: Tensor | None = None) -> Tensor:
        """The step of a network with item attributes: the composed rows and biases are the leaves."""
        net, dropout, comp = self.net, self.dropout, self._composition
        assert comp is not None
        dropout.draw()  # every mask of the step (and the id dropout's salt), as the fast step draws them
        keep_cols, keep_inputs = dropout.keep_ids(cols), dropout.keep_ids(inputs)
        with torch.no_grad():  # the composition's own backward is StepComposition.grads
            x_in = comp.compose_input(inputs, keep_inputs)
            wy, by = comp.compose(cols, keep_cols, bias=True)
            assert by is not None
        for leaf in (x_in, wy, by):
            leaf.requires_grad_()
        loss, grads, new_hidden = self._forward_backward(hidden, x_in, wy, by, targets, samples, col_valid, active, n_cols,
                                                         context)
        g_in, g_wy, g_by = grads[0], grads[1], grads[2]
        sparse, projections = comp.grads([Part(cols, g_wy, g_by, keep_cols), Part(inputs, g_in, None, keep_inputs, input=True)])
        by_name = dict(zip(self._dense, grads[3:], strict=True)) | projections
        self.optimizer.step([by_name[name] for name in self.optimizer.dense], sparse)
        net.tables_changed()  # the fused CPU rules write the tables through their data pointers
        for h, h_new in zip(hidden, new_hidden):
            h.copy_(h_new.detach())
        return loss.detach()
