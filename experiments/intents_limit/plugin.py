"""How far can *any* learner get on the intents benchmark from its training sessions? A plug-in
Bayes rule (issue 51, point 3).

    python -m experiments.intents_limit.plugin --data .bench/intents20k
    python -m experiments.intents_limit.plugin --data .bench/intents20k --latent   # without the intents

The oracle of ``gru4rec synth --kind intents`` (:mod:`gru4rec.datasets.intent_model`) predicts
with the generator's own tables: the transition table T, the intents' item distributions phi_k,
popularity, the intent prior rho and the mixture (a, b, c). The *plug-in rule* here is the same
predictor (the intent posterior by the forward recursion, then ``a T[x_t] + b Σ_k P(k | x) phi_k
+ c pop``) with every table **estimated from the training sessions** by maximum likelihood (EM
over which of the three parts drew each click; add-α smoothing of each table, α chosen on
``train_valid``). It is given more than a network ever is: the model's exact form, K, and — by
default — the true intent of every training session (the generator draws them; they are
recovered by replaying its random stream, :func:`true_intents`). ``--latent`` drops that and
fits the intents by EM as well (a mixture of K intents, random start).

If this rule, knowing the form, is still well short of the oracle on the same data, the gap is
the finite sample (tables of 3,000 × 3,000 transitions and 50 × 3,000 intent probabilities
estimated from ~100,000 clicks), not a limit of GRU4Rec or its tuning; run on larger data sets
(``gru4rec synth DIR --kind intents --n-sessions 100000``) it shows how fast the gap closes.

Figures are counted as ``gru4rec evaluate -e conservative`` counts them and as the oracle is
(``IntentModel.oracle_metrics``): test events whose item is not among the training items are
dropped, every event but a session's first is predicted, items are ranked among the training
items, rank = number of items scoring >= the target. With the true tables the rule reproduces
the oracle's ranks (experiments/intents_limit/test_plugin.py). Prints JSON lines.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.data import ItemMap, read_events, sessions_from_events
from gru4rec.datasets import intents as gen
from gru4rec.datasets.intent_model import IntentModel, intent_posteriors

_BLOCK_BYTES = 32 << 20  # one block of B × N predictive probabilities
CUTOFFS = (1, 5, 10, 20)


@dataclass(frozen=True)
class Tables:
    """The parameters of an intent model over N items (the generator's internal indices) and K
    intents, with T dense (N × N, rows sum to 1): the true ones (:func:`true_tables`) or
    estimated ones (:func:`fit_tables`)."""

    pop: np.ndarray  # [N]
    phi: np.ndarray  # [K, N]
    rho: np.ndarray  # [K]
    T: np.ndarray  # [N, N]
    mix: tuple[float, float, float]


def true_tables(model: IntentModel) -> Tables:
    """The generator's own tables (T made dense)."""
    N = model.n_items
    T = np.zeros((N, N))
    rows = np.repeat(np.arange(N), np.diff(model.succ_indptr))
    T[rows, model.succ_indices] = model.succ_probs
    return Tables(model.pop.copy(), model.phi.copy(), model.rho.copy(), T, model.mix)


def true_intents(params: gen.IntentParams) -> tuple[IntentModel, np.ndarray, np.ndarray, np.ndarray]:
    """Replay :func:`gru4rec.datasets.intents.generate_intents`'s random stream to recover what
    it does not return: ``(model, intents, item ids of all events, session lengths)``, session
    id s (1-based, in draw order) being entry s - 1.

    generate_intents keeps the sessions' intents to itself; the replay makes the same draws in
    the same order (the private ``_model``, the lengths, then ``sample``), and :func:`load`
    checks the events against the data set, so a change of the generator fails loudly instead
    of pairing sessions with wrong intents."""
    rng = np.random.default_rng(params.seed)
    model = gen._model(rng, int(params.n_items), int(params.n_intents), int(params.intent_size), float(params.intent_concentration),
                       int(params.n_successors), params.mix, float(params.zipf_exponent), float(params.prior_concentration))
    extra = rng.geometric(1.0 / (params.mean_length - 1.0), size=params.n_sessions) - 1
    lengths = np.minimum(2 + extra, params.max_length).astype(np.int64)
    items, intent = model.sample(lengths, rng)
    return model, np.asarray(intent, dtype=np.int64), model.item_ids[items], lengths


def load(data: Path) -> tuple[IntentModel, np.ndarray, dict[str, pd.DataFrame], dict[str, Any]]:
    """``(model, intent of session id s at [s - 1], the four event files, oracle.json)`` of a
    data set made by ``gru4rec synth DIR --kind intents``; ValueError naming the file if the
    replayed generator does not reproduce its ``train_full``."""
    oracle = json.loads((data / gen.ORACLE_FILE).read_text(encoding="utf-8"))
    given: dict[str, Any] = {k: (tuple(v) if k == "mix" else v) for k, v in oracle["params"].items() if k != "test_days"}
    params = gen.IntentParams(**given)
    model, intent, ids, lengths = true_intents(params)
    frames = {name: read_events(data / f"{name}.tsv") for name in ("train_full", "test", "train_tr", "train_valid")}
    full = frames["train_full"].sort_values(["SessionId", "Time"], kind="stable")
    sid = full["SessionId"].to_numpy()
    first = np.searchsorted(sid, sid, side="left")  # row of the session's first event
    pos = np.r_[0, np.cumsum(lengths)][sid - 1] + np.arange(len(sid)) - first
    if not np.array_equal(ids[pos], full["ItemId"].to_numpy()):
        raise ValueError(f"{data / 'train_full.tsv'}: the replayed generator does not reproduce these events "
                         "(gru4rec.datasets.intents changed?); the session intents would be wrong")
    return model, intent, frames, oracle


@dataclass(frozen=True)
class Split:
    """One event file as the evaluator sees it: generator item indices of its sessions (items
    not in the training item map dropped), session offsets, each session's true intent, and
    ``cols``: the generator indices of the training items in item-map order (the ranked items)."""

    items: np.ndarray
    offsets: np.ndarray
    intents: np.ndarray
    cols: np.ndarray


def split_of(df: pd.DataFrame, train: pd.DataFrame, model: IntentModel, intent: np.ndarray) -> Split:
    """Sessions of ``df`` over the items of ``train`` (the others dropped, as gru4rec evaluate
    drops them), in the evaluator's order."""
    item_map = ItemMap.from_ids(train["ItemId"].to_numpy())
    sessions, _ = sessions_from_events(df, item_map, drop_unknown=True)
    cols = model.index_of(item_map.ids)
    sid = np.asarray(sessions.session_ids, dtype=np.int64)
    return Split(cols[sessions.items], np.asarray(sessions.offsets, dtype=np.int64), intent[sid - 1], cols)


# ---------------------------------------------------------------------- the plug-in rule


def posteriors(t: Tables, items: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``P(k | x_1..x_t)`` after every event (E × K): the oracle's forward recursion
    (:func:`~gru4rec.datasets.intent_model.intent_posteriors`) with tables ``t``."""
    return intent_posteriors(t.rho, t.phi, t.pop, t.mix, lambda prev, nxt: t.T[prev, nxt], items, offsets)


def ranks(t: Tables, split: Split) -> np.ndarray:
    """Conservative rank of every target of ``split`` among its ranked items (``split.cols``)
    under the rule with tables ``t``: ``P(j | x) = a T[x_t, j] + b Σ_k P(k | x) phi_k(j) + c pop(j)``."""
    items, offsets, cols = split.items, split.offsets, split.cols
    lengths = np.diff(offsets)
    is_input = np.ones(len(items), dtype=bool)
    is_input[offsets[1:][lengths > 0] - 1] = False
    inputs = np.flatnonzero(is_input)
    post = posteriors(t, items, offsets)[inputs]
    col_of = np.full(len(t.pop), -1, dtype=np.int64)
    col_of[cols] = np.arange(len(cols))
    targets = col_of[items[inputs + 1]]
    a, b, c = t.mix
    phi_c, pop_c = t.phi[:, cols], t.pop[cols]
    out = np.empty(len(inputs))
    block = max(1, _BLOCK_BYTES // (8 * len(cols)))
    for i in range(0, len(inputs), block):
        j = min(i + block, len(inputs))
        probs = b * (post[i:j] @ phi_c) + c * pop_c + a * t.T[np.ix_(items[inputs[i:j]], cols)]
        target_p = probs[np.arange(j - i), targets[i:j]]
        out[i:j] = np.count_nonzero(probs >= target_p[:, None], axis=1)
    return out


def metrics(r: np.ndarray, cutoffs: Sequence[int] = CUTOFFS) -> dict[str, float]:
    """Recall@c and MRR@c of conservative ranks."""
    out = {f"recall@{c}": float(np.mean(r <= c)) for c in cutoffs}
    out.update({f"mrr@{c}": float(np.mean(np.where(r <= c, 1.0 / r, 0.0))) for c in cutoffs})
    return out


# ---------------------------------------------------------------------- estimating the tables


def fit_tables(split: Split, n_items: int, n_intents: int, eps: tuple[float, float, float], *, latent: bool = False,
               mix: tuple[float, float, float] | None = None, n_successors: int = 0, n_iter: int = 40,
               seed: int = 0) -> tuple[Tables, list[float]]:
    """MAP estimates of the tables from the sessions of ``split`` by EM, and the objective (log
    likelihood + log prior) after every iteration (EM never lowers it).

    The hidden part is which of T, phi_k and pop drew each click (and, with ``latent``, each
    session's intent; otherwise ``split.intents`` are used). ``eps = (eps_T, eps_phi, eps_pop)``
    are pseudo-counts added to every cell of T, phi and pop (a symmetric Dirichlet prior of
    1 + eps), so unseen items and transitions keep a small probability. The first click's
    mixture (b phi + c pop) / (b + c) is part of the mix's exact M-step.

    ``mix`` given: the mixture weights are held at it instead of estimated (the generator's
    own: free weights let a dense T explain nearly every training bigram, a → 0.9).
    ``n_successors`` > 0: T keeps the largest that many expected counts of each row (the
    generator's form: each item has that many successors; eps_T still goes to every cell).
    Without either, each iteration provably does not lower the objective."""
    N, K = n_items, n_intents
    items, offsets = split.items, split.offsets
    lengths = np.diff(offsets)
    n_sess = len(lengths)
    sess = np.repeat(np.arange(n_sess), lengths)
    is_first = np.zeros(len(items), dtype=bool)
    is_first[offsets[:-1][lengths > 0]] = True
    tr = np.flatnonzero(~is_first)  # transitions: event tr has predecessor tr - 1
    prev, nxt, f = items[tr - 1], items[tr], items[is_first]
    s_tr, s_f = sess[tr], sess[is_first]
    eps_t, eps_phi, eps_pop = eps
    rng = np.random.default_rng(seed)
    # Start: every part equally likely for every click; intents given or drawn at random.
    if latent:
        w = rng.dirichlet(np.ones(K), size=n_sess)
    else:
        w = np.zeros((n_sess, K))
        w[np.arange(n_sess), split.intents] = 1.0
    r_t = np.full(len(tr), 1 / 3)
    r_phi_tr = w[s_tr] / 3  # [n_tr, K]
    r_pop_tr = np.full(len(tr), 1 / 3)
    r_phi_f, r_pop_f = w[s_f] / 2, np.full(len(f), 0.5)
    history: list[float] = []
    t: Tables | None = None
    for _ in range(n_iter):
        # M-step.
        T = np.asarray(np.bincount(prev * N + nxt, weights=r_t, minlength=N * N), dtype=np.float64).reshape(N, N)
        if 0 < n_successors < N:
            np.put_along_axis(T, np.argpartition(T, N - n_successors - 1, axis=1)[:, :N - n_successors], 0.0, axis=1)
        T += eps_t
        T /= T.sum(axis=1, keepdims=True)
        phi = np.full((K, N), eps_phi)
        for k in range(K):
            phi[k] += np.bincount(nxt, weights=r_phi_tr[:, k], minlength=N) + np.bincount(f, weights=r_phi_f[:, k], minlength=N)
        phi /= phi.sum(axis=1, keepdims=True)
        pop = np.bincount(nxt, weights=r_pop_tr, minlength=N) + np.bincount(f, weights=r_pop_f, minlength=N) + eps_pop
        pop /= pop.sum()
        rho = w.sum(axis=0) + 1e-9
        rho /= rho.sum()
        n_a, n_b, n_c = r_t.sum(), r_phi_tr.sum(), r_pop_tr.sum()
        m_b, m_c = r_phi_f.sum(), r_pop_f.sum()
        a = n_a / (n_a + n_b + n_c)
        beta = (n_b + m_b) / (n_b + n_c + m_b + m_c)
        fitted = (float(a), float((1 - a) * beta), float((1 - a) * (1 - beta)))
        t = Tables(pop, phi, rho, T, fitted if mix is None else mix)
        # E-step (and the objective of these tables).
        a, b, c = t.mix
        z_t = a * T[prev, nxt]
        z_phi = b * phi[:, nxt].T  # [n_tr, K]
        z_pop = c * pop[nxt]
        z = z_t[:, None] + z_phi + z_pop[:, None]
        f_phi = b * phi[:, f].T / (b + c)
        f_pop = c * pop[f] / (b + c)
        fz = f_phi + f_pop[:, None]
        # log P(session, k) for every session and intent.
        log_l = np.log(rho) + np.zeros((n_sess, K))
        log_l[s_f] += np.log(fz)  # one first click per session
        log_l += _segment_sum(np.log(z), s_tr, n_sess)
        prior = (eps_t * np.log(T).sum() + eps_phi * np.log(phi).sum() + eps_pop * np.log(pop).sum())
        if latent:
            mx = log_l.max(axis=1, keepdims=True)
            ll = float((mx[:, 0] + np.log(np.exp(log_l - mx).sum(axis=1))).sum())
            w = np.exp(log_l - mx)
            w /= w.sum(axis=1, keepdims=True)
        else:
            ll = float(log_l[np.arange(n_sess), split.intents].sum())
        history.append(ll + float(prior))
        wt, wf = w[s_tr], w[s_f]
        r_t = (wt * (z_t[:, None] / z)).sum(axis=1)
        r_phi_tr = wt * z_phi / z
        r_pop_tr = (wt * (z_pop[:, None] / z)).sum(axis=1)
        r_phi_f = wf * f_phi / fz
        r_pop_f = (wf * (f_pop[:, None] / fz)).sum(axis=1)
    assert t is not None
    return t, history


def _segment_sum(x: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    """Sum the rows of ``x`` by segment id ``seg`` (non-decreasing) into ``n`` rows."""
    out = np.zeros((n, x.shape[1]))
    if len(seg):
        starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        out[seg[starts]] = np.add.reduceat(x, starts, axis=0)
    return out


# ---------------------------------------------------------------------- the measurement


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Choose the smoothing on train_tr → train_valid, then fit on train_full and rank test (and
    train_full itself), beside the oracle on the same predictions; JSON lines on stdout."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a folder written by gru4rec synth DIR --kind intents")
    ap.add_argument("--latent", action="store_true", help="fit the intents by EM too (the true ones are not used)")
    ap.add_argument("--eps-t", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2], help="pseudo-counts of T's cells to try")
    ap.add_argument("--eps-phi", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1], help="pseudo-counts of phi's cells to try")
    ap.add_argument("--eps-pop", type=float, default=0.5, help="pseudo-count of every item's popularity")
    ap.add_argument("--n-iter", type=int, default=40, help="EM iterations")
    ap.add_argument("--fit-mix", action="store_true", help="estimate the mixture weights (default: the generator's)")
    ap.add_argument("--n-successors", type=int, default=-1,
                    help="successors kept per row of T (default -1: the generator's; 0: a dense T)")
    ap.add_argument("--train-ranks", action="store_true", help="also rank train_full's own sessions (train vs test)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    model, intent, frames, oracle = load(args.data)
    N, K = model.n_items, model.n_intents
    n_succ = int(oracle["params"]["n_successors"]) if args.n_successors < 0 else args.n_successors
    form: dict[str, Any] = {"mix": None if args.fit_mix else model.mix, "n_successors": n_succ,
                            "latent": args.latent, "n_iter": args.n_iter}
    _emit({"form": {**form, "mix": "fitted" if args.fit_mix else model.mix}})
    truth = true_tables(model)
    valid = split_of(frames["train_valid"], frames["train_tr"], model, intent)
    test = split_of(frames["test"], frames["train_full"], model, intent)
    for name, split in (("train_valid", valid), ("test", test)):
        m = metrics(ranks(truth, split))
        _emit({"rule": "oracle (true tables)", "split": name, **m, "oracle.json": {k: oracle[name][k] for k in ("recall@20", "mrr@20")}})
    fit_tr = split_of(frames["train_tr"], frames["train_tr"], model, intent)
    best: tuple[float, tuple[float, float, float]] | None = None
    for eps_t in args.eps_t:
        for eps_phi in args.eps_phi:
            eps = (eps_t, eps_phi, args.eps_pop)
            t, hist = fit_tables(fit_tr, N, K, eps, **form)
            m = metrics(ranks(t, valid))
            _emit({"rule": "plug-in", "fit": "train_tr", "split": "train_valid", "eps": eps, "mix": t.mix, **m,
                   "of_oracle": {k: m[k] / oracle["train_valid"][k] for k in ("recall@20", "mrr@20")}, "objective": hist[-1]})
            if best is None or m["mrr@20"] > best[0]:
                best = (m["mrr@20"], eps)
    assert best is not None
    fit_full = split_of(frames["train_full"], frames["train_full"], model, intent)
    t, _ = fit_tables(fit_full, N, K, best[1], **form)
    m = metrics(ranks(t, test))
    _emit({"rule": "plug-in", "fit": "train_full", "split": "test", "eps": best[1], "latent": args.latent, "mix": t.mix, **m,
           "of_oracle": {k: m[k] / oracle["test"][k] for k in ("recall@20", "mrr@20")}})
    if args.train_ranks:
        mo = metrics(ranks(truth, fit_full))
        mp = metrics(ranks(t, fit_full))
        _emit({"rule": "oracle (true tables)", "split": "train_full", **mo})
        _emit({"rule": "plug-in", "fit": "train_full", "split": "train_full", **mp,
               "of_oracle": {k: mp[k] / mo[k] for k in ("recall@20", "mrr@20")}})
    _emit({"seconds": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
