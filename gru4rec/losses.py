"""The six training losses of GRU4Rec (spec §5), on a fixed-shape score matrix with masks.

The training step scores B rows against C = B + S candidate columns: the B in-batch targets
(row i's positive is column i) followed by S shared samples. At the tail of an epoch some rows
are inactive (spec §3): an inactive row contributes nothing, and its target column is neither a
candidate nor a negative for anybody. The masks make the fixed shape compute exactly what the
shrinking batch of the original computes, so the shape never changes (and CUDA graphs can be
captured).

Every loss is a sum over the active rows divided by the *configured* batch size.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import Config

__all__ = ["MASK", "make_loss", "LossFn"]

#: Added to the logits of masked columns: finite (no inf·0 = NaN anywhere), yet exp() underflows to 0.
MASK = -1e30
EPS = 1e-24

#: loss(raw, col_valid, row_valid, n_cols) -> scalar. raw: B×C scores after logQ, before final_act;
#: col_valid: C floats (1 candidate, 0 masked); row_valid: B floats; n_cols: scalar M + S.
LossFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def make_loss(config: Config) -> LossFn:
    """Build the loss function the config names, with its final activation and constants bound."""
    batch_size = float(config.batch_size)
    smoothing = float(config.smoothing)
    bpreg = float(config.bpreg)
    final_act = config.final_activation
    loss = config.loss

    def positives(r: Tensor) -> Tensor:
        return r[:, : r.shape[0]].diagonal()

    def negatives_softmax(r: Tensor, col_valid: Tensor) -> Tensor:
        """Row-wise softmax over each row's negatives only: own positive and masked columns get 0."""
        logits = r + (1.0 - col_valid) * MASK
        logits[:, : r.shape[0]].diagonal().fill_(MASK)
        return torch.softmax(logits, dim=1)

    if loss in ("cross-entropy", "xe_logit"):
        logit_form = loss == "xe_logit"

        def xe(raw: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> Tensor:
            logp = torch.log_softmax(raw + (1.0 - col_valid) * MASK, dim=1)
            # cross-entropy is -log(softmax + 1e-24) as specified; xe_logit is -log_softmax.
            nll = -logp if logit_form else -torch.log(torch.exp(logp) + EPS)
            per_row = positives(nll)
            if smoothing > 0:
                share = smoothing / (n_cols - 1.0)
                per_row = (1.0 - share * n_cols) * per_row + share * (nll @ col_valid)
            return torch.dot(per_row, row_valid) / batch_size

        return xe

    if loss in ("bpr-max", "top1-max"):
        top1 = loss == "top1-max"

        def rank_max(raw: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> Tensor:
            r = final_act(raw)
            s = negatives_softmax(r, col_valid)
            pos = positives(r).unsqueeze(1)
            if top1:
                per_row = (s * (torch.sigmoid(r - pos) + torch.sigmoid(r * r))).sum(1)
            else:
                per_row = -torch.log((s * torch.sigmoid(pos - r)).sum(1) + EPS)
                if bpreg > 0:
                    per_row = per_row + bpreg * (s * r * r).sum(1)
            return torch.dot(per_row, row_valid) / batch_size

        return rank_max

    if loss in ("bpr", "top1"):
        top1 = loss == "top1"

        def pairwise(raw: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> Tensor:
            r = final_act(raw)
            pos = positives(r)
            if top1:
                pair = torch.sigmoid(r - pos.unsqueeze(1)) + torch.sigmoid(r * r)
                per_row = (pair @ col_valid - torch.sigmoid(pos * pos)) / n_cols
            else:
                per_row = F.softplus(r - pos.unsqueeze(1)) @ col_valid  # -log σ(pos - r)
            return torch.dot(per_row, row_valid) / batch_size

        return pairwise

    raise AssertionError(f"unhandled loss {loss!r}")  # Config validates the name
