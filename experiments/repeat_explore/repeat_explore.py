"""A learned repeat/explore mixture on top of a fitted GRU4Rec (issue 38's experiment), against
plain GRU4Rec, the repeat boost and the Pop / SPop / ItemKNN baselines, on ``train_valid``.

    python -m experiments.repeat_explore.repeat_explore --data ../shared/data/tmall_srgnn -pf paramfiles/tmall_srgnn_xe_best.py
    python -m experiments.repeat_explore.repeat_explore --data ../shared/data/diginetica_srgnn -pf paramfiles/diginetica_srgnn_xe_best.py
    python -m experiments.repeat_explore.repeat_explore --data ../shared/data/rsc15_100k -pf paramfiles/rsc15_xe_shared_100_best.py
    python -m experiments.repeat_explore.repeat_explore ... --bench      # the second stage's cost per evaluated position

The mixture (RepeatNet-style in form, a second stage: the network is not changed). For the next
click of a session whose distinct items so far are the *candidates* c,

    P(i) = p · P_rep(i) + (1 − p) · P_exp(i)

with ``P_exp`` the softmax of the network's scores over the catalogue, ``P_rep`` a softmax over
the candidates of a linear function of per-candidate features (:data:`CANDIDATE_FEATURES`) and
``p = σ(linear function of session features)`` (:data:`SESSION_FEATURES`). Taking logs and
dropping the row constant ``log(1 − p) − logsumexp(scores)``, the ranking is the network's raw
scores plus, for each candidate only, the non-negative bonus

    bonus_c = softplus(logit(p) + log P_rep(c) − log P_exp(c))

— an item the session has not clicked keeps its raw score, so the mixture is exactly a learned
per-candidate boost (the shape of :mod:`gru4rec.inference.repeat`'s), and every item has a
full-catalogue score. ``p ≡ 0`` gives bonus 0: the plain network. That is the *additive* form;
``--forms exclusive`` is RepeatNet's own (``P_exp`` renormalised over the items not clicked, so
``p`` is the probability of a return and the bonus may be negative), see :class:`Mixture`.
Refinements, each reported as its own row: ``rich`` features, ``mlp`` heads (16 tanh units), a
*gate offset* (a shift of logit p chosen on the fitting half by MRR@20) and, with
``--temperature``, the explore part's inverse temperature β (softmax of β·scores; β of highest
likelihood on the fitting half). The "oracle gate" row is a diagnostic, not a method: the gate is
told whether the target is a return.

Method (no leak): the network is trained on ``train_tr`` (or loaded from ``--work``); every
prediction of ``train_valid`` is scored once (:func:`network_pass`: per position the log-sum-exp,
entropy and spread of the scores, the top ``K`` scores and the candidates' scores — memory
bounded by the batch, a B×N block at a time). The validation sessions are split at random into
two halves; the mixture's 15–34 parameters are fitted by maximum likelihood (LBFGS, float64) on one
half and rank the other, then the halves swap and the ranks are pooled: every figure is measured
on sessions its parameters never saw. The boost's grid is chosen the same way (on the fitting
half, MRR@20), and the published coefficients are reported too. Ranks are full-catalogue,
conservative (``#{j : s_j ≥ s_target}``) and exact up to ``K − C`` (beyond it a rank only
needs to be known to exceed the largest cutoff): with the mixture replaced by the plain scores
(or the boost) they reproduce ``gru4rec evaluate`` (checked, ``verify`` lines).

Prints JSON lines; the model is cached under ``--work`` (default ``.bench/repeat_explore/<data
set>``, git-ignored). ``--model`` reuses any model file trained on ``train_tr``.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gru4rec import Config, GRU4Rec, evaluate
from gru4rec.baselines import ItemKNN, Pop, SessionPop
from gru4rec.data import read_events, sessions_from_events
from gru4rec.evaluation.schedule import schedule_sessions

CUTOFFS = (10, 20)
#: The decays whose decayed click counts are kept for the boost's grid.
BOOST_DECAYS = (0.5, 0.8, 1.0)
BOOST_WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)

#: Inverse temperatures of the explore part tried (its softmax is of β·scores; β = 1: the
#: network's own); the one of highest likelihood on the fitting half is kept.
BETAS = (0.25, 0.35, 0.5, 0.7, 1.0)
CANDIDATE_FEATURES = ("log_count", "log1p_recency", "is_previous", "log_p_network", "log_rank_network", "log1p_popularity")
SESSION_FEATURES = ("log_length", "log_distinct", "log_max_count", "max_log_p_network", "entropy_network",
                    "log_best_candidate_rank", "log_p_network_on_candidates", "repeat_share", "previous_is_repeat")
#: The "rich" variant adds fine-grained recency and count buckets to the candidates, the score of
#: a candidate at the current click, and the boost's terms (count, counts decayed by 0.5 and
#: 0.8, the score over the row's spread).
RECENCY_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 9), (10, 1 << 30))
COUNT_BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 1 << 30))


# ------------------------------------------------------------------------------------------
# The sessions' side: candidates of every prediction (host, NumPy, no loop over events)
# ------------------------------------------------------------------------------------------


@dataclass
class History:
    """Every prediction's candidates (its session's distinct items so far), P×C, most recent first.

    Prediction p (in the evaluator's order: session after session, sessions of one event skipped)
    predicts event ``j + 1`` of its session from events ``0 … j``."""

    items: np.ndarray  # int64 [P, C] candidate item indices (0 in padding)
    mask: np.ndarray  # bool [P, C]
    count: np.ndarray  # float64 [P, C] clicks of the candidate so far
    recency: np.ndarray  # float64 [P, C] clicks since its last click (0: the current click)
    decayed: dict[float, np.ndarray]  # decay → Σ decay^age over its clicks [P, C]
    length: np.ndarray  # float64 [P] clicks so far (j + 1)
    target: np.ndarray  # int64 [P] the item to predict
    target_slot: np.ndarray  # int64 [P] its column among the candidates, −1 if new
    session: np.ndarray  # int64 [P] index of the session (into offsets)

    @property
    def n(self) -> int:
        return len(self.target)

    def rows(self, index: np.ndarray) -> History:
        return History(self.items[index], self.mask[index], self.count[index], self.recency[index],
                       {d: v[index] for d, v in self.decayed.items()}, self.length[index], self.target[index],
                       self.target_slot[index], self.session[index])


def history_of(items: np.ndarray, offsets: np.ndarray, decays: Sequence[float] = BOOST_DECAYS) -> History:
    """The :class:`History` of every prediction of the sessions ``items[offsets[s]:offsets[s+1]]``."""
    lengths = np.diff(offsets)
    used = np.flatnonzero(lengths >= 2)
    n_steps = lengths[used] - 1
    P = int(n_steps.sum())
    sess = np.repeat(used, n_steps)
    j = np.arange(P) - np.repeat(np.cumsum(n_steps) - n_steps, n_steps)
    # All (prediction, earlier click) pairs: prediction p sees clicks i = 0 … j.
    n_pairs = j + 1
    pp = np.repeat(np.arange(P), n_pairs)
    i = np.arange(int(n_pairs.sum())) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs)
    item = items[offsets[sess[pp]] + i]
    age = j[pp] - i
    # Group the pairs by (prediction, item): count, last click, decayed sums.
    order = np.lexsort((age, item, pp))
    pp, item, age = pp[order], item[order], age[order]
    first = np.r_[True, (pp[1:] != pp[:-1]) | (item[1:] != item[:-1])]
    g = np.cumsum(first) - 1
    g_pp, g_item, g_recency = pp[first], item[first], age[first]  # sorted by age: the first is the most recent
    g_count = np.bincount(g, minlength=len(g_pp)).astype(np.float64)
    g_decayed = {d: np.bincount(g, weights=np.power(d, age), minlength=len(g_pp)) for d in decays}
    # Candidates of a prediction, most recent first.
    order = np.lexsort((g_recency, g_pp))
    g_pp, g_item, g_recency, g_count = g_pp[order], g_item[order], g_recency[order], g_count[order]
    g_decayed = {d: v[order] for d, v in g_decayed.items()}
    per = np.bincount(g_pp, minlength=P)
    C = int(per.max())
    col = np.arange(len(g_pp)) - np.repeat(np.cumsum(per) - per, per)
    shape = (P, C)
    out_items = np.zeros(shape, dtype=np.int64)
    mask = np.zeros(shape, dtype=bool)
    count = np.zeros(shape)
    recency = np.zeros(shape)
    out_items[g_pp, col] = g_item
    mask[g_pp, col] = True
    count[g_pp, col] = g_count
    recency[g_pp, col] = g_recency
    decayed = {}
    for d, v in g_decayed.items():
        decayed[d] = np.zeros(shape)
        decayed[d][g_pp, col] = v
    target = items[offsets[sess] + j + 1]
    hit = (out_items == target[:, None]) & mask
    target_slot = np.where(hit.any(1), hit.argmax(1), -1)
    return History(out_items, mask, count, recency, decayed, (j + 1).astype(np.float64), target, target_slot, sess)


# ------------------------------------------------------------------------------------------
# The network's side: what the second stage reads from a row of scores
# ------------------------------------------------------------------------------------------


@dataclass
class NetworkView:
    """Per prediction (rows), what the second stage needs of the network's full-catalogue scores."""

    lse: Tensor  # [P] logsumexp of the scores
    lse_beta: Tensor  # [P, len(BETAS)] logsumexp of β·scores for each β of BETAS
    entropy: Tensor  # [P] entropy of their softmax
    std: Tensor  # [P] their standard deviation (the boost's σ)
    top_vals: Tensor  # [P, K] the K highest scores, descending
    top_ids: Tensor  # [P, K] their items
    top_in_session: Tensor  # [P, K] whether that item is a candidate
    cand_scores: Tensor  # [P, C] the candidates' scores
    target_score: Tensor  # [P] the target's score
    plain_rank: Tensor  # [P] its conservative rank among all items: #{j : s_j ≥ s_target}

    @staticmethod
    def of(scores: Tensor, cand_items: Tensor, cand_mask: Tensor, target: Tensor | None, k: int) -> NetworkView:
        """The view of a block of rows of ``scores`` (B×N); ``target`` None (serving): no
        target score, plain rank or spread (zeros), only what the mixture reads."""
        lse = torch.logsumexp(scores, 1)
        lse_beta = torch.stack([torch.logsumexp(scores * b, 1) for b in BETAS], 1)
        prob = torch.exp(scores - lse[:, None])
        entropy = lse - (prob * scores).sum(1)
        top = torch.topk(scores, k, dim=1, sorted=True)
        in_session = (top.indices[:, :, None] == cand_items[:, None, :]).logical_and(cand_mask[:, None, :]).any(2)
        if target is None:
            zeros = torch.zeros_like(lse)
            target_score, plain_rank, std = zeros, zeros.long(), zeros
        else:
            target_score = scores.gather(1, target[:, None])[:, 0]
            plain_rank, std = (scores >= target_score[:, None]).sum(1), scores.std(1)
        return NetworkView(lse, lse_beta, entropy, std, top.values, top.indices, in_session, scores.gather(1, cand_items),
                           target_score, plain_rank)

    def rows(self, index: Tensor | np.ndarray) -> NetworkView:
        index = torch.as_tensor(index)
        return NetworkView(*(getattr(self, f).index_select(0, index) for f in self.__dataclass_fields__))


def network_pass(model: GRU4Rec, items: np.ndarray, offsets: np.ndarray, hist: History, k: int,
                 batch_size: int = 256) -> NetworkView:
    """Run the network over every session (the evaluator's schedule: same predictions, same
    order) and keep the :class:`NetworkView` of every prediction; one B×N block at a time."""
    sched = schedule_sessions(items, offsets, batch_size)
    assert sched.n_predictions == hist.n
    T, B = sched.inputs.shape
    P = hist.n
    # Row P is the dump row of idle cells.
    cand = torch.from_numpy(np.vstack([hist.items, np.zeros((1, hist.items.shape[1]), dtype=np.int64)]))
    cand_mask = torch.from_numpy(np.vstack([hist.mask, np.zeros((1, hist.items.shape[1]), dtype=bool)]))
    fields: dict[str, Tensor] = {}
    inputs, targets = torch.from_numpy(sched.inputs), torch.from_numpy(sched.targets)
    reset, pidx = torch.from_numpy(sched.reset), torch.from_numpy(sched.pred_index)
    buf = None
    with torch.no_grad():
        hidden_full = model.init_state(B)
        hidden = hidden_full
        for step in range(T):
            A = int(sched.active[step])
            if A < len(hidden[0]):
                hidden = [h[:A] for h in hidden_full]
            if step:
                for h in hidden:
                    h.masked_fill_(reset[step, :A, None], 0.0)
            out = model.step(inputs[step, :A], hidden)
            if buf is None:
                buf = torch.empty(B, len(model.item_map), dtype=out.dtype)
            scores = model.scores(out, buffer=buf[:A])
            rows = pidx[step, :A]
            view = NetworkView.of(scores, cand[rows], cand_mask[rows], targets[step, :A], k)
            for f in view.__dataclass_fields__:
                value = getattr(view, f)
                if f not in fields:
                    fields[f] = torch.zeros((P + 1, *value.shape[1:]), dtype=value.dtype)
                fields[f].index_copy_(0, rows, value)
    return NetworkView(**{f: v[:P] for f, v in fields.items()})


# ------------------------------------------------------------------------------------------
# Features, the mixture, ranks
# ------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """What the mixture reads for a set of predictions (float64)."""

    cand: Tensor  # [P, C, Fc] candidate features
    sess: Tensor  # [P, Fs] session features
    mask: Tensor  # [P, C]
    cand_logp: Tensor  # [P, C] the explore part's log-probability of each candidate (softmax of β·scores)
    target_logp: Tensor  # [P] … of the target
    target_slot: Tensor  # [P] (−1: a new item)
    beta: float = 1.0  # the explore part's inverse temperature

    def rows(self, index: np.ndarray) -> Inputs:
        index = torch.as_tensor(index)
        return Inputs(*(getattr(self, f).index_select(0, index) for f in self.__dataclass_fields__ if f != "beta"), beta=self.beta)


def network_rank(view: NetworkView, scores: Tensor) -> Tensor:
    """Conservative rank among all items of each [P, C] score, from the top K (K+1 below the
    K-th score; at it, ties beyond the top K are not counted)."""
    k = view.top_vals.shape[1]
    inside = scores >= view.top_vals[:, -1:]
    counted = (view.top_vals[:, None, :] >= scores[:, :, None]).sum(2)
    return torch.where(inside, counted, torch.full_like(counted, k + 1))


def features(view: NetworkView, hist: History, support: np.ndarray, variant: str = "base", beta: float = 1.0) -> Inputs:
    """The candidate and session features of :data:`CANDIDATE_FEATURES` / :data:`SESSION_FEATURES`
    (``variant='rich'``: plus recency and count buckets per candidate), and the explore part's
    log-probabilities at inverse temperature ``beta`` (one of :data:`BETAS`; the features read the
    network's own softmax, β = 1)."""
    f64 = torch.float64
    mask = torch.from_numpy(hist.mask)
    count = torch.from_numpy(hist.count)
    recency = torch.from_numpy(hist.recency)
    lse = view.lse.to(f64)[:, None]
    cand_logp = torch.where(mask, view.cand_scores.to(f64) - lse, torch.zeros((), dtype=f64))
    rank = network_rank(view, view.cand_scores).to(f64)
    pop = torch.from_numpy(np.log1p(support.astype(np.float64)))[torch.from_numpy(hist.items)]
    cand = [torch.log(count.clamp(min=1)), torch.log1p(recency), (recency == 0).to(f64), cand_logp, torch.log(rank), pop]
    if variant == "rich":
        cand += [((recency >= lo) & (recency <= hi)).to(f64) for lo, hi in RECENCY_BUCKETS[1:]]
        cand += [((count >= lo) & (count <= hi)).to(f64) for lo, hi in COUNT_BUCKETS[1:]]
        cand += [cand_logp * (recency == 0).to(f64)]
        # The boost's own terms: the click count, decayed counts, the score in units of the row's spread.
        cand += [count, torch.from_numpy(hist.decayed[0.5]), torch.from_numpy(hist.decayed[0.8]),
                 view.cand_scores.to(f64) / view.std.to(f64)[:, None].clamp(min=1e-6)]
    big = torch.finfo(f64).max
    length = torch.from_numpy(hist.length)
    distinct = mask.sum(1).to(f64)
    prev_count = (count * (recency == 0)).sum(1)
    sess = [torch.log(length), torch.log(distinct), torch.log(count.max(1).values), (view.top_vals[:, 0].to(f64) - lse[:, 0]),
            view.entropy.to(f64), torch.log(torch.where(mask, rank, torch.full_like(rank, big)).min(1).values),
            torch.logsumexp(cand_logp.masked_fill(~mask, -torch.inf), 1), (length - distinct) / length, (prev_count > 1).to(f64)]
    cand_t = torch.stack(cand, 2) * mask[:, :, None]
    lse_b = view.lse_beta[:, BETAS.index(beta)].to(f64)[:, None]
    explore_logp = torch.where(mask, beta * view.cand_scores.to(f64) - lse_b, torch.zeros((), dtype=f64))
    return Inputs(cand_t, torch.stack(sess, 1), mask, explore_logp, beta * view.target_score.to(f64) - lse_b[:, 0],
                  torch.from_numpy(hist.target_slot), beta)


class Mixture(torch.nn.Module):
    """p = σ(v·g + b) and P_rep = softmax over the candidates of (w·f) (features standardised
    with the fitting set's mean and spread); :meth:`bonus` is what it adds to the raw scores.

    ``form='additive'``: P = p·P_rep + (1 − p)·P_exp with P_exp the network's softmax over the
    whole catalogue (a candidate keeps its explore share: the bonus is ≥ 0).
    ``form='exclusive'`` (RepeatNet's): P_exp is the network's softmax over the items the
    session has *not* clicked, so p is the probability that the next click is a return and the
    candidates get p·P_rep alone — a candidate can fall below its network score.
    ``hidden > 0``: the two linear functions become one-hidden-layer MLPs (tanh), the candidate
    one also reading the session features. ``offset`` is added to logit(p) (0 when fitted).
    With the explore part a softmax of β·scores, the final log-probabilities divided by β are, up
    to a row constant, the raw scores for the items not clicked: the bonus is in score units."""

    def __init__(self, n_cand: int, n_sess: int, hidden: int = 0, form: str = "additive") -> None:
        super().__init__()
        if form not in ("additive", "exclusive"):
            raise ValueError(f"form: expected 'additive' or 'exclusive', got {form!r}")
        self.form = form
        self.offset: float | Tensor = 0.0
        self.register_buffer("cand_mean", torch.zeros(n_cand, dtype=torch.float64))
        self.register_buffer("cand_std", torch.ones(n_cand, dtype=torch.float64))
        self.register_buffer("sess_mean", torch.zeros(n_sess, dtype=torch.float64))
        self.register_buffer("sess_std", torch.ones(n_sess, dtype=torch.float64))

        def head(n_in: int) -> torch.nn.Module:
            if hidden:
                return torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
            return torch.nn.Linear(n_in, 1)

        self.rep = head(n_cand + n_sess if hidden else n_cand)
        self.gate = head(n_sess)
        self.hidden = hidden
        self.double()
        if not hidden:
            for m in (self.rep, self.gate):
                torch.nn.init.zeros_(m.weight)
                torch.nn.init.zeros_(m.bias)

    def standardise(self, x: Inputs) -> None:
        c = x.cand[x.mask]
        self.cand_mean.copy_(c.mean(0))
        self.cand_std.copy_(c.std(0).clamp(min=1e-6))
        self.sess_mean.copy_(x.sess.mean(0))
        self.sess_std.copy_(x.sess.std(0).clamp(min=1e-6))

    def forward(self, x: Inputs) -> tuple[Tensor, Tensor]:
        """(logit p [P], log P_rep [P, C], −inf outside the mask)."""
        s = (x.sess - self.sess_mean) / self.sess_std
        c = (x.cand - self.cand_mean) / self.cand_std
        if self.hidden:
            c = torch.cat([c, s[:, None, :].expand(-1, c.shape[1], -1)], 2)
        u = self.rep(c)[..., 0].masked_fill(~x.mask, -torch.inf)
        return self.gate(s)[:, 0] + self.offset, torch.log_softmax(u, 1)

    def _explore_norm(self, x: Inputs) -> Tensor:
        """log of the explore part's normaliser relative to the full softmax: 0 (additive) or
        −log(1 − P_exp(candidates)) (exclusive)."""
        if self.form == "additive":
            return torch.zeros_like(x.target_logp)
        on_candidates = torch.logsumexp(x.cand_logp.masked_fill(~x.mask, -torch.inf), 1).clamp(max=-1e-9)
        return -torch.log(-torch.expm1(on_candidates))

    def nll(self, x: Inputs) -> Tensor:
        """Mean negative log-likelihood of the targets under the mixture."""
        logit_p, log_rep = self(x)
        seen = x.target_slot >= 0
        rep = torch.nn.functional.logsigmoid(logit_p) + log_rep.gather(1, x.target_slot.clamp(min=0)[:, None])[:, 0]
        rep = torch.where(seen, rep, torch.full_like(rep, -torch.inf))
        explore = torch.nn.functional.logsigmoid(-logit_p) + x.target_logp + self._explore_norm(x)
        if self.form == "exclusive":
            explore = torch.where(seen, torch.full_like(explore, -torch.inf), explore)
        return -torch.logaddexp(rep, explore).mean()

    def bonus(self, x: Inputs) -> Tensor:
        """What each candidate's raw score gains [P, C] (0 outside the mask): the final score is
        the log of the mixture's probability, divided by β, up to the row's constant
        (log(1 − p) − logsumexp(β·scores)) / β (additive; exclusive: also − log(1 − P_exp(candidates))):
        softplus(logit p + log P_rep − log P_exp) / β (additive), (logit p + log P_rep −
        log P_exp + log(1 − P_exp(candidates))) / β (exclusive)."""
        logit_p, log_rep = self(x)
        z = logit_p[:, None] + log_rep - x.cand_logp
        b = torch.nn.functional.softplus(z) if self.form == "additive" else z - self._explore_norm(x)[:, None]
        return (b / x.beta).masked_fill(~x.mask, 0.0)


def fit_mixture(x: Inputs, hidden: int = 0, form: str = "additive", max_iter: int = 300, seed: int = 0) -> tuple[Mixture, float]:
    """Maximum likelihood of the targets (LBFGS, full batch, float64); returns the model and its final NLL."""
    torch.manual_seed(seed)
    model = Mixture(x.cand.shape[2], x.sess.shape[1], hidden, form)
    model.standardise(x)
    opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = model.nll(x)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return model, float(model.nll(x))


def ranks_with_bonus(view: NetworkView, mask: Tensor, target_slot: Tensor, bonus: Tensor) -> Tensor:
    """Conservative full-catalogue rank of each target when the candidates' scores get ``bonus``
    (float32, as the evaluator adds a boost to its float32 scores): #{j : s_j + bonus_j ≥ s_t + bonus_t}.

    Exact while the rank is ≤ K − C (and always when K is the number of items); beyond, K + 1
    or a count ≥ K − C (every item of the top K not in the session then outranks the target)."""
    bonus = bonus.to(view.cand_scores.dtype).masked_fill(~mask, 0.0)
    boosted = view.cand_scores + bonus
    seen = target_slot >= 0
    t = torch.where(seen, boosted.gather(1, target_slot.clamp(min=0)[:, None])[:, 0], view.target_score)
    above_seen = ((boosted >= t[:, None]) & mask).sum(1)
    above_new = ((view.top_vals >= t[:, None]) & ~view.top_in_session).sum(1)
    # Below the K-th score, items outside the top K may outrank the target: the rank is then only
    # known to exceed K − C. (At the K-th score the count is exact but for ties beyond the top K,
    # and at least K − C anyway.)
    beyond = t < view.top_vals[:, -1]
    k = view.top_vals.shape[1]
    return torch.where(beyond, torch.full_like(above_new, k + 1), above_seen + above_new)


def metrics(ranks: Tensor | np.ndarray, cutoffs: Sequence[int] = CUTOFFS) -> dict[str, float]:
    r = np.asarray(ranks, dtype=np.float64)
    out = {}
    for c in cutoffs:
        out[f"recall@{c}"] = round(float((r <= c).mean()), 4)
        out[f"mrr@{c}"] = round(float(np.where(r <= c, 1.0 / r, 0.0).mean()), 4)
    return out


def boost_bonus(view: NetworkView, hist: History, weight: float, decay: float) -> Tensor:
    """The repeat boost's addition (weight · σ · Σ decay^age) per candidate."""
    return (weight * view.std[:, None].to(torch.float64) * torch.from_numpy(hist.decayed[decay])).to(torch.float32)


# ------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------


def trained(config: Config, data: Path, path: Path, threads: int) -> GRU4Rec:
    if path.exists():
        return GRU4Rec.load(path, device="cpu")
    start = time.perf_counter()
    model = GRU4Rec(config, device="cpu", threads=threads).fit(data, progress=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    print(json.dumps({"trained": str(data), "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    return model


def emit(**row: object) -> None:
    print(json.dumps(row), flush=True)


#: Offsets of logit(p) tried after the fit, chosen on the fitting half by MRR@20 (0 = the MLE).
GATE_OFFSETS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def cross_fit(view: NetworkView, hist: History, xs: dict[float, Inputs], halves: np.ndarray, hidden: int, form: str,
              name: str) -> tuple[np.ndarray, np.ndarray]:
    """Fit on one half, rank the other, swap: the pooled ranks of the maximum-likelihood fit
    (over the parameters and the explore part's β of ``xs``: the inputs at each β), and of the
    same fit with logit(p) shifted by the offset of :data:`GATE_OFFSETS` that is best (MRR@20)
    on the fitting half."""
    ranks = np.zeros(hist.n, dtype=np.int64)
    tuned = np.zeros(hist.n, dtype=np.int64)
    oracle = np.zeros(hist.n, dtype=np.int64)
    for fold in (0, 1):
        fit_rows, eval_rows = np.flatnonzero(halves == fold), np.flatnonzero(halves != fold)
        start = time.perf_counter()
        fits = {beta: fit_mixture(x.rows(fit_rows), hidden=hidden, form=form) for beta, x in xs.items()}
        beta = min(fits, key=lambda b: fits[b][1])
        model, nll = fits[beta]
        x = xs[beta]
        xf = x.rows(fit_rows)
        seconds = time.perf_counter() - start
        vf = view.rows(fit_rows)
        with torch.no_grad():
            def fit_mrr(offset: float, model: Mixture = model, vf: NetworkView = vf, xf: Inputs = xf) -> float:
                model.offset = offset
                return metrics(ranks_with_bonus(vf, xf.mask, xf.target_slot, model.bonus(xf)))["mrr@20"]

            offset = max(GATE_OFFSETS, key=lambda o: (fit_mrr(o), -abs(o)))
            xe = x.rows(eval_rows)
            v = view.rows(eval_rows)
            model.offset = 0.0
            nll_eval = float(model.nll(xe))
            p = torch.sigmoid(model(xe)[0])
            ranks[eval_rows] = ranks_with_bonus(v, xe.mask, xe.target_slot, model.bonus(xe)).numpy()
            model.offset = offset
            tuned[eval_rows] = ranks_with_bonus(v, xe.mask, xe.target_slot, model.bonus(xe)).numpy()
            # A diagnostic, not a method: the gate told whether the target is a return (p → 1 or
            # 0), the rest as fitted — what a perfect "whether" would add to this "which".
            model.offset = torch.where(xe.target_slot >= 0, 40.0, -40.0).to(torch.float64)
            oracle[eval_rows] = ranks_with_bonus(v, xe.mask, xe.target_slot, model.bonus(xe)).numpy()
            model.offset = 0.0
        seen = (xe.target_slot >= 0).to(torch.float64)
        emit(row=name, fold=fold, nll_fit=round(nll, 4), nll_eval=round(nll_eval, 4), fit_seconds=round(seconds, 1),
             mean_p=round(float(p.mean()), 4), share_repeat_targets=round(float(seen.mean()), 4), gate_offset=offset,
             beta=beta, nll_fit_by_beta={b: round(f[1], 4) for b, f in fits.items()},
             **({"weights": {k: [round(float(w), 3) for w in v.flatten()] for k, v in model.state_dict().items()
                             if not k.endswith(("mean", "std"))}} if not hidden else {}))
    emit(row=f"{name}, oracle gate (diagnostic)", **metrics(oracle))
    return ranks, tuned


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="folder with train_tr and train_valid")
    p.add_argument("-pf", "--paramfile", required=True)
    p.add_argument("--model", type=Path, default=None, help="a model trained on train_tr (default: train or load --work's)")
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--topk", type=int, default=0, help="K (default: the most candidates of a prediction + 64)")
    p.add_argument("--published", default=None, help="the published boost coefficients WEIGHT,DECAY (also reported)")
    p.add_argument("--variants", default="base,rich", help="mixtures to fit: base, rich, mlp (rich features, hidden 16)")
    p.add_argument("--forms", default="additive,exclusive", help="the mixture's forms (see Mixture)")
    p.add_argument("--temperature", action="store_true", help=f"also fit the explore part's inverse temperature β (grid {BETAS})")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="seed of the split into halves")
    p.add_argument("--bench", action="store_true", help="only measure the second stage's cost per position")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = args.work or Path(".bench/repeat_explore") / args.data.name
    ext = next(s for s in (".tsv", ".tsv.gz") if (args.data / f"train_tr{s}").exists())
    train, valid = args.data / f"train_tr{ext}", args.data / f"train_valid{ext}"
    model = trained(Config.from_file(args.paramfile), train, args.model or work / "train_tr.safetensors", args.threads)
    model.config = model.config.replace(repeat_weight=0.0, repeat_decay=1.0)
    cfg = model.config
    df = read_events(valid, session_key=cfg.session_key, item_key=cfg.item_key, time_key=cfg.time_key)
    sessions, _ = sessions_from_events(df, model.item_map, drop_unknown=True, session_key=cfg.session_key,
                                       item_key=cfg.item_key, time_key=cfg.time_key)
    hist = history_of(sessions.items, sessions.offsets)
    C = hist.items.shape[1]
    k = args.topk or C + 64
    assert k - C > max(CUTOFFS), "K must exceed the candidates by more than the largest cutoff"
    if args.bench:
        return bench(model, sessions.items, sessions.offsets, hist, k)
    start = time.perf_counter()
    cache = work / f"view_k{k}_b{len(BETAS)}.pt"
    if cache.exists() and cache.stat().st_mtime > (args.model or work / "train_tr.safetensors").stat().st_mtime:
        view = NetworkView(**torch.load(cache))
    else:
        view = network_pass(model, sessions.items, sessions.offsets, hist, k)
        torch.save({f: getattr(view, f) for f in view.__dataclass_fields__}, cache)
    emit(data=args.data.name, predictions=hist.n, max_candidates=C, k=k, network_pass_seconds=round(time.perf_counter() - start, 1),
         repeat_targets=round(float((hist.target_slot >= 0).mean()), 4))
    mask_t, slot_t = torch.from_numpy(hist.mask), torch.from_numpy(hist.target_slot)

    # Plain, checked against the package's evaluator.
    plain = ranks_with_bonus(view, mask_t, slot_t, torch.zeros(hist.items.shape))
    full = view.plain_rank.numpy()
    assert np.array_equal(np.minimum(plain.numpy(), k + 1) <= max(CUTOFFS), full <= max(CUTOFFS))
    ev = evaluate(model, valid, cutoffs=CUTOFFS, mode="conservative", beyond_accuracy=False)
    emit(verify="plain", evaluator={f"{m}@{c}": round(getattr(ev, m)[c], 4) for m in ("recall", "mrr") for c in CUTOFFS},
         ours=metrics(plain), full_rank=metrics(full))
    emit(row="plain", **metrics(plain))

    # The boost: the published coefficients (checked against the evaluator) and the grid chosen per half.
    halves = np.random.default_rng(args.seed).integers(0, 2, size=len(sessions.offsets) - 1)[hist.session]
    if args.published:
        w, d = (float(v) for v in args.published.split(","))
        r = ranks_with_bonus(view, mask_t, slot_t, boost_bonus(view, hist, w, d))
        model.config = cfg.replace(repeat_weight=w, repeat_decay=d)
        ev = evaluate(model, valid, cutoffs=CUTOFFS, mode="conservative", beyond_accuracy=False)
        model.config = cfg
        emit(verify="boost", weight=w, decay=d,
             evaluator={f"{m}@{c}": round(getattr(ev, m)[c], 4) for m in ("recall", "mrr") for c in CUTOFFS}, ours=metrics(r))
        emit(row="boost (published coefficients)", weight=w, decay=d, **metrics(r))
    boost_ranks = np.zeros(hist.n, dtype=np.int64)
    for fold in (0, 1):
        fit_rows, eval_rows = np.flatnonzero(halves == fold), np.flatnonzero(halves != fold)
        vf = view.rows(fit_rows)
        best = max(((w, d) for w in BOOST_WEIGHTS for d in BOOST_DECAYS), key=lambda wd: (metrics(ranks_with_bonus(
            vf, mask_t[fit_rows], slot_t[fit_rows], boost_bonus(view, hist, *wd)[fit_rows]))["mrr@20"], -wd[0]))
        boost_ranks[eval_rows] = ranks_with_bonus(view.rows(eval_rows), mask_t[eval_rows], slot_t[eval_rows],
                                                  boost_bonus(view, hist, *best)[eval_rows]).numpy()
        emit(row="boost grid", fold=fold, weight=best[0], decay=best[1])
    emit(row="boost (cross-fitted grid)", **metrics(boost_ranks))

    # The mixtures, cross-fitted.
    seen = hist.target_slot >= 0
    emit(row="by target", plain_repeat=metrics(plain.numpy()[seen]), plain_new=metrics(plain.numpy()[~seen]),
         boost_repeat=metrics(boost_ranks[seen]), boost_new=metrics(boost_ranks[~seen]))
    for form in args.forms.split(","):
        for variant in args.variants.split(","):
            betas = BETAS if args.temperature else (1.0,)
            xs = {b: features(view, hist, model.item_support, "base" if variant == "base" else "rich", b) for b in betas}
            name = f"mixture {form} {variant}" + (" β" if args.temperature else "")
            ranks, tuned = cross_fit(view, hist, xs, halves, hidden=16 if variant == "mlp" else 0, form=form, name=name)
            emit(row=f"{name} (cross-fitted)", **metrics(ranks))
            emit(row=f"{name} + gate offset (cross-fitted)", **metrics(tuned))
            emit(row=f"{name} by target", repeat=metrics(ranks[seen]), new=metrics(ranks[~seen]),
                 tuned_repeat=metrics(tuned[seen]), tuned_new=metrics(tuned[~seen]))

    if not args.no_baselines:
        for name, baseline in (("Pop", Pop()), ("SPop", SessionPop()), ("ItemKNN", ItemKNN())):
            baseline.fit(train)
            ev = evaluate(baseline, valid, cutoffs=CUTOFFS, mode="conservative", beyond_accuracy=False)
            emit(row=name, **{f"{m}@{c}": round(getattr(ev, m)[c], 4) for m in ("recall", "mrr") for c in CUTOFFS})
    return 0


def bench(model: GRU4Rec, items: np.ndarray, offsets: np.ndarray, hist: History, k: int,
          mixture: Mixture | None = None, positions: int = 4096) -> int:
    """Time per position of serving the next click plainly (GRU step, scores of all items, the
    top 20) and with the second stage (the same, plus the view of the scores, the features —
    the session's part, kept per session in a server, is taken as given —, the mixture, its
    bonus added to the candidates' scores, then the top 20), over the first ``positions``
    predictions of the evaluator's schedule, at batch 1 (a served click) and batch 256 (an
    evaluation step). An unfitted mixture costs what a fitted one does."""
    mixture = mixture or Mixture(len(CANDIDATE_FEATURES), len(SESSION_FEATURES))
    for B in (1, 256):
        sched = schedule_sessions(items, offsets, B)
        steps = [s for s in range(sched.inputs.shape[0]) if sched.active[s] == sched.inputs.shape[1]][: max(1, positions // B)]
        inputs = torch.from_numpy(sched.inputs)
        reset, pidx = torch.from_numpy(sched.reset), torch.from_numpy(sched.pred_index)
        cand, cmask = torch.from_numpy(hist.items), torch.from_numpy(hist.mask)
        rows_of = [pidx[s].numpy() for s in steps]
        hist_of = [hist.rows(r) for r in rows_of]
        seconds = {}
        for name in ("plain", "mixture", "plain", "mixture"):
            buf = torch.empty(sched.inputs.shape[1], len(model.item_map))
            with torch.no_grad():
                hidden = model.init_state(sched.inputs.shape[1])
                start = time.perf_counter()
                for step, rows, h in zip(steps, rows_of, hist_of):
                    for state in hidden:
                        state.masked_fill_(reset[step, :, None], 0.0)
                    scores = model.scores(model.step(inputs[step], hidden), buffer=buf)
                    if name == "mixture":
                        r = torch.from_numpy(rows)
                        view = NetworkView.of(scores, cand[r], cmask[r], None, k)
                        x = features(view, h, model.item_support)
                        bonus = mixture.bonus(x).to(scores.dtype)
                        scores.scatter_add_(1, cand[r], bonus)
                    torch.topk(scores, 20, dim=1)
                seconds[name] = time.perf_counter() - start  # the second round (warm) is kept
        n = len(steps) * sched.inputs.shape[1]
        emit(bench="second stage", batch=B, positions=n, plain_us=round(1e6 * seconds["plain"] / n, 1),
             mixture_us=round(1e6 * seconds["mixture"] / n, 1), ratio=round(seconds["mixture"] / seconds["plain"], 3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
