"""The inference engine: sessions' clicks in; states, scores and top-k lists out.

Every way of asking a trained model — ``GRU4Rec.recommend*``, ``score_sessions``,
``session_embeddings``, ``predict_next_batch``, ``gru4rec recommend`` and the HTTP server —
runs through :class:`Engine`, over any :class:`~gru4rec.inference.SessionModel` (the evaluator
keeps its own session-parallel loop over the same protocol and the same boost):

* **Ragged steps.** A batch of sessions with different numbers of clicks is fed in one
  transfer: rows sorted by their number of clicks (longest first), so that the rows still
  clicking at step t are a prefix and each step runs on row-prefix views of the state — no
  masks, no copies of the state, no host synchronisation inside the loop.
* **Chunks.** Many sessions are run ``chunk`` at a time (:attr:`Engine.chunk`: as many rows as
  fit ``chunk_bytes`` of scores, at most :data:`MAX_CHUNK_ROWS`), so memory is bounded by the
  chunk, never by the number of sessions; results come back chunk by chunk (a generator).
* **Top-k** with exclusions by :mod:`gru4rec.inference.scoring` (float32, or certified int8
  candidates on the CPU); a session without a known item gets the most popular items
  (``fallback``, no scores). With repeat-aware scoring on (the model's ``repeat_boost``,
  :mod:`gru4rec.inference.repeat`) the session's clicks boost their items' scores first. A
  chunk's clicks stay flat (:class:`~gru4rec.inference.clicks.Clicks`) from the input to the
  exclusions and the boost.
* **Streaming** (:meth:`Engine.predict_next`): the original's one-state-per-position interface,
  its state held by the engine.
* **Click context** (a model with ``click_context``, docs/attributes.md): every click's context
  (:mod:`gru4rec.items.context`) is computed from its time — given per click, else the clock at
  the call — and the session's previous click's (:attr:`SessionState.last_time` when serving),
  and fed with the click. A plain model ignores the times.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from gru4rec.errors import Gru4RecError
from gru4rec.inference.clicks import Clicks
from gru4rec.inference.protocol import SessionModel, advance, catalogue_of, catalogue_support, require_fitted, uses_context
from gru4rec.inference.repeat import RepeatBoost
from gru4rec.inference.scoring import TopK, make_topk
from gru4rec.inference.state import SessionState
from gru4rec.items.context import context_of, sessions_context

__all__ = ["Answer", "DEFAULT_CHUNK_BYTES", "Engine", "MAX_CHUNK_ROWS", "TopKChunk", "Work"]

log = logging.getLogger(__name__)

#: Scores held at once by the chunked methods: 256 MiB (64 rows of a 1M-item catalogue).
DEFAULT_CHUNK_BYTES = 256 << 20
#: The most sessions a chunk holds (a larger product gains nothing).
MAX_CHUNK_ROWS = 1024


def _boosting(boost: RepeatBoost, clicks: Clicks) -> Callable[[Tensor], Tensor] | None:
    """The scores' adjustment of repeat-aware scoring for rows with these clicks (None: no boost)."""
    return (lambda scores: boost.apply(scores, clicks)) if boost.active else None


@dataclass
class _Stream:
    """The state of :meth:`Engine.predict_next`: the session id at each position (None: no
    session yet), the positions' states and a fresh state to reset them from."""

    session_ids: np.ndarray
    state: list[Tensor]
    fresh: list[Tensor]


@dataclass
class Work:
    """One row of a served batch: the session's state before (None: a fresh session), the known
    item indices to feed it, the list length ``k`` and whether to drop the session's own items."""

    state: SessionState | None
    items: np.ndarray
    k: int
    exclude_seen: bool = False
    #: The clicks' times (unix seconds, one per item; None: the clock when the batch runs), read
    #: by a model with click context only.
    times: np.ndarray | None = None


@dataclass
class Answer:
    """One row's result: item indices (best first), their scores (None for the popularity
    fallback) and the session's state after the items."""

    items: np.ndarray
    scores: np.ndarray | None
    fallback: bool
    state: SessionState


@dataclass
class TopKChunk:
    """The top-k of sessions ``start .. start + len(fallback)`` of a :meth:`Engine.recommend`
    call: ``indices`` (C×k item indices, best first) and ``scores`` (C×k float32); where a row
    has fewer than k answers (exclusions) the rest is index −1 and score NaN; a ``fallback`` row
    (no known item) holds the k most popular items with NaN scores."""

    start: int
    indices: np.ndarray
    scores: np.ndarray
    fallback: np.ndarray


class Engine:
    """A fitted session model, ready to answer. Not thread-safe: one thread at a time.

    ``scoring``: ``'float32'``, ``'int8'`` or ``'auto'`` (:func:`~gru4rec.inference.scoring.make_topk`);
    ``candidates`` and ``int8_max_batch`` tune the int8 path. ``chunk_bytes``: the scores held
    at once by the chunked methods. ``checksum`` and ``file`` identify a served model file.
    """

    def __init__(self, model: SessionModel, *, scoring: str = "float32", candidates: int = 128, int8_max_batch: int = 64,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, checksum: str = "", file: str | None = None) -> None:
        item_map, support = require_fitted(model)
        self.model, self.device = model, model.device
        self.checksum, self.file = checksum, file
        self.item_map, self.item_support = item_map, support
        #: The items the scores rank (:func:`~gru4rec.inference.protocol.catalogue_of`): the model's
        #: item map, then its cold items when it has attributes; item indices here are its indices.
        self.catalogue = catalogue_of(model)
        self.n_items = len(self.catalogue)
        #: Widths of the state tensors; a session's state is their concatenation.
        self.sizes = [s.shape[1] for s in model.init_state(1)]
        self.hidden_size = sum(self.sizes)
        self._offsets = np.cumsum([0, *self.sizes])
        # The fallback list (a cold item, with no training event, comes after every clicked one).
        self.popular = np.argsort(-catalogue_support(model), kind="stable")
        self.topk: TopK = make_topk(model, scoring, n_candidates=candidates, max_batch=int8_max_batch)
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        #: Sessions per chunk of the chunked methods.
        self.chunk = max(1, min(MAX_CHUNK_ROWS, chunk_bytes // (4 * self.n_items)))
        #: Whether the model takes the clicks' context (computed here from the clicks' times).
        self.click_context = uses_context(model)
        self._ids: list[Any] | None = None
        self._index: dict[Any, int] | None = None
        self._stream: _Stream | None = None

    # ------------------------------------------------------------------ item ids

    @property
    def item_ids(self) -> list[Any]:
        """Item ids of the catalogue as plain Python values (JSON-ready), by index."""
        if self._ids is None:
            self._ids = self.catalogue.to_list()
        return self._ids

    def index_of(self, item_ids: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
        """Known item indices (in order) and the unknown ids of ``item_ids`` (a few ids, as a
        request brings: a dict answers one in ~0.1 µs, the map's pandas index costs ~50 µs a call)."""
        if self._index is None:
            self._index = {item_id: i for i, item_id in enumerate(self.item_ids)}
        index = self._index
        known, unknown = [], []
        for item_id in item_ids:
            i = index.get(item_id)
            if i is None or isinstance(item_id, bool):
                unknown.append(item_id)
            else:
                known.append(i)
        return np.asarray(known, dtype=np.int64), unknown

    def known(self, item_ids: Sequence[Any]) -> np.ndarray:
        """Which of ``item_ids`` :meth:`index_of` knows (bool, one per id): e.g. to keep the
        known clicks' times beside their indices."""
        if self._index is None:
            self._index = {item_id: i for i, item_id in enumerate(self.item_ids)}
        return np.array([item_id in self._index and not isinstance(item_id, bool) for item_id in item_ids], dtype=bool)

    def keeps_states_of(self, other: Engine) -> bool:
        """Whether the sessions' states under ``other`` are valid states here: the same state
        widths and ``other``'s items at the same indices (a warm start of ``other`` has both)."""
        return self.sizes == other.sizes and self.item_ids[: other.n_items] == other.item_ids

    # ------------------------------------------------------------------ steps

    def _feed(self, state: list[Tensor], items: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
              context: np.ndarray | None = None) -> None:
        """Feed row b of ``state`` the items ``items[starts[b] : starts[b] + lengths[b]]``, oldest
        first. The rows must be sorted by ``lengths``, longest first: at step t the rows still
        clicking are the first A_t, and the step runs on row-prefix views of the state.
        ``context`` (float32 [E × 5], aligned with ``items``): the clicks' context, for a model
        with click context (it is laid out as the items are, in the same transfer count)."""
        T = int(lengths[0]) if len(lengths) else 0
        if T == 0:
            return
        B = len(lengths)
        # A T×B matrix of the items (step t's row is contiguous), built without a loop over rows.
        row = np.repeat(np.arange(B), lengths)
        t = np.arange(len(row)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded = np.zeros((T, B), dtype=np.int64)
        source = np.repeat(starts, lengths) + t
        padded[t, row] = items[source]
        steps = torch.from_numpy(padded).to(self.device)
        live = np.searchsorted(-lengths, -np.arange(T), side="left")  # rows with more than t items
        ctx = None
        if context is not None:
            laid = np.zeros((T, B, context.shape[1]), dtype=np.float32)
            laid[t, row] = context[source]
            ctx = torch.from_numpy(laid).to(self.device)
        for t_ in range(T):
            A = int(live[t_])
            advance(self.model, steps[t_, :A], state if A == B else [s[:A] for s in state], None if ctx is None else ctx[t_, :A])

    def _chunks(self, offsets: np.ndarray) -> Iterator[tuple[int, int]]:
        for a in range(0, len(offsets) - 1, self.chunk):
            yield a, min(a + self.chunk, len(offsets) - 1)

    def _context(self, items: np.ndarray, offsets: np.ndarray, times: np.ndarray | None) -> np.ndarray | None:
        """The clicks' context of sessions laid out as ``items``/``offsets`` for a model with
        click context (None for a plain one): from ``times`` (one per item), or every click at
        the clock's time now when None (then every gap is 0)."""
        if not self.click_context:
            return None
        if times is None:
            times = np.full(len(items), time.time())
        elif len(times) != len(items):
            raise Gru4RecError(f"times: {len(times)} click times for {len(items)} clicks")
        return sessions_context(times, offsets)

    def _outputs(self, items: np.ndarray, offsets: np.ndarray, a: int, b: int,
                 context: np.ndarray | None = None) -> tuple[Tensor, np.ndarray]:
        """Outputs of sessions a..b (from a fresh state) and their lengths, in session order."""
        lengths = np.diff(offsets[a : b + 1])
        order = np.argsort(-lengths, kind="stable")
        state = self.model.init_state(b - a)
        self._feed(state, items, offsets[a:b][order], lengths[order], context)
        out = torch.empty_like(state[-1])
        out[torch.from_numpy(order).to(self.device)] = state[-1]
        return out, lengths

    # ------------------------------------------------------------------ many sessions

    @torch.inference_mode()
    def outputs(self, items: np.ndarray, offsets: np.ndarray, times: np.ndarray | None = None) -> Iterator[tuple[int, Tensor]]:
        """The output (``state[-1]``) after each session, chunk by chunk: ``(start, C×W)`` for
        sessions ``start .. start + C``. Session s is ``items[offsets[s]:offsets[s+1]]`` (known
        item indices); an empty session's output is that of a fresh state. ``times``: the
        clicks' times (one per item) for a model with click context (None: the clock now)."""
        context = self._context(items, offsets, times)
        for a, b in self._chunks(offsets):
            yield a, self._outputs(items, offsets, a, b, context)[0]

    @torch.inference_mode()
    def session_scores(self, items: np.ndarray, offsets: np.ndarray, times: np.ndarray | None = None) -> Iterator[tuple[int, Tensor]]:
        """The model's scores of every item after each session (as :meth:`outputs` takes them),
        chunk by chunk: ``(start, C×N)``; the scores without the repeat boost."""
        context = self._context(items, offsets, times)
        for a, b in self._chunks(offsets):
            yield a, self.model.scores(self._outputs(items, offsets, a, b, context)[0])

    @torch.inference_mode()
    def recommend(self, items: np.ndarray, offsets: np.ndarray, k: int, *, exclude_seen: bool = False,
                  times: np.ndarray | None = None) -> Iterator[TopKChunk]:
        """The top-``k`` next items of each session (as :meth:`outputs` takes them), chunk by
        chunk, ranked by the scores with the model's repeat boost, when it has one."""
        k = min(k, self.n_items)
        boost = RepeatBoost.of(self.model)
        context = self._context(items, offsets, times)
        for a, b in self._chunks(offsets):
            out, lengths = self._outputs(items, offsets, a, b, context)
            C = b - a
            indices = np.full((C, k), -1, dtype=np.int64)
            scores = np.full((C, k), np.nan, dtype=np.float32)
            fallback = lengths == 0
            if not fallback.all():
                # A fallback row (no click) is scored with the others and its answer replaced:
                # cheaper than taking the other rows out of the output and the clicks.
                clicks = Clicks.window(items, offsets, a, b)
                top = self.topk(out, [k] * C, clicks if exclude_seen else None, _boosting(boost, clicks))
                kept = np.isfinite(top.scores[:, :k])  # excluded items (fewer than k left) are no answers
                indices[:] = np.where(kept, top.indices[:, :k], -1)
                scores[:] = np.where(kept, top.scores[:, :k], np.nan)
            indices[fallback] = self.popular[:k]
            scores[fallback] = np.nan
            yield TopKChunk(a, indices, scores, fallback)

    # ------------------------------------------------------------------ streaming

    def reset_stream(self) -> None:
        """Forget :meth:`predict_next`'s positions: the next call starts every position afresh."""
        self._stream = None

    @torch.inference_mode()
    def predict_next(self, session_ids: np.ndarray, items: np.ndarray) -> Tensor:
        """The original's streaming step (``GRU4Rec.predict_next_batch``): position b holds one
        session's state, which starts afresh when ``session_ids[b]`` differs from the previous
        call's (or the number of positions changed); a position with a known item (``items[b] >=
        0``) steps, the others keep their state. Returns the scores of every item after each
        position's state (B×N, without the repeat boost). A model with click context is refused
        (the streaming interface carries no times): use :meth:`recommend` with the clicks' times."""
        if self.click_context:
            raise Gru4RecError("predict_next_batch: the model takes click context (click_context), which the streaming "
                               "interface has no times for; use recommend_batch(..., times=...)")
        B = len(session_ids)
        ids = np.asarray(session_ids).astype(object)
        stream = self._stream
        if stream is None or len(stream.session_ids) != B:
            stream = self._stream = _Stream(np.full(B, None, dtype=object), self.model.init_state(B), self.model.init_state(B))
        changed = torch.from_numpy(ids != stream.session_ids).to(self.device).unsqueeze(1)
        for s, fresh in zip(stream.state, stream.fresh):
            s.copy_(torch.where(changed, fresh, s))
        rows = np.flatnonzero(items >= 0)
        if len(rows) == B:
            self.model.step(torch.from_numpy(items).to(self.device), stream.state)
        elif len(rows):
            index = torch.from_numpy(rows).to(self.device)
            part = [s.index_select(0, index) for s in stream.state]
            self.model.step(torch.from_numpy(items[rows]).to(self.device), part)
            for s, p in zip(stream.state, part):
                s.index_copy_(0, index, p)
        stream.session_ids = ids
        return self.model.scores(stream.state[-1])

    # ------------------------------------------------------------------ serving

    @torch.inference_mode()
    def run(self, batch: Sequence[Work]) -> list[Answer]:
        """Feed every row its items from its state, score the rows that have a known item, top-k
        each (one batch of a server; the batcher keeps it small)."""
        B = len(batch)
        lengths = np.array([len(w.items) for w in batch], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")
        states = [w.state if w.state is not None else SessionState() for w in batch]
        start = np.zeros((B, self.hidden_size), dtype=np.float32)
        for slot, row in enumerate(order):
            hidden = states[row].hidden
            if hidden is not None:
                start[slot] = hidden
        H = torch.from_numpy(start).to(self.device)
        state = [H[:, a:b].contiguous() for a, b in zip(self._offsets[:-1], self._offsets[1:])]
        sorted_lengths = lengths[order]
        last_times = [s.last_time for s in states]
        if B and sorted_lengths[0]:
            flat = np.concatenate([batch[row].items for row in order]).astype(np.int64, copy=False)
            context = None
            if self.click_context:
                context, last_times = self._work_context(batch, states, order)
            self._feed(state, flat, np.cumsum(sorted_lengths) - sorted_lengths, sorted_lengths, context)
        seen = [np.concatenate([s.seen, w.items.astype(np.int32)]) if len(w.items) else s.seen for s, w in zip(states, batch)]
        slot_of = np.empty(B, dtype=np.int64)
        slot_of[order] = np.arange(B)
        live = [row for row in range(B) if len(seen[row])]
        answers: list[Answer | None] = [None] * B
        if live:
            slots = torch.from_numpy(slot_of[live]).to(self.device)
            clicks = Clicks.of_rows([seen[r] for r in live])
            top = self.topk(state[-1].index_select(0, slots), [batch[r].k for r in live],
                            clicks.where(np.array([batch[r].exclude_seen for r in live], dtype=bool)),
                            _boosting(RepeatBoost.of(self.model), clicks))
        H_after = torch.cat(state, dim=1).cpu().numpy() if sorted_lengths.any() else start
        for row in range(B):
            if not len(seen[row]):
                answers[row] = Answer(self.popular[: batch[row].k], None, True, SessionState(None, seen[row], last_times[row]))
        for j, row in enumerate(live):
            k = batch[row].k
            scores = top.scores[j, :k]
            keep = np.isfinite(scores)  # excluded items (fewer than k left) are not answers
            answers[row] = Answer(top.indices[j, :k][keep], scores[keep], False,
                                  SessionState(H_after[slot_of[row]].copy(), seen[row], last_times[row]))
        assert all(answer is not None for answer in answers)  # every row: the fallback or the network's
        return cast("list[Answer]", answers)

    def _work_context(self, batch: Sequence[Work], states: list[SessionState], order: np.ndarray) -> tuple[np.ndarray, list[float | None]]:
        """The clicks' context of a served batch, laid out row after row in ``order`` (as
        :meth:`run` feeds them), and each row's last click time after it. A click's time is its
        own (``Work.times``) or the clock now; its gap is measured from the session's previous
        click (``SessionState.last_time``; none before its first), a click that comes before
        it (clocks of two replicas) counting as a gap of 0."""
        now = time.time()
        times, previous, last = [], [], []
        for row, work in enumerate(batch):
            n = len(work.items)
            t = np.full(n, now) if work.times is None else np.asarray(work.times, dtype=np.float64)
            if len(t) != n:
                raise Gru4RecError(f"times: {len(t)} click times for {n} clicks")
            held = states[row].last_time
            before = np.empty(n)
            before[:1] = np.nan if held is None else held
            before[1:] = t[:-1]
            times.append(t)
            previous.append(np.where(before > t, t, before))  # NaN (no previous click) compares False: kept
            last.append(float(t[-1]) if n else held)
        flat_t = np.concatenate([times[row] for row in order])
        flat_p = np.concatenate([previous[row] for row in order])
        return context_of(flat_t, flat_p), last
