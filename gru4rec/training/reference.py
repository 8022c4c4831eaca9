"""The reference training step: the model's forward pass and :func:`~gru4rec.training.losses.make_loss`,
differentiated by autograd.

It is the plain statement of a step — gather the step's rows, run the layers, score, subtract
logQ, take the loss, backpropagate one step deep, update — that the hand-written
:class:`~gru4rec.training.step.FastStep` is tested against (float64, same seed, dropout
included). It runs in float32 or float64 only, never in mixed precision.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gru4rec.network.gru import GRU4RecNet
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
        self._dense = list(optimizer.dense.values())

    def __call__(self, hidden: list[Tensor], inputs: Tensor, targets: Tensor, samples: Tensor, cols: Tensor,
                 col_valid: Tensor, active: Tensor, n_cols: Tensor) -> Tensor:
        net = self.net
        # The step's rows as leaves of their own: gradients exist for these rows only.
        x_in = net.input_table.detach().index_select(0, inputs).requires_grad_()
        wy = net.Wy.detach().index_select(0, cols).requires_grad_()
        by = net.By.detach().index_select(0, cols).requires_grad_()
        self.dropout.draw()  # every mask of the step, as the fast step draws them
        with torch.enable_grad():
            x = self.dropout.drop_embedding(x_in)
            new_hidden = net.run_layers(x, hidden, None if self.dropout.hidden is None else self.dropout.drop_hidden)
            raw = torch.addmm(by, new_hidden[-1], wy.t())
            if self.logq is not None:
                raw = raw - self.logq.columns(targets, samples)
            loss = self.loss_fn(raw, col_valid, active, n_cols)
            grads = torch.autograd.grad(loss, [x_in, wy, by, *self._dense])
        self.optimizer.step(list(grads[3:]), item_table_grads(net, inputs, cols, grads[0], grads[1], grads[2]))
        for h, h_new in zip(hidden, new_hidden):
            h.copy_(h_new.detach())
        return loss.detach()
