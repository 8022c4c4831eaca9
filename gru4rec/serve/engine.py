"""The model side of serving: item ids to indices, one batched GRU step, scoring, top-k.

:meth:`Engine.run` takes a whole micro-batch of :class:`Work` — each a session's state (or none)
and the known items to feed it, oldest first — and does, for all of them together, the GRU steps
(one per position; rows with fewer items keep their state where they have none), one scoring
product and one top-k (:mod:`gru4rec.serve.scoring`). Per request it only slices the results: no
Python loop over items or over the catalogue. The answers are those of ``GRU4Rec.recommend`` on
the same clicks: unknown items skipped, a session without a known item gets the most popular
items (``fallback``, no scores), and ``exclude_seen`` removes the session's own items.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from gru4rec.recommender import GRU4Rec
from gru4rec.serve.scoring import TopK, make_topk
from gru4rec.serve.state import SessionState

__all__ = ["Answer", "Engine", "Work"]

log = logging.getLogger(__name__)


@dataclass
class Work:
    """One row of a batch: the session's state before (None: a fresh session), the known item
    indices to feed it, the list length ``k`` and whether to drop the session's own items."""

    state: SessionState | None
    items: np.ndarray
    k: int
    exclude_seen: bool = False


@dataclass
class Answer:
    """One row's result: item indices (best first), their scores (None for the popularity
    fallback) and the session's state after the items."""

    items: np.ndarray
    scores: np.ndarray | None
    fallback: bool
    state: SessionState


class Engine:
    """A loaded model ready to serve. Not thread-safe: one worker thread calls :meth:`run`."""

    def __init__(self, model: GRU4Rec, *, scoring: str = "auto", candidates: int = 128, int8_max_batch: int = 64,
                 checksum: str = "", file: str | None = None) -> None:
        """``checksum`` and ``file`` identify the model (``/v1/model``, the session namespace)."""
        net, item_map, support = model._require_fitted()
        self.checksum, self.file = checksum, file
        self.model, self.net, self.device = model, net.eval(), model.device
        self.sizes = net.sizes
        self.hidden_size = sum(self.sizes)
        self.n_items = len(item_map)
        #: Item ids as plain Python values (JSON-ready), by index.
        self.item_ids: list[Any] = item_map.to_list()
        # A dict answers one id in ~0.1 µs; the map's pandas index costs ~50 µs per call.
        self._index = {item_id: i for i, item_id in enumerate(self.item_ids)}
        self.popular = np.argsort(-support, kind="stable")  # the fallback list, as recommend() orders it
        self.topk: TopK = make_topk(net.Wy, net.By, scoring, n_candidates=candidates, max_batch=int8_max_batch)
        self._offsets = np.cumsum([0, *self.sizes])

    def keeps_states_of(self, other: "Engine") -> bool:
        """Whether the sessions' states under ``other`` are valid states here: the same layers and
        ``other``'s items at the same indices (a warm start of ``other`` has both)."""
        return self.sizes == other.sizes and self.item_ids[: other.n_items] == other.item_ids

    def index_of(self, item_ids: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
        """Known item indices (in order) and the unknown ids of ``item_ids``."""
        index = self._index
        known, unknown = [], []
        for item_id in item_ids:
            i = index.get(item_id)
            if i is None or isinstance(item_id, bool):
                unknown.append(item_id)
            else:
                known.append(i)
        return np.asarray(known, dtype=np.int64), unknown

    @torch.inference_mode()
    def run(self, batch: Sequence[Work]) -> list[Answer]:
        """Feed every row its items, score the rows that have a known item, top-k each."""
        B = len(batch)
        states = [w.state if w.state is not None else SessionState() for w in batch]
        start = np.zeros((B, self.hidden_size), dtype=np.float32)
        for row, s in enumerate(states):
            if s.hidden is not None:
                start[row] = s.hidden
        lengths = np.array([len(w.items) for w in batch])
        H = torch.from_numpy(start).to(self.device)
        hidden = [H[:, a:b].contiguous() for a, b in zip(self._offsets[:-1], self._offsets[1:])]
        steps = int(lengths.max()) if B else 0
        if steps:
            items = np.zeros((B, steps), dtype=np.int64)
            for row, w in enumerate(batch):
                items[row, : len(w.items)] = w.items
            self._steps(torch.from_numpy(items).to(self.device), lengths, hidden)
        seen = [np.concatenate([s.seen, w.items.astype(np.int32)]) if len(w.items) else s.seen for s, w in zip(states, batch)]
        live = [row for row in range(B) if len(seen[row])]
        answers: list[Answer | None] = [None] * B
        if live:
            rows = torch.from_numpy(np.asarray(live)).to(self.device)
            top = self.topk(hidden[-1].index_select(0, rows), [batch[r].k for r in live],
                            [seen[r] if batch[r].exclude_seen else _NONE for r in live])
        H_after = torch.cat(hidden, dim=1).cpu().numpy() if steps else start
        for row in range(B):
            w = batch[row]
            if not len(seen[row]):
                answers[row] = Answer(self.popular[: w.k], None, True, SessionState(None, seen[row]))
        for j, row in enumerate(live):
            k = batch[row].k
            scores = top.scores[j, :k]
            keep = np.isfinite(scores)  # excluded items (fewer than k left) are not answers
            answers[row] = Answer(top.indices[j, :k][keep], scores[keep], False, SessionState(H_after[row].copy(), seen[row]))
        return answers  # type: ignore[return-value]

    def _steps(self, items: torch.Tensor, lengths: np.ndarray, hidden: list[torch.Tensor]) -> None:
        """GRU steps over the columns of ``items``; a row stops after its ``lengths`` items (its
        state then stays as it was)."""
        steps = items.shape[1]
        ragged = bool((lengths < steps).any())
        live = torch.from_numpy(lengths[:, None] > np.arange(steps)[None, :]).to(items.device) if ragged else None
        for t in range(steps):
            if live is None or bool(lengths.min() > t):
                self.net.step(items[:, t], hidden)
                continue
            before = [h.clone() for h in hidden]
            self.net.step(items[:, t], hidden)
            keep = live[:, t : t + 1]
            for h, h_old in zip(hidden, before):
                torch.where(keep, h, h_old, out=h)


_NONE = np.zeros(0, dtype=np.int64)
