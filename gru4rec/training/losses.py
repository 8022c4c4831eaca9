"""The six training losses of GRU4Rec (docs/behaviour.md §5), on a fixed-shape score matrix with masks.

The training step scores B rows against C = B + S candidate columns: the B in-batch targets
(row i's positive is column i) followed by S shared samples. At the tail of an epoch some rows
are inactive (docs/behaviour.md §3): an inactive row contributes nothing, and its target column
is neither a candidate nor a negative for anybody. The masks make the fixed shape compute exactly
what the shrinking batch of the original computes, so the shape never changes (and CUDA graphs
can be captured).

Every loss is a sum over the active rows divided by the *configured* batch size.

:func:`make_loss` is the loss as autograd sees it (the reference step's); :func:`make_loss_grad`
is the loss with its gradient dL/dscores written out (the fast step's), held to it by tests, and
:func:`fused_loss_grad` the same for the two losses the fused CPU kernels compute.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from gru4rec.config import Config
from gru4rec.config.values import SOFTMAX_LOSSES
from gru4rec.kernels.cpu import CpuKernels

__all__ = ["MASK", "LossFn", "LossGradFn", "fused_loss_grad", "make_loss", "make_loss_grad", "masks_through_bias"]

#: Added to the logits of masked columns: finite (no inf·0 = NaN anywhere), yet exp() underflows to 0.
MASK = -1e30
EPS = 1e-24

#: loss(raw, col_valid, row_valid, n_cols) -> scalar. raw: B×C scores after logQ, before final_act;
#: col_valid: C floats (1 candidate, 0 masked); row_valid: B floats; n_cols: scalar M + S.
LossFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _positives(r: Tensor) -> Tensor:
    """Each row's positive: row i's score of column i (a view of the diagonal)."""
    return r[:, : r.shape[0]].diagonal()


def _negatives_softmax(r: Tensor, col_valid: Tensor) -> Tensor:
    """Row-wise softmax over each row's negatives only: own positive and masked columns get 0."""
    logits = r + (1.0 - col_valid) * MASK
    _positives(logits).fill_(MASK)
    return torch.softmax(logits, dim=1)


def make_loss(config: Config) -> LossFn:
    """Build the loss function the config names, with its final activation and constants bound."""
    batch_size = float(config.batch_size)
    smoothing = float(config.smoothing)
    bpreg = float(config.bpreg)
    final_act = config.final_activation
    loss = config.loss

    if loss in ("cross-entropy", "xe_logit"):
        logit_form = loss == "xe_logit"

        def xe(raw: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> Tensor:
            logp = torch.log_softmax(raw + (1.0 - col_valid) * MASK, dim=1)
            # cross-entropy is -log(softmax + 1e-24), as in the original; xe_logit is -log_softmax.
            nll = -logp if logit_form else -torch.log(torch.exp(logp) + EPS)
            per_row = _positives(nll)
            if smoothing > 0:
                share = smoothing / (n_cols - 1.0)
                per_row = (1.0 - share * n_cols) * per_row + share * (nll @ col_valid)
            return torch.dot(per_row, row_valid) / batch_size

        return xe

    if loss in ("bpr-max", "top1-max"):
        top1 = loss == "top1-max"

        def rank_max(raw: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> Tensor:
            r = final_act(raw)
            s = _negatives_softmax(r, col_valid)
            pos = _positives(r).unsqueeze(1)
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
            pos = _positives(r)
            if top1:
                pair = torch.sigmoid(r - pos.unsqueeze(1)) + torch.sigmoid(r * r)
                per_row = (pair @ col_valid - torch.sigmoid(pos * pos)) / n_cols
            else:
                per_row = F.softplus(r - pos.unsqueeze(1)) @ col_valid  # -log σ(pos - r)
            return torch.dot(per_row, row_valid) / batch_size

        return pairwise

    raise AssertionError(f"unhandled loss {loss!r}")  # Config validates the name


# ---------------------------------------------------------------------------------------------
# Fast path: the loss and its gradient with respect to the scores, written out by hand.
#
# The hand-written training step needs dL/dx for x = raw scores after logQ. Deriving it here
# (instead of letting autograd record ~20 operations on the B×C matrix) keeps the number of
# passes over that matrix small. make_loss above is the reference these must agree with.

#: loss_grad(x, col_valid, row_valid, n_cols) -> (loss, dL/dx). For the cross-entropy losses the
#: caller has already added MASK to the masked columns of x (folded into the bias); the other
#: losses take x unmasked and use col_valid.
LossGradFn = Callable[[Tensor, Tensor, Tensor, Tensor], "tuple[Tensor, Tensor]"]


def masks_through_bias(config: Config) -> bool:
    """Whether the config's loss takes its masked columns through the scores' bias (MASK added
    there, see :data:`LossGradFn`): the cross-entropy losses."""
    return config.loss in SOFTMAX_LOSSES


def fused_loss_grad(config: Config, kernels: CpuKernels) -> LossGradFn | None:
    """The loss and dL/dx by the fused CPU kernels (float32 scores on the CPU) where they have
    the config's loss — cross-entropy without smoothing and BPR-max — else None. The fused
    cross-entropy overwrites its scores ``x`` with the gradient."""
    inv_b = 1.0 / float(config.batch_size)
    smoothing = float(config.smoothing)
    bpreg = float(config.bpreg)
    loss = config.loss
    act = config.final_activation

    if loss in ("cross-entropy", "xe_logit") and smoothing <= 0:
        logit_form = loss == "xe_logit"

        def xe_fused(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            return kernels.cross_entropy(x, row_valid * inv_b, logit_form), x

        return xe_fused

    if loss == "bpr-max":

        elu_alpha = act.params[0] if act.name == "elu" else None  # elu and its derivative go into the kernel

        def bpr_max_fused(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            r = x if elu_alpha is not None else act(x)  # the kernel activates x in place
            loss_value, grad = kernels.bpr_max(r, col_valid, row_valid * inv_b, bpreg, elu_alpha)
            f_prime = None if elu_alpha is not None else act.derivative(r)
            if f_prime is not None:
                grad.mul_(f_prime)
            return loss_value, grad

        return bpr_max_fused

    return None


def make_loss_grad(config: Config, kernels: CpuKernels | None = None) -> LossGradFn:
    """The loss and dL/dx for the config's loss, matching :func:`make_loss`. With ``kernels``,
    the fused version where there is one (:func:`fused_loss_grad`)."""
    fused = fused_loss_grad(config, kernels) if kernels is not None else None
    return fused if fused is not None else _loss_grad(config)


def _loss_grad(config: Config) -> LossGradFn:
    """The PyTorch loss gradients (the code the fused kernels are tested against)."""
    inv_b = 1.0 / float(config.batch_size)
    smoothing = float(config.smoothing)
    bpreg = float(config.bpreg)
    loss = config.loss
    act = config.final_activation

    if loss in ("cross-entropy", "xe_logit"):
        # L_i = Σ_j t_ij·(−log(p_ij + ε)) with t = (1 − e·n/(n−1))·[j = i] + e/(n−1)·valid_j;
        # dL_i/dx_ik = −t_ik·a_ik + p_ik·Σ_j t_ij·a_ij with a = p/(p + ε) (a = 1 for xe_logit).
        logit_form = loss == "xe_logit"

        def xe(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            if logit_form or smoothing > 0:
                logp = torch.log_softmax(x, dim=1)
                p = torch.exp(logp)
            else:  # only the positives' logs are needed: one softmax pass over the matrix
                p = torch.softmax(x, dim=1)
            p_pos = _positives(p)
            if logit_form:
                nll_pos = -_positives(logp)
                a_pos = torch.ones_like(p_pos)
            else:
                nll_pos = -torch.log(p_pos + EPS)
                a_pos = p_pos / (p_pos + EPS)
            w = row_valid * inv_b
            if smoothing <= 0:
                loss_value = torch.dot(nll_pos, w)
                coef = a_pos * w
                grad = p * coef.unsqueeze(1)
                _positives(grad).sub_(coef)
                return loss_value, grad
            share = smoothing / (n_cols - 1.0)
            t_pos = 1.0 - share * n_cols
            nll = -logp if logit_form else -torch.log(p + EPS)
            a = torch.ones_like(p) if logit_form else p / (p + EPS)
            per_row = t_pos * nll_pos + share * (nll @ col_valid)
            loss_value = torch.dot(per_row, w)
            ta = a * (share * col_valid)  # the smoothing part of t·a
            _positives(ta).add_(t_pos * a_pos)
            grad = (p * ta.sum(1, keepdim=True) - ta) * w.unsqueeze(1)
            return loss_value, grad

        return xe

    def finish(x: Tensor, r: Tensor, per_row: Tensor, d_r: Tensor, row_valid: Tensor) -> tuple[Tensor, Tensor]:
        """The loss and dL/dx from the per-row losses and dL/dr (which is overwritten)."""
        w = row_valid * inv_b
        grad = d_r.mul_(w.unsqueeze(1))
        f_prime = act.derivative(r)
        if f_prime is not None:
            grad.mul_(f_prime)
        return torch.dot(per_row, w), grad

    if loss == "bpr-max":
        # S_i = Σ_j s_ij·σ_ij (σ_ij = σ(r_ii − r_ij)), R_i = Σ_j s_ij·r_ij²:
        # dL_i/dr_ik = s_ik·(S_i − σ_ik²)/(S_i + ε) + bpreg·s_ik·(r_ik·(r_ik + 2) − R_i)   (k ≠ i)
        # dL_i/dr_ii = −Σ_j s_ij·σ_ij·(1 − σ_ij)/(S_i + ε) = −(S_i − Σ_j s_ij·σ_ij²)/(S_i + ε)
        # (in-place where possible: every pass over the B×C matrix counts on wide configurations)
        def bpr_max(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            r = act(x)
            s = _negatives_softmax(r, col_valid)
            pos = _positives(r)
            sig = torch.sigmoid(pos.unsqueeze(1) - r)
            s_sig = s * sig
            big_s = s_sig.sum(1)
            inv = 1.0 / (big_s + EPS)
            per_row = -torch.log(big_s + EPS)
            d_pos = (torch.linalg.vecdot(s_sig, sig) - big_s) * inv
            d_r = torch.addcmul(big_s.unsqueeze(1), sig, sig, value=-1.0).mul_(s).mul_(inv.unsqueeze(1))
            if bpreg > 0:
                big_r = torch.linalg.vecdot(s * r, r)
                per_row = per_row + bpreg * big_r
                q = torch.add(r, 2.0).mul_(r).sub_(big_r.unsqueeze(1)).mul_(s)
                d_r.add_(q, alpha=bpreg)
            _positives(d_r).copy_(d_pos)
            return finish(x, r, per_row, d_r, row_valid)

        return bpr_max

    if loss == "top1-max":
        # T_i = Σ_j s_ij·t_ij, t_ij = σ(r_ij − r_ii) + σ(r_ij²):
        # dL_i/dr_ik = s_ik·(t_ik − T_i) + s_ik·(σ'(r_ik − r_ii) + 2·r_ik·σ'(r_ik²))   (k ≠ i)
        # dL_i/dr_ii = −Σ_j s_ij·σ'(r_ij − r_ii)
        def top1_max(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            r = act(x)
            s = _negatives_softmax(r, col_valid)
            pos = _positives(r)
            q = torch.sigmoid(r - pos.unsqueeze(1))
            q2 = torch.sigmoid(r * r)
            t = q + q2
            per_row = (s * t).sum(1)
            dq = q * (1.0 - q)
            d_r = s * (t - per_row.unsqueeze(1) + dq + 2.0 * r * q2 * (1.0 - q2))
            _positives(d_r).copy_(-(s * dq).sum(1))
            return finish(x, r, per_row, d_r, row_valid)

        return top1_max

    if loss == "bpr":
        # L_i = Σ_j v_j·softplus(r_ij − r_ii): dL_i/dr_ik = v_k·q_ik − [k = i]·Σ_j v_j·q_ij.
        def bpr(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            r = act(x)
            diff = r - _positives(r).unsqueeze(1)
            per_row = F.softplus(diff) @ col_valid
            d_r = torch.sigmoid(diff) * col_valid
            _positives(d_r).sub_(d_r.sum(1))
            return finish(x, r, per_row, d_r, row_valid)

        return bpr

    if loss == "top1":
        # L_i = (Σ_j v_j·(σ(r_ij − r_ii) + σ(r_ij²)) − σ(r_ii²)) / n
        def top1(x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor) -> tuple[Tensor, Tensor]:
            r = act(x)
            pos = _positives(r)
            q = torch.sigmoid(r - pos.unsqueeze(1))
            q2 = torch.sigmoid(r * r)
            q2_pos = torch.sigmoid(pos * pos)
            per_row = ((q + q2) @ col_valid - q2_pos) / n_cols
            dq = q * (1.0 - q) * col_valid
            d_r = dq + 2.0 * r * q2 * (1.0 - q2) * col_valid
            diag = _positives(d_r)
            diag.sub_(dq.sum(1) + 2.0 * pos * q2_pos * (1.0 - q2_pos))
            return finish(x, r, per_row, d_r / n_cols, row_valid)

        return top1

    raise AssertionError(f"unhandled loss {loss!r}")
