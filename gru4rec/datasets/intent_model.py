"""The intent model of the intents benchmark and its Bayes-optimal next-item predictor (the oracle).

:class:`IntentModel` holds, over N items (internal indices 0..N-1) and K intents: ``pop``, a
global popularity; ``phi_k``, an item distribution per intent; ``rho``, a prior over intents;
``T``, a sparse first-order transition table (CSR arrays, never an N × N matrix); and
``mix = (a, b, c)``, a + b + c = 1. A session draws its intent ``k ~ rho`` and keeps it:

* its first item from ``P(x_1 | k) = (b phi_k + c pop) / (b + c)`` (a first click has no
  predecessor, so the transition term is left out and the rest renormalised);
* every next item from ``P(j | prev=i, k) = a T[i, j] + b phi_k(j) + c pop(j)``.

``c > 0`` and ``pop > 0`` are required: every item then has a positive probability after any
item, so every sequence (also one with items filtered out) has a positive likelihood.
:mod:`gru4rec.datasets.intents` draws the parameters and writes data sets.

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
approximation. Everything is vectorised: sessions advance together position by position, and
the predictions are scored in blocks of B × N probability matrices.

``phi`` is held as a dense K × N float64 matrix (K·N·8 bytes).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

from gru4rec.data import ItemMap, read_events, sessions_from_events, validate_events
from gru4rec.errors import ConfigError, DataError

__all__ = ["IntentModel", "DEFAULT_CUTOFFS", "check_cutoffs", "intent_posteriors"]

#: The cutoffs of the oracle's metrics unless told otherwise.
DEFAULT_CUTOFFS: tuple[int, ...] = (1, 5, 10, 20)
_BLOCK_BYTES = 32 << 20  # size of one block of B × N predictive probabilities


def _is_int(x: object) -> TypeGuard[int | np.integer]:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _show(x: Any) -> str:
    return repr(x.item() if isinstance(x, np.generic) else x)


def check_cutoffs(cutoffs: int | Sequence[int]) -> list[int]:
    """The sorted distinct cutoffs of one int or a list of ints >= 1; ConfigError naming
    ``cutoffs`` otherwise."""
    values = [cutoffs] if _is_int(cutoffs) else list(cutoffs) if isinstance(cutoffs, (list, tuple)) else []
    if not values or not all(_is_int(c) and c >= 1 for c in values):
        raise ConfigError(f"intents data: cutoffs={cutoffs!r} is invalid; need positive integers")
    return sorted({int(c) for c in values})


def intent_posteriors(rho: np.ndarray, phi: np.ndarray, pop: np.ndarray, mix: tuple[float, float, float],
                      transition: Callable[[np.ndarray, np.ndarray], np.ndarray], items: np.ndarray,
                      offsets: np.ndarray) -> np.ndarray:
    """The forward recursion of an intent model (prior ``rho`` [K], item distributions ``phi``
    [K × N], popularity ``pop`` [N], mixture ``mix`` = (a, b, c), ``transition(prev, nxt)`` =
    T[prev, nxt] elementwise) over flat sessions of internal indices: ``P(k | x_1..x_t)`` after
    every event (E × K), renormalised in log space at every position, sessions advancing
    together. :meth:`IntentModel.prefix_posteriors` with the generator's tables; a plug-in rule
    with estimated ones (experiments/intents_limit)."""
    items = np.asarray(items, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    a, b, c = mix
    out = np.empty((len(items), len(rho)))
    active = np.flatnonzero(lengths > 0)
    first = (b * phi[:, items[offsets[active]]] + c * pop[items[offsets[active]]]) / (b + c)  # P(x_1 | k), K × S
    cur = np.log(rho) + np.log(first.T)
    cur -= cur.max(axis=1, keepdims=True)
    out[offsets[active]] = cur
    for t in range(1, int(lengths.max(initial=0))):
        keep = lengths[active] > t
        active, cur = active[keep], cur[keep]
        pos = offsets[active] + t
        x = items[pos]
        like = a * transition(items[pos - 1], x)[:, None] + b * phi[:, x].T + c * pop[x][:, None]
        cur = cur + np.log(like)
        cur -= cur.max(axis=1, keepdims=True)  # renormalise in log space: no underflow
        out[pos] = cur
    np.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)
    return out


def _check_model(cond: bool, model: IntentModel, rule: str) -> None:
    if not cond:
        raise ConfigError(f"intent model: {model!r} is invalid; {rule}")


@dataclass(frozen=True, eq=False, repr=False)
class IntentModel:
    """The parameters of the intent model (see the module docstring), its sampler and its oracle.

    Item index j (the columns of ``phi``, of ``next_item_probs``, ...) is the item with
    external id ``item_ids[j]``; the public methods take and return external ids. Made by
    :func:`gru4rec.datasets.intents.generate_intents`; one built by hand is checked for
    consistent shapes, a positive ``pop``, ``c > 0`` and non-empty rows of T with increasing
    successors in [0, N) (ConfigError).
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
        _check_model(shapes and len(self.mix) == 3 and self.mix[2] > 0 and bool(np.all(self.pop > 0)), self,
                     "need pop [N] > 0, phi [K, N], rho [K], CSR arrays of T of matching sizes and mix (a, b, c) with c > 0")
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.succ_indptr))
        # Sorted (row, column) keys of T's non-zeros: vectorised look-up of any T[i, j].
        keys = rows * n + self.succ_indices
        ok = np.all(np.diff(self.succ_indptr) > 0) and np.all(np.diff(keys) > 0)
        _check_model(bool(ok and np.all((self.succ_indices >= 0) & (self.succ_indices < n))), self,
                     "every item needs successors, items in [0, N) in increasing order")
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
        return intent_posteriors(self.rho, self.phi, self.pop, self.mix, self.transition, items, offsets)

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
        cut = check_cutoffs(cutoffs)
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
