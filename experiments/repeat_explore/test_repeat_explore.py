"""The repeat/explore mixture experiment (experiments/repeat_explore/repeat_explore.py, issue 38): its candidates,
its scores against a NumPy reference of p·P_rep + (1 − p)·P_exp, and its full-catalogue ranks
against a brute-force conservative rank."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.repeat_explore import repeat_explore as rx


def random_sessions(rng: np.random.Generator, n_items: int, n_sessions: int, longest: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(1, longest + 1, size=n_sessions)
    # A small catalogue slice per session, so that items come back.
    items = np.concatenate([rng.choice(rng.choice(n_items, size=4, replace=False), size=n) for n in lengths])
    return items.astype(np.int64), np.r_[0, np.cumsum(lengths)].astype(np.int64)


def reference_history(items: np.ndarray, offsets: np.ndarray, decay: float) -> list[dict]:
    """Per prediction, by a Python loop: {item: (count, clicks since its last click, Σ decay^age)} and the target."""
    out = []
    for s in range(len(offsets) - 1):
        session = items[offsets[s]:offsets[s + 1]]
        for j in range(len(session) - 1):
            seen: dict[int, list[float]] = {}
            for i in range(j + 1):
                entry = seen.setdefault(int(session[i]), [0.0, 0.0, 0.0])
                entry[0] += 1
                entry[1] = j - i
                entry[2] += decay ** (j - i)
            out.append({"seen": seen, "target": int(session[j + 1]), "length": j + 1})
    return out


def test_history_matches_a_loop():
    rng = np.random.default_rng(3)
    items, offsets = random_sessions(rng, 30, 40, 9)
    hist = rx.history_of(items, offsets, decays=(0.5, 1.0))
    ref = reference_history(items, offsets, 0.5)
    assert hist.n == len(ref)
    for p, r in enumerate(ref):
        cols = np.flatnonzero(hist.mask[p])
        got = {int(hist.items[p, c]): [hist.count[p, c], hist.recency[p, c], hist.decayed[0.5][p, c]] for c in cols}
        assert got.keys() == r["seen"].keys()
        for item, (count, recency, decayed) in r["seen"].items():
            assert got[item][:2] == [count, recency]
            assert got[item][2] == pytest.approx(decayed)
            assert hist.decayed[1.0][p, list(hist.items[p, cols]).index(item)] == count
        assert list(hist.recency[p, cols]) == sorted(hist.recency[p, cols])  # most recent first
        assert hist.length[p] == r["length"] and hist.target[p] == r["target"]
        slot = hist.target_slot[p]
        assert (slot >= 0) == (r["target"] in r["seen"]) and (slot < 0 or hist.items[p, slot] == r["target"])


def case(seed: int = 0, n_items: int = 12):
    """Random scores for every prediction of a few random sessions, their view and features."""
    rng = np.random.default_rng(seed)
    items, offsets = random_sessions(rng, n_items, 12, 7)
    hist = rx.history_of(items, offsets)
    scores = torch.from_numpy(rng.normal(size=(hist.n, n_items)).astype(np.float32))
    scores[0, 1] = scores[0, 2]  # a tie
    view = rx.NetworkView.of(scores, torch.from_numpy(hist.items), torch.from_numpy(hist.mask), torch.from_numpy(hist.target), n_items)
    support = rng.integers(1, 50, size=n_items)
    return rng, scores, hist, view, support


def random_mixture(rng: np.random.Generator, x, form: str = "additive") -> rx.Mixture:
    model = rx.Mixture(x.cand.shape[2], x.sess.shape[1], form=form)
    model.standardise(x)
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(torch.from_numpy(rng.normal(size=tuple(prm.shape))))
    return model


def reference_features(scores: np.ndarray, seen: dict, length: int, support: np.ndarray) -> tuple[dict, np.ndarray]:
    """The features of one prediction, from their definitions (NumPy, float64)."""
    s = scores.astype(np.float64)
    lse = np.log(np.exp(s).sum())
    logp = s - lse
    prob = np.exp(logp)
    cand = {}
    for item, (count, recency, _) in seen.items():
        rank = np.sum(scores >= scores[item])
        cand[item] = np.array([np.log(count), np.log1p(recency), float(recency == 0), logp[item], np.log(rank), np.log1p(support[item])])
    counts = np.array([v[0] for v in seen.values()])
    prev = [v[0] for v in seen.values() if v[1] == 0][0]
    sess = np.array([np.log(length), np.log(len(seen)), np.log(counts.max()), logp.max(), -(prob * logp).sum(),
                     min(np.log(np.sum(scores >= scores[i])) for i in seen), np.log(prob[list(seen)].sum()),
                     (length - len(seen)) / length, float(prev > 1)])
    return cand, sess


@pytest.mark.parametrize("form", ["additive", "exclusive"])
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_mixture_scores_match_numpy(form, beta):
    """The final scores are, for every item, log P(i) / β up to the row's constant, with
    P = p·P_rep + (1 − p)·P_exp (additive; P_exp the softmax of β·scores) or P = p·P_rep on the
    session's items and (1 − p)·P_exp renormalised over the others (exclusive)."""
    rng, scores, hist, view, support = case()
    x = rx.features(view, hist, support, beta=beta)
    model = random_mixture(rng, x, form)
    with torch.no_grad():
        bonus = model.bonus(x).numpy()
    prm = {k: v.numpy() for k, v in model.state_dict().items()}
    final = scores.double().numpy().copy()
    np.add.at(final, (np.arange(hist.n)[:, None].repeat(hist.mask.shape[1], 1)[hist.mask], hist.items[hist.mask]), bonus[hist.mask])
    for p, r in enumerate(reference_history(*_sessions_of(hist), 1.0)):
        cand, sess = reference_features(scores[p].numpy(), r["seen"], r["length"], support)
        g = (sess - prm["sess_mean"]) / prm["sess_std"]
        prob_repeat = 1 / (1 + np.exp(-(g @ prm["gate.weight"][0] + prm["gate.bias"][0])))
        keys = list(cand)
        u = np.array([((cand[i] - prm["cand_mean"]) / prm["cand_std"]) @ prm["rep.weight"][0] + prm["rep.bias"][0] for i in keys])
        p_rep = np.zeros(scores.shape[1])
        p_rep[keys] = np.exp(u - u.max()) / np.exp(u - u.max()).sum()
        s = scores[p].double().numpy()
        p_exp = np.exp(beta * s) / np.exp(beta * s).sum()
        constant = np.log(1 - prob_repeat) - np.log(np.exp(beta * s).sum())
        if form == "additive":
            mix = prob_repeat * p_rep + (1 - prob_repeat) * p_exp
        else:
            new = np.ones(scores.shape[1], dtype=bool)
            new[keys] = False
            mix = np.where(new, (1 - prob_repeat) * p_exp / p_exp[new].sum(), prob_repeat * p_rep)
            constant -= np.log(p_exp[new].sum())
        np.testing.assert_allclose(final[p], (np.log(mix) - constant) / beta, rtol=1e-5, atol=1e-5)


def _sessions_of(hist) -> tuple[np.ndarray, np.ndarray]:
    """Rebuild (items, offsets) of the case from its history (session s: the first prediction's
    candidate then every target)."""
    items, lengths = [], []
    for s in np.unique(hist.session):
        rows = np.flatnonzero(hist.session == s)
        items += [hist.items[rows[0], 0], *hist.target[rows]]
        lengths.append(len(rows) + 1)
    return np.array(items, dtype=np.int64), np.r_[0, np.cumsum(lengths)].astype(np.int64)


def brute_ranks(scores: np.ndarray, hist, bonus: np.ndarray) -> np.ndarray:
    final = scores.copy()
    for p in range(hist.n):
        for c in np.flatnonzero(hist.mask[p]):
            final[p, hist.items[p, c]] = np.float32(final[p, hist.items[p, c]] + np.float32(bonus[p, c]))
    t = final[np.arange(hist.n), hist.target]
    return (final >= t[:, None]).sum(1)


@pytest.mark.parametrize("k", [None, 9])
def test_ranks_match_brute_force(k):
    rng, scores, hist, view, support = case(1, n_items=40)
    if k is not None:  # a short top-K: exact up to K − C, beyond it K + 1
        view = rx.NetworkView.of(scores, torch.from_numpy(hist.items), torch.from_numpy(hist.mask), torch.from_numpy(hist.target), k)
    x = rx.features(view, hist, support)
    uniform = torch.from_numpy(rng.uniform(0, 2, size=hist.items.shape)) * torch.from_numpy(hist.mask)
    for bonus in (random_mixture(rng, x).bonus(x).detach(), uniform):
        got = rx.ranks_with_bonus(view, x.mask, x.target_slot, bonus).numpy()
        want = brute_ranks(scores.numpy(), hist, bonus.numpy())
        if k is None:
            np.testing.assert_array_equal(got, want)
        else:
            exact = want <= k - hist.items.shape[1]
            np.testing.assert_array_equal(got[exact], want[exact])
            assert np.all(got[~exact] > k - hist.items.shape[1])


def test_gate_closed_is_the_plain_model():
    """p ≡ 0: the bonus is exactly 0 and the ranks are the network's full-catalogue ranks."""
    rng, scores, hist, view, support = case(2, n_items=30)
    x = rx.features(view, hist, support)
    model = random_mixture(rng, x)
    with torch.no_grad():
        model.gate.weight.zero_()
        model.gate.bias.fill_(-torch.inf)
        bonus = model.bonus(x)
    assert torch.equal(bonus, torch.zeros_like(bonus))
    ranks = rx.ranks_with_bonus(view, x.mask, x.target_slot, bonus).numpy()
    np.testing.assert_array_equal(ranks, view.plain_rank.numpy())
    np.testing.assert_array_equal(ranks, (scores.numpy() >= scores.numpy()[np.arange(hist.n), hist.target][:, None]).sum(1))


def test_items_outside_the_session_rank_as_the_explore_part():
    """The mixture only lifts the session's own items: the items a session has not clicked keep
    the explore part's (the network's) order among themselves, and a prediction with no
    candidate (none of its history kept) is ranked by the explore part alone."""
    rng, scores, hist, view, support = case(4, n_items=30)
    x = rx.features(view, hist, support)
    model = random_mixture(rng, x)
    with torch.no_grad():
        model.gate.bias.fill_(5.0)  # mostly repeats: the candidates move a lot
        bonus = model.bonus(x).numpy()
    final = scores.numpy().astype(np.float64)
    for p in range(hist.n):
        cols = np.flatnonzero(hist.mask[p])
        final[p, hist.items[p, cols]] += bonus[p, cols]
        new = np.setdiff1d(np.arange(scores.shape[1]), hist.items[p, cols])
        assert np.array_equal(np.argsort(-final[p, new], kind="stable"), np.argsort(-scores.numpy()[p, new], kind="stable"))
        assert bonus[p, cols].min() > 0  # and the candidates did move
    empty = x.rows(np.arange(hist.n))
    empty.mask = torch.zeros_like(empty.mask)
    empty.target_slot = torch.full_like(empty.target_slot, -1)
    with torch.no_grad():
        assert torch.equal(model.bonus(empty), torch.zeros_like(empty.cand_logp))
