"""A synthetic benchmark with a known optimum: sessions driven by hidden intents.

The data of :mod:`gru4rec.datasets.synthetic` have a realistic shape, but nobody knows the best
possible score on them. Here the generating process is simple enough that the Bayes-optimal
next-item predictor (the *oracle*) is computed exactly, so a trained model can be reported as a
fraction of the optimum.

The generative model, over N items (internal indices 0..N-1) and K intents:

* ``pop``: global popularity, ``pop(j) ∝ 1 / (j + 1)^zipf_exponent`` (strictly decreasing, so
  no two items tie).
* ``phi_k``: the item distribution of intent k; a Dirichlet(``intent_concentration``) draw over
  ``intent_size`` items chosen uniformly at random (zero elsewhere).
* ``rho``: the prior over intents, a Dirichlet(``prior_concentration``) draw.
* ``T``: a sparse first-order transition table; item i has ``n_successors`` distinct successors
  (uniform over the other items) with Dirichlet(1) probabilities. Stored as CSR arrays, never as
  an N × N matrix.
* A session draws its intent ``k ~ rho`` and keeps it. With ``mix = (a, b, c)``, a + b + c = 1:

  - the first item from ``P(x_1 | k) = (b phi_k + c pop) / (b + c)`` (it has no predecessor,
    so the transition term is left out and the rest renormalised);
  - every next item from ``P(j | prev=i, k) = a T[i, j] + b phi_k(j) + c pop(j)``.

  ``c > 0`` is required: every item then has a positive probability after any item, so every
  sequence (also one with items filtered out) has a positive likelihood.
* Session lengths are 2 + a geometric number (mean ``mean_length``, at most ``max_length``),
  independent of the intent. Sessions start at sorted random integer times over ``n_days`` days;
  events inside a session are 1 + Exp(60 s) seconds apart (strictly increasing).

With the defaults, memory of the whole session matters: one click leaves several intents
plausible (mean posterior of the true intent 0.51 after one click, 0.76 after two, 0.95 after
four), and the last click alone explains only part of the next one. Measured on the default
test split (3,469 predictions), Recall@20 / MRR@20: the oracle 0.541 / 0.188; the same Bayes
rule with the intent inferred from the last click only 0.419 / 0.172; the last click's successors
then popularity 0.270 / 0.153; popularity 0.082 / 0.035.

The oracle. Given the clicks x_1..x_t, the intent posterior follows the forward recursion
``P(k | x_1..x_t) ∝ rho_k P(x_1 | k) Π_s (a T[x_s, x_{s+1}] + b phi_k(x_{s+1}) + c pop(x_{s+1}))``
(computed in log space, renormalised at every step), and the next item's exact distribution is
``P(j | x_1..x_t) = Σ_k P(k | x_1..x_t) (a T[x_t, j] + b phi_k(j) + c pop(j))``. Ranking items by
it maximises the expected Recall@c and MRR@c. :meth:`IntentModel.oracle_metrics` measures it the
way :func:`gru4rec.evaluate` measures a model (docs/behaviour.md §8): test events whose item is
not in the training item map are removed before sessions are formed (the oracle conditions on
the filtered sequence, as the model does), every event of a session but its first is a
prediction, items are ranked among the training items only, with conservative ties
(rank = number of items scoring ≥ the target). Where clicks were removed, the oracle treats the
remaining ones as consecutive, as the model does; it is then the optimum only up to that
approximation (with the defaults, 2 of the 4,156 test clicks are items unseen in training).

Session ids are 1..n_sessions in order of start time; item ids are distinct random 9-digit
integers, so code that confuses ids with indices fails visibly. ``phi`` is held as a dense
K × N float64 matrix (K·N·8 bytes).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gru4rec.data.events import ItemMap, read_events, sessions_from_events, validate_events, write_events
from gru4rec.datasets.synthetic import SPLIT_FILES, time_split
from gru4rec.errors import ConfigError, DataError
from gru4rec.files import atomic_write

__all__ = ["IntentModel", "generate_intents", "write_intents", "ORACLE_FILE", "DEFAULT_CUTOFFS"]

ORACLE_FILE = "oracle.json"
DEFAULT_CUTOFFS: tuple[int, ...] = (1, 5, 10, 20)
_SECONDS_PER_DAY = 86_400
_BLOCK_BYTES = 32 << 20  # size of one block of B × N predictive probabilities


def _check(cond: bool, name: str, value: object, rule: str) -> None:
    if not cond:
        raise ConfigError(f"intents data: {name}={value!r} is invalid; {rule}")


def _cutoffs(cutoffs: int | Sequence[int]) -> list[int]:
    """The sorted distinct cutoffs (one int or a list of them); ConfigError otherwise."""
    values = [cutoffs] if _is_int(cutoffs) else list(cutoffs) if isinstance(cutoffs, (list, tuple)) else []
    _check(len(values) > 0 and all(_is_int(c) and c >= 1 for c in values), "cutoffs", cutoffs, "need positive integers")
    return sorted({int(c) for c in values})


def _show(x: Any) -> str:
    return repr(x.item() if isinstance(x, np.generic) else x)


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, eq=False, repr=False)
class IntentModel:
    """The parameters of the generative model (see the module docstring) and its oracle.

    Item index j (the columns of ``phi``, of ``next_item_probs``, ...) is the item with
    external id ``item_ids[j]``; the public methods take and return external ids. Made by
    :func:`generate_intents`; one built by hand is checked for consistent shapes, a positive
    ``pop``, ``c > 0`` and non-empty rows of T with increasing successors (ConfigError).
    """

    item_ids: np.ndarray  # int64 [N] external id of item index j
    pop: np.ndarray  # float64 [N] global popularity, sums to 1, strictly decreasing
    phi: np.ndarray  # float64 [K, N] item distribution of each intent
    rho: np.ndarray  # float64 [K] prior over intents
    succ_indptr: np.ndarray  # int64 [N + 1] CSR rows of T
    succ_indices: np.ndarray  # int64 [nnz] successors, sorted within each row
    succ_probs: np.ndarray  # float64 [nnz] T[i, succ], each row sums to 1
    mix: tuple[float, float, float]  # (a, b, c): weights of T, phi_k and pop
    _index: pd.Index = field(init=False, repr=False, compare=False)
    _keys: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n, k = len(self.item_ids), len(self.rho)
        shapes = (self.pop.shape == (n,) and self.phi.shape == (k, n) and self.succ_indptr.shape == (n + 1,)
                  and self.succ_indices.shape == self.succ_probs.shape == (int(self.succ_indptr[-1]),))
        _check(shapes and len(self.mix) == 3 and self.mix[2] > 0 and bool(np.all(self.pop > 0)), "model", self,
               "need pop [N] > 0, phi [K, N], rho [K], CSR arrays of T of matching sizes and mix (a, b, c) with c > 0")
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.succ_indptr))
        # Sorted (row, column) keys of T's non-zeros: vectorised look-up of any T[i, j].
        keys = rows * n + self.succ_indices
        _check(bool(np.all(np.diff(self.succ_indptr) > 0) and np.all(np.diff(keys) > 0)), "model", self,
               "every item needs successors, in increasing order")
        object.__setattr__(self, "_index", pd.Index(self.item_ids))
        object.__setattr__(self, "_keys", keys)

    def __repr__(self) -> str:
        return f"IntentModel(n_items={self.n_items}, n_intents={self.n_intents}, mix={self.mix})"

    @property
    def n_items(self) -> int:
        """N, the number of items."""
        return len(self.item_ids)

    @property
    def n_intents(self) -> int:
        """K, the number of intents."""
        return len(self.rho)

    def index_of(self, item_ids: Any) -> np.ndarray:
        """Internal indices (int64) of external item ids; -1 for ids that are not items here."""
        return np.asarray(self._index.get_indexer(np.atleast_1d(np.asarray(item_ids))), dtype=np.int64)

    def transition(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``T[prev, nxt]`` elementwise for arrays of internal indices (0 off the table)."""
        q = np.asarray(prev, dtype=np.int64) * self.n_items + np.asarray(nxt, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._keys, q), len(self._keys) - 1)
        return np.where(self._keys[pos] == q, self.succ_probs[pos], 0.0)

    def first_item_probs(self) -> np.ndarray:
        """``P(x_1 = j | k)`` as a K × N matrix."""
        _, b, c = self.mix
        return (b * self.phi + c * self.pop) / (b + c)

    # ------------------------------------------------------------------ sampling

    def sample(self, lengths: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw sessions of the given lengths: returns (internal item indices of all events,
        session after session; the intent of each session). Vectorised over sessions."""
        lengths = np.asarray(lengths, dtype=np.int64)
        n, K, N = len(lengths), self.n_intents, self.n_items
        a, b, c = self.mix
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        items = np.empty(int(offsets[-1]), dtype=np.int64)
        # Inverse-CDF samplers. Row k of phi's CDF is normalised to end at exactly 1 and shifted
        # by k, so a draw k + u never lands in another row's part; one that rounding pushes past
        # a row's end is clamped to the row's last item of positive probability.
        pop_cum = np.cumsum(self.pop)
        phi_cum = np.cumsum(self.phi, axis=1)
        phi_cum = (phi_cum / phi_cum[:, -1:] + np.arange(K)[:, None]).ravel()
        phi_last = N - 1 - np.argmax(self.phi[:, ::-1] > 0, axis=1)
        succ_cum = np.cumsum(self.succ_probs)
        succ_base = np.r_[0.0, succ_cum][self.succ_indptr[:-1]]

        def from_pop(m: int) -> np.ndarray:
            return np.minimum(np.searchsorted(pop_cum, rng.random(m) * pop_cum[-1], side="right"), N - 1)

        def from_phi(k: np.ndarray) -> np.ndarray:
            pos = np.searchsorted(phi_cum, k + rng.random(len(k)), side="right")
            return np.minimum(pos - k * N, phi_last[k])

        def from_succ(i: np.ndarray) -> np.ndarray:
            pos = np.searchsorted(succ_cum, succ_base[i] + rng.random(len(i)), side="right")
            return self.succ_indices[np.minimum(pos, self.succ_indptr[i + 1] - 1)]

        intent = rng.choice(K, size=n, p=self.rho)
        active = np.flatnonzero(lengths > 0)
        use_phi = rng.random(len(active)) < b / (b + c)
        cur = from_pop(len(active))
        cur[use_phi] = from_phi(intent[active[use_phi]])
        items[offsets[active]] = cur
        for t in range(1, int(lengths.max(initial=0))):
            keep = lengths[active] > t
            active, cur = active[keep], cur[keep]
            u = rng.random(len(active))
            is_t, is_phi = u < a, (u >= a) & (u < a + b)
            is_pop = ~(is_t | is_phi)
            nxt = np.empty(len(active), dtype=np.int64)
            nxt[is_t] = from_succ(cur[is_t])
            nxt[is_phi] = from_phi(intent[active[is_phi]])
            nxt[is_pop] = from_pop(int(is_pop.sum()))
            items[offsets[active] + t] = nxt
            cur = nxt
        return items, intent

    # ------------------------------------------------------------------ the oracle

    def prefix_posteriors(self, items: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """``P(k | x_1..x_t)`` after every event of flat sessions of internal indices
        (``items[offsets[s]:offsets[s + 1]]`` is session s): an E × K matrix, row e the
        posterior given the session's events up to and including event e."""
        items = np.asarray(items, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        a, b, c = self.mix
        out = np.empty((len(items), self.n_intents))
        active = np.flatnonzero(lengths > 0)
        cur = np.log(self.rho) + np.log(self.first_item_probs()[:, items[offsets[active]]].T)
        cur -= cur.max(axis=1, keepdims=True)
        out[offsets[active]] = cur
        for t in range(1, int(lengths.max(initial=0))):
            keep = lengths[active] > t
            active, cur = active[keep], cur[keep]
            pos = offsets[active] + t
            x = items[pos]
            like = a * self.transition(items[pos - 1], x)[:, None] + b * self.phi[:, x].T + c * self.pop[x][:, None]
            cur = cur + np.log(like)
            cur -= cur.max(axis=1, keepdims=True)  # renormalise in log space: no underflow
            out[pos] = cur
        np.exp(out, out=out)
        out /= out.sum(axis=1, keepdims=True)
        return out

    def _predictive(self, post: np.ndarray, prev: np.ndarray, phi_cols: np.ndarray, pop_cols: np.ndarray, col_of: np.ndarray) -> np.ndarray:
        """Next-item probabilities (B × len(cols)) from posteriors and last items; ``phi_cols``
        and ``pop_cols`` are phi / pop restricted to the columns, ``col_of[j]`` the column of
        item j (-1 if not a column)."""
        a, b, c = self.mix
        probs = b * (post @ phi_cols)
        probs += c * pop_cols
        start, count = self.succ_indptr[prev], np.diff(self.succ_indptr)[prev]
        rows = np.repeat(np.arange(len(prev)), count)
        nnz = np.repeat(start - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        cols = col_of[self.succ_indices[nnz]]
        ok = cols >= 0
        probs[rows[ok], cols[ok]] += a * self.succ_probs[nnz[ok]]  # successors are distinct per row
        return probs

    def _histories(self, histories: Sequence[Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
        seqs = [np.asarray(h).ravel() for h in histories]
        if any(len(s) == 0 for s in seqs):
            raise DataError("histories: every history needs at least one item")
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        ids = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        items = self.index_of(ids)
        if np.any(items < 0):
            raise DataError(f"histories: item id {_show(ids[np.argmax(items < 0)])} is not an item of this model")
        return items, offsets

    def posterior(self, histories: Sequence[Sequence[Any]]) -> np.ndarray:
        """``P(k | history)`` for each history (a sequence of external item ids): B × K."""
        items, offsets = self._histories(histories)
        return self.prefix_posteriors(items, offsets)[offsets[1:] - 1]

    def next_item_probs(self, histories: Sequence[Sequence[Any]]) -> np.ndarray:
        """The exact next-item distribution after each history: B × N, column j = ``item_ids[j]``."""
        items, offsets = self._histories(histories)
        post = self.prefix_posteriors(items, offsets)[offsets[1:] - 1]
        return self._predictive(post, items[offsets[1:] - 1], self.phi, self.pop, np.arange(self.n_items))

    def oracle_metrics(
        self,
        test: pd.DataFrame | str | os.PathLike[str],
        train_item_ids: Any,
        cutoffs: int | Sequence[int] = DEFAULT_CUTOFFS,
        *,
        return_ranks: bool = False,
    ) -> dict[str, Any]:
        """Recall@c and MRR@c of the oracle on ``test`` (a DataFrame or an event file with
        SessionId, ItemId, Time), ranking among ``train_item_ids`` (the items of the training
        data a model would be fitted on), as :func:`gru4rec.evaluate` with ``mode='conservative'``.

        Returns ``{'recall': {c: ...}, 'mrr': {c: ...}, 'n_predictions', 'n_sessions',
        'n_dropped_events', 'n_items'}``, plus ``'ranks'`` (float64, in the evaluator's order of
        sessions and events) with ``return_ranks``. DataError for unknown training items or a
        test set without a prediction; ConfigError for bad cutoffs.
        """
        cut = _cutoffs(cutoffs)
        df = read_events(test) if isinstance(test, (str, os.PathLike)) else validate_events(test, source="test data")
        item_map = ItemMap.from_ids(np.asarray(train_item_ids))
        gen = self.index_of(item_map.ids)
        if np.any(gen < 0):
            raise DataError(f"train_item_ids: item id {_show(item_map.ids[np.argmax(gen < 0)])} is not an item of this model")
        sessions, n_dropped = sessions_from_events(df, item_map, drop_unknown=True)
        items, offsets = gen[sessions.items], sessions.offsets
        lengths = np.diff(offsets)
        is_input = np.ones(len(items), dtype=bool)
        is_input[offsets[1:][lengths > 0] - 1] = False  # a session's last event predicts nothing
        inputs = np.flatnonzero(is_input)
        if len(inputs) == 0:
            raise DataError("test data: no session has two or more events with items known to the model — nothing to evaluate")
        post = self.prefix_posteriors(items, offsets)[inputs]
        targets = sessions.items[inputs + 1]  # column = index in the training item map
        col_of = np.full(self.n_items, -1, dtype=np.int64)
        col_of[gen] = np.arange(len(gen))
        phi_cols, pop_cols = self.phi[:, gen], self.pop[gen]
        ranks = np.empty(len(inputs))
        block = max(1, _BLOCK_BYTES // (8 * len(gen)))
        for i in range(0, len(inputs), block):
            j = min(i + block, len(inputs))
            probs = self._predictive(post[i:j], items[inputs[i:j]], phi_cols, pop_cols, col_of)
            target_p = probs[np.arange(j - i), targets[i:j]]
            ranks[i:j] = np.count_nonzero(probs >= target_p[:, None], axis=1)
        result: dict[str, Any] = {
            "recall": {c: float(np.mean(ranks <= c)) for c in cut},
            "mrr": {c: float(np.mean(np.where(ranks <= c, 1.0 / ranks, 0.0))) for c in cut},
            "n_predictions": len(inputs),
            "n_sessions": int(np.count_nonzero(lengths >= 2)),
            "n_dropped_events": int(n_dropped),
            "n_items": len(gen),
        }
        if return_ranks:
            result["ranks"] = ranks
        return result


# ---------------------------------------------------------------------- generating


def _check_params(
    *, n_sessions: Any, n_items: Any, n_intents: Any, intent_size: Any, intent_concentration: Any,
    n_successors: Any, mix: Any, zipf_exponent: Any, prior_concentration: Any, mean_length: Any,
    max_length: Any, n_days: Any, start_time: Any, seed: Any,
) -> tuple[float, float, float]:
    """Raise ConfigError naming the first bad parameter; return ``mix`` as three floats."""
    _check(_is_int(n_sessions) and n_sessions >= 1, "n_sessions", n_sessions, "need an int >= 1")
    _check(_is_int(n_items) and 2 <= n_items <= 900_000_000, "n_items", n_items, "need an int in [2, 900000000]")
    _check(_is_int(n_intents) and n_intents >= 1, "n_intents", n_intents, "need an int >= 1")
    _check(_is_int(intent_size) and 1 <= intent_size <= n_items, "intent_size", intent_size, f"need an int in [1, n_items={n_items}]")
    _check(_is_real(intent_concentration) and intent_concentration > 0, "intent_concentration", intent_concentration, "need a number > 0")
    _check(_is_int(n_successors) and 1 <= n_successors < n_items, "n_successors", n_successors, f"need an int in [1, n_items - 1={n_items - 1}]")
    ok = isinstance(mix, (tuple, list)) and len(mix) == 3 and all(_is_real(w) and w >= 0 for w in mix)
    _check(ok and abs(sum(mix) - 1.0) < 1e-9 and mix[2] > 0, "mix", mix,
           "need three weights (a, b, c) >= 0 of T, phi_k and pop summing to 1, with c > 0")
    _check(_is_real(zipf_exponent) and zipf_exponent > 0, "zipf_exponent", zipf_exponent, "need a number > 0 (popularity strictly decreasing)")
    _check(_is_real(prior_concentration) and prior_concentration > 0, "prior_concentration", prior_concentration, "need a number > 0")
    _check(_is_real(mean_length) and mean_length >= 2, "mean_length", mean_length, "need a number >= 2 (sessions have at least 2 events)")
    _check(_is_int(max_length) and max_length >= 2, "max_length", max_length, "need an int >= 2")
    _check(_is_real(n_days) and n_days > 0, "n_days", n_days, "need a number > 0")
    _check(_is_int(start_time) and start_time >= 0, "start_time", start_time, "need an int >= 0 (unix seconds)")
    _check(_is_int(seed) and seed >= 0, "seed", seed, "need an int >= 0")
    a, b, c = (float(w) / float(sum(mix)) for w in mix)  # exactly normalised
    return a, b, c


def _dirichlet_rows(rng: np.random.Generator, alpha: float, shape: tuple[int, int], name: str) -> np.ndarray:
    """Rows of independent Dirichlet(alpha) draws (normalised gammas); ConfigError when alpha is
    so small that a row underflows to all zeros."""
    g = rng.standard_gamma(alpha, size=shape)
    total = g.sum(axis=1, keepdims=True)
    _check(bool(np.all(total > 0)), name, alpha, "too small: a Dirichlet draw underflowed to zero")
    return g / total


def _model(rng: np.random.Generator, n_items: int, n_intents: int, intent_size: int, intent_concentration: float,
           n_successors: int, mix: tuple[float, float, float], zipf_exponent: float, prior_concentration: float) -> IntentModel:
    N, K, m = n_items, n_intents, n_successors
    item_ids = rng.choice(900_000_000, size=N, replace=False).astype(np.int64) + 100_000_000
    pop = 1.0 / np.arange(1, N + 1, dtype=np.float64) ** zipf_exponent
    pop /= pop.sum()
    rho = _dirichlet_rows(rng, prior_concentration, (1, K), "prior_concentration")[0]
    # Intent supports: the intent_size items with the smallest of N uniform keys (a uniform subset).
    support = np.argpartition(rng.random((K, N)), intent_size - 1, axis=1)[:, :intent_size]
    phi = np.zeros((K, N))
    np.put_along_axis(phi, support, _dirichlet_rows(rng, intent_concentration, (K, intent_size), "intent_concentration"), axis=1)
    # Successors: m distinct items other than i, uniformly; duplicates are redrawn until none is left.
    own = np.arange(N)[:, None]
    succ = rng.integers(0, N - 1, size=(N, m))
    succ += succ >= own
    while True:
        succ.sort(axis=1)
        dup = np.zeros_like(succ, dtype=bool)
        dup[:, 1:] = succ[:, 1:] == succ[:, :-1]
        if not dup.any():
            break
        redraw = rng.integers(0, N - 1, size=int(dup.sum()))
        succ[dup] = redraw + (redraw >= np.broadcast_to(own, succ.shape)[dup])
    probs = _dirichlet_rows(rng, 1.0, (N, m), "n_successors")
    indptr = np.arange(0, N * m + 1, m, dtype=np.int64)
    return IntentModel(item_ids, pop, phi, rho, indptr, succ.ravel().astype(np.int64), probs.ravel(), mix)


def generate_intents(
    n_sessions: int = 20_000,
    n_items: int = 3_000,
    n_intents: int = 50,
    *,
    intent_size: int = 150,
    intent_concentration: float = 0.3,
    n_successors: int = 4,
    mix: tuple[float, float, float] = (0.2, 0.65, 0.15),
    zipf_exponent: float = 1.0,
    prior_concentration: float = 10.0,
    mean_length: float = 6.0,
    max_length: int = 50,
    n_days: float = 30.0,
    start_time: int = 1_600_000_000,
    seed: int = 42,
) -> tuple[pd.DataFrame, IntentModel]:
    """Generate an event log from the intent model (see the module docstring) and return it
    with the model: ``(events, model)``, events with int64 columns SessionId, ItemId, Time,
    ordered by session (in start-time order) and time.

    Deterministic for a given ``seed`` and arguments. ``mix = (a, b, c)`` weighs the successor
    table, the session's intent and global popularity. The defaults (about 120,000 events) train
    10 epochs of GRU4Rec with 100 units in one to two minutes on one CPU core. Invalid arguments
    raise ConfigError naming the parameter.
    """
    mix = _check_params(n_sessions=n_sessions, n_items=n_items, n_intents=n_intents, intent_size=intent_size,
                        intent_concentration=intent_concentration, n_successors=n_successors, mix=mix,
                        zipf_exponent=zipf_exponent, prior_concentration=prior_concentration, mean_length=mean_length,
                        max_length=max_length, n_days=n_days, start_time=start_time, seed=seed)
    rng = np.random.default_rng(seed)
    model = _model(rng, int(n_items), int(n_intents), int(intent_size), float(intent_concentration),
                   int(n_successors), mix, float(zipf_exponent), float(prior_concentration))
    extra = rng.geometric(1.0 / (mean_length - 1.0), size=n_sessions) - 1
    lengths = np.minimum(2 + extra, max_length).astype(np.int64)
    items, _ = model.sample(lengths, rng)

    span = int(n_days * _SECONDS_PER_DAY)
    starts = start_time + np.sort(rng.integers(0, span, size=n_sessions))
    first = np.r_[0, np.cumsum(lengths)[:-1]]
    gaps = 1 + np.floor(rng.exponential(60.0, size=len(items))).astype(np.int64)
    gaps[first] = 0
    within = np.cumsum(gaps)
    within -= np.repeat(within[first], lengths)
    times = np.repeat(starts, lengths) + within
    session_ids = np.repeat(np.arange(1, n_sessions + 1, dtype=np.int64), lengths)
    return pd.DataFrame({"SessionId": session_ids, "ItemId": model.item_ids[items], "Time": times}), model


# ---------------------------------------------------------------------- writing


def _flat_metrics(m: dict[str, Any], train_file: str) -> dict[str, Any]:
    out: dict[str, Any] = {"train": train_file}
    for name in ("recall", "mrr"):
        out.update({f"{name}@{c}": v for c, v in m[name].items()})
    out.update({k: m[k] for k in ("n_predictions", "n_sessions", "n_dropped_events", "n_items")})
    return out


def write_intents(
    out_dir: str | os.PathLike[str],
    *,
    n_sessions: int = 20_000,
    n_items: int = 3_000,
    n_intents: int = 50,
    intent_size: int = 150,
    intent_concentration: float = 0.3,
    n_successors: int = 4,
    mix: tuple[float, float, float] = (0.2, 0.65, 0.15),
    zipf_exponent: float = 1.0,
    prior_concentration: float = 10.0,
    mean_length: float = 6.0,
    max_length: int = 50,
    n_days: float = 30.0,
    start_time: int = 1_600_000_000,
    seed: int = 42,
    test_days: float = 1.0,
    cutoffs: int | Sequence[int] = DEFAULT_CUTOFFS,
    force: bool = False,
) -> dict[str, Path]:
    """Generate an intents data set (see :func:`generate_intents` for the parameters) and write
    the four TSVs of the public data sets (``train_full``, ``test``, ``train_tr``,
    ``train_valid``) and ``oracle.json`` into ``out_dir``.

    test = sessions starting in the last ``test_days`` days; the same rule on train_full gives
    train_tr / train_valid (:func:`gru4rec.datasets.synthetic.time_split`). ``oracle.json`` holds
    the parameters (seed included), and the oracle's ``recall@c`` / ``mrr@c`` for each of
    ``cutoffs`` on test (ranked among train_full's items) and on train_valid (among train_tr's,
    for tuning), with the numbers of predictions, as ``gru4rec.evaluate(..., mode='conservative')``
    would count them. Every file is written atomically; existing files are never replaced unless
    ``force`` (DataError naming the first existing file, and nothing is written). Returns
    ``{name: path}`` for ``train_full``, ``test``, ``train_tr``, ``train_valid`` and ``oracle``.
    """
    params = dict(n_sessions=n_sessions, n_items=n_items, n_intents=n_intents, intent_size=intent_size,
                  intent_concentration=intent_concentration, n_successors=n_successors, mix=mix,
                  zipf_exponent=zipf_exponent, prior_concentration=prior_concentration, mean_length=mean_length,
                  max_length=max_length, n_days=n_days, start_time=start_time, seed=seed)
    _check_params(**params)
    _check(_is_real(test_days) and 0 < test_days < n_days / 2, "test_days", test_days, f"need a number in (0, n_days / 2 = {n_days / 2})")
    cut = _cutoffs(cutoffs)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    paths = {name.removesuffix(".tsv"): out / name for name in SPLIT_FILES}
    paths["oracle"] = out / ORACLE_FILE
    if not force:
        for p in paths.values():
            if p.exists():
                raise DataError(f"{p}: file exists; pass force=True (--force) to overwrite it")
    df, model = generate_intents(**params)  # type: ignore[arg-type]
    seconds = test_days * _SECONDS_PER_DAY
    train_full, test = time_split(df, seconds)
    train_tr, train_valid = time_split(train_full, seconds)
    frames = {"train_full": train_full, "test": test, "train_tr": train_tr, "train_valid": train_valid}
    for name, frame in frames.items():
        if len(frame) == 0:
            raise DataError(f"{paths[name]}: the split would be empty (n_sessions={n_sessions}, "
                            f"test_days={test_days}); use more sessions or fewer test days")
    report = {
        "generator": "gru4rec.datasets.intents",
        "params": {k: (list(map(float, v)) if k == "mix" else v.item() if isinstance(v, np.generic) else v)
                   for k, v in {**params, "test_days": test_days}.items()},
        "mode": "conservative",
        "cutoffs": cut,
        "test": _flat_metrics(model.oracle_metrics(test, train_full["ItemId"].unique(), cut), "train_full.tsv"),
        "train_valid": _flat_metrics(model.oracle_metrics(train_valid, train_tr["ItemId"].unique(), cut), "train_tr.tsv"),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        write_events(frame, paths[name], force=force)
    atomic_write(paths["oracle"], lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8"))
    return paths
