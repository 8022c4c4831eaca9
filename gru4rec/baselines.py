"""Simple session-based baselines behind the same :func:`gru4rec.evaluate` path as GRU4Rec.

Each baseline is fitted on training events and then implements the
:class:`~gru4rec.inference.SessionModel` protocol (a state per session, one step per click,
scores of every item), as :class:`gru4rec.GRU4Rec` does, so the evaluation — unknown items, tie
modes, metrics, batching — and the inference engine are exactly the ones GRU4Rec gets.

* :class:`Pop` — the most popular items (number of training events), the same list for everyone.
* :class:`SessionPop` — items of the current session first, by how often the session has visited
  them so far, then by popularity.
* :class:`ItemKNN` — items similar to the last item (co-occurrence in training sessions, cosine
  with regularisation), the Item-KNN baseline of Hidasi et al. (2016).

Example::

    from gru4rec import evaluate
    from gru4rec.baselines import Pop
    pop = Pop().fit("train.tsv")
    print(evaluate(pop, "test.tsv", cutoffs=(5, 20), mode="conservative"))
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gru4rec.data import ItemMap, item_support, read_events, sessions_from_events, validate_events
from gru4rec.errors import ConfigError, DataError
from gru4rec.inference import require_fitted
from gru4rec.machine.devices import resolve_device

__all__ = ["BaselineConfig", "Pop", "SessionPop", "ItemKNN"]


@dataclass(frozen=True)
class BaselineConfig:
    """The column names a baseline reads (the part of :class:`gru4rec.config.Config` the
    evaluator uses)."""

    session_key: str = "SessionId"
    item_key: str = "ItemId"
    time_key: str = "Time"


class _Baseline(ABC):
    """Fit plumbing shared by the baselines (read events, item map, support, sessions) and the
    parts of the :class:`~gru4rec.inference.SessionModel` protocol they share."""

    def __init__(
        self,
        *,
        session_key: str = "SessionId",
        item_key: str = "ItemId",
        time_key: str = "Time",
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = BaselineConfig(session_key, item_key, time_key)
        self.device = resolve_device(device)
        self.item_map: Any = None
        self.item_support: np.ndarray | None = None

    def fit(self, data: pd.DataFrame | str | os.PathLike[str]) -> _Baseline:
        """Fit on training events (a DataFrame or a path to an event file). Returns self."""
        keys = dict(session_key=self.config.session_key, item_key=self.config.item_key, time_key=self.config.time_key)
        if isinstance(data, (str, os.PathLike)):
            df = read_events(data, **keys)
        elif isinstance(data, pd.DataFrame):
            df = validate_events(data, source="training data", **keys)
        else:
            raise DataError(f"training data: expected a DataFrame or a path to an event file, got {type(data).__name__}")
        self.item_map = ItemMap.from_ids(df[self.config.item_key])
        sessions, _ = sessions_from_events(df, self.item_map, session_key=self.config.session_key,
                                           item_key=self.config.item_key, time_key=self.config.time_key)
        n = len(self.item_map)
        self.item_support = item_support(sessions, n)
        self._build(sessions.items, sessions.offsets, n)
        return self

    def _build(self, items: np.ndarray, offsets: np.ndarray, n_items: int) -> None:
        """Compute the fitted tables from the training sessions."""
        raise NotImplementedError

    @property
    def fitted(self) -> bool:
        """Whether :meth:`fit` has run."""
        return self.item_map is not None

    @abstractmethod
    def init_state(self, batch_size: int) -> list[Tensor]:
        """The state of ``batch_size`` new sessions (see :class:`~gru4rec.inference.SessionModel`)."""

    @abstractmethod
    def step(self, items: Tensor, state: list[Tensor]) -> Tensor:
        """Advance ``state`` by one click of each row (in place); returns what :meth:`scores` reads."""

    @abstractmethod
    def scores(self, out: Tensor, buffer: Tensor | None = None) -> Tensor:
        """Every item's score after :meth:`step`'s ``out``."""

    def output_layer(self) -> None:
        """None: a baseline's scores are not ``out·Wyᵀ + By``."""
        return None

    def _rows(self, width: int, batch_size: int) -> list[Tensor]:
        require_fitted(self)
        return [torch.zeros(batch_size, width, device=self.device)]

    def __repr__(self) -> str:
        fitted = f"n_items={len(self.item_map)}" if self.item_map is not None else "not fitted"
        return f"{type(self).__name__}({fitted})"


# ------------------------------------------------------------------------------------------
# Pop
# ------------------------------------------------------------------------------------------


class Pop(_Baseline):
    """Most popular: every item scored by its number of training events (ties keep equal scores,
    so the evaluator's tie mode applies to them)."""

    def fit(self, data: pd.DataFrame | str | os.PathLike[str]) -> Pop:
        """Fit on training events (a DataFrame or a path). Returns self."""
        super().fit(data)
        return self

    def _build(self, items: np.ndarray, offsets: np.ndarray, n_items: int) -> None:
        assert self.item_support is not None
        self._popularity = torch.as_tensor(self.item_support, dtype=torch.float32, device=self.device)

    def init_state(self, batch_size: int) -> list[Tensor]:
        """No state (one zero column per session)."""
        return self._rows(1, batch_size)

    def step(self, items: Tensor, state: list[Tensor]) -> Tensor:
        """Nothing to remember."""
        return state[-1]

    def scores(self, out: Tensor, buffer: Tensor | None = None) -> Tensor:
        """Every row: the items' training events."""
        rows = self._popularity.expand(out.shape[0], -1)
        return rows.clone() if buffer is None else buffer.copy_(rows)


# ------------------------------------------------------------------------------------------
# SessionPop
# ------------------------------------------------------------------------------------------


class SessionPop(_Baseline):
    """Session popularity: items already in the session first (most visited first), then the
    rest by global popularity."""

    def fit(self, data: pd.DataFrame | str | os.PathLike[str]) -> SessionPop:
        """Fit on training events (a DataFrame or a path). Returns self."""
        super().fit(data)
        return self

    def _build(self, items: np.ndarray, offsets: np.ndarray, n_items: int) -> None:
        assert self.item_support is not None
        support = torch.as_tensor(self.item_support, dtype=torch.float64)
        # In [0, 1): popularity only orders items the session visited equally often.
        self._tiebreak = (support / (support.max() + 1.0)).to(torch.float32).to(self.device)

    def init_state(self, batch_size: int) -> list[Tensor]:
        """Per session, how often it visited each item so far (B×N)."""
        return self._rows(len(self._tiebreak), batch_size)

    def step(self, items: Tensor, state: list[Tensor]) -> Tensor:
        """Count the item."""
        counts = state[-1]
        counts.scatter_add_(1, items.unsqueeze(1), torch.ones(len(items), 1, device=counts.device))
        return counts

    def scores(self, out: Tensor, buffer: Tensor | None = None) -> Tensor:
        """The session's visit counts plus the popularity tie-break."""
        return torch.add(out, self._tiebreak, out=buffer) if buffer is not None else out + self._tiebreak


# ------------------------------------------------------------------------------------------
# ItemKNN
# ------------------------------------------------------------------------------------------


def item_similarities(
    items: np.ndarray, offsets: np.ndarray, n_items: int, *, n_neighbors: int, lmbd: float, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Top ``n_neighbors`` neighbours of every item by session co-occurrence.

    With ``n_i`` the number of training sessions containing item i and ``c_ij`` the number
    containing both i and j (i ≠ j): ``sim(i, j) = c_ij / ((n_i + lmbd)^alpha · (n_j + lmbd)^(1 − alpha))``
    (alpha = 0.5, lmbd = 0: cosine similarity of the items' session vectors; lmbd > 0 damps the
    similarities of rarely seen items). Returns (idx int64 N×K, sim float64 N×K), rows sorted by
    decreasing similarity, padded with the item itself and similarity 0. Vectorised; memory is
    proportional to Σ (distinct items per session)².
    """
    lengths = np.diff(offsets)
    sess = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    # Distinct items of each session.
    key = np.unique(sess * n_items + items)
    s_u, i_u = key // n_items, key % n_items
    starts = np.r_[0, np.flatnonzero(np.diff(s_u)) + 1]
    k = np.diff(np.r_[starts, len(key)])
    n_i = np.bincount(i_u, minlength=n_items).astype(np.float64)
    # All ordered pairs (a, b), a ≠ b, inside each session.
    n_pairs = k * k
    first = np.repeat(starts, n_pairs)
    kk = np.repeat(k, n_pairs)
    p = np.arange(int(n_pairs.sum()), dtype=np.int64) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs)
    a = i_u[first + p // kk]
    b = i_u[first + p % kk]
    keep = a != b
    pair, c = np.unique(a[keep] * n_items + b[keep], return_counts=True)
    a, b = pair // n_items, pair % n_items
    sim = c / ((n_i[a] + lmbd) ** alpha * (n_i[b] + lmbd) ** (1.0 - alpha))
    # Best n_neighbors per row: sort by (a, −sim, b).
    order = np.lexsort((b, -sim, a))
    a, b, sim = a[order], b[order], sim[order]
    row_start = np.searchsorted(a, np.arange(n_items))
    pos = np.arange(len(a)) - row_start[a]
    top = pos < n_neighbors
    idx = np.repeat(np.arange(n_items, dtype=np.int64)[:, None], n_neighbors, axis=1)
    val = np.zeros((n_items, n_neighbors))
    idx[a[top], pos[top]] = b[top]
    val[a[top], pos[top]] = sim[top]
    return idx, val


class ItemKNN(_Baseline):
    """Item-to-item nearest neighbours of the last item (Hidasi et al., 2016).

    Args:
        n_neighbors: neighbours kept per item (the others score 0).
        lmbd: regularisation added to the session counts (see :func:`item_similarities`).
        alpha: weight of the source item's count in the normalisation (0.5 = cosine).
    """

    def __init__(
        self,
        n_neighbors: int = 100,
        lmbd: float = 20.0,
        alpha: float = 0.5,
        **kwargs: Any,
    ) -> None:
        problems = []
        if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, (int, np.integer)) or n_neighbors < 1:
            problems.append(f"n_neighbors: expected a positive integer, got {n_neighbors!r}")
        if not isinstance(lmbd, (int, float)) or not np.isfinite(lmbd) or lmbd < 0:
            problems.append(f"lmbd: expected a number >= 0, got {lmbd!r}")
        if not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
            problems.append(f"alpha: expected a number in [0, 1], got {alpha!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        super().__init__(**kwargs)
        self.n_neighbors = int(n_neighbors)
        self.lmbd = float(lmbd)
        self.alpha = float(alpha)

    def fit(self, data: pd.DataFrame | str | os.PathLike[str]) -> ItemKNN:
        """Fit on training events (a DataFrame or a path). Returns self."""
        super().fit(data)
        return self

    def _build(self, items: np.ndarray, offsets: np.ndarray, n_items: int) -> None:
        k = min(self.n_neighbors, max(n_items - 1, 1))
        idx, sim = item_similarities(items, offsets, n_items, n_neighbors=k, lmbd=self.lmbd, alpha=self.alpha)
        #: Each item's neighbours (N×K item indices, best first, padded with the item itself) and
        #: their similarities (N×K float32, 0 in the padding): :func:`item_similarities`.
        self.neighbours = torch.from_numpy(idx).to(self.device)
        self.similarities = torch.from_numpy(sim).to(torch.float32).to(self.device)

    def init_state(self, batch_size: int) -> list[Tensor]:
        """The session's last item (as a float: exact below 2^24 items)."""
        return self._rows(1, batch_size)

    def step(self, items: Tensor, state: list[Tensor]) -> Tensor:
        """Remember the item."""
        last = state[-1]
        last[:, 0] = items
        return last

    def scores(self, out: Tensor, buffer: Tensor | None = None) -> Tensor:
        """The similarities of the last item's neighbours, 0 elsewhere."""
        last = out[:, 0].long()
        scores = buffer.zero_() if buffer is not None else torch.zeros(out.shape[0], len(self.neighbours), device=out.device)
        return scores.scatter_(1, self.neighbours[last], self.similarities[last])
