"""Each row's clicks of a batch as two flat arrays — the form every part of inference takes them in.

A batch of sessions is ``items`` (item indices, session after session) and ``offsets`` (where
each row starts), as :class:`gru4rec.data.Sessions` holds them: the engine's input, the items a
top-k excludes (:mod:`gru4rec.inference.scoring`) and the history the repeat boost reads
(:mod:`gru4rec.inference.repeat`). Nothing is ever split into one array per row and joined again:
the (row, item) pairs and the clicks' ages come from the offsets in a few vectorised operations.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Clicks"]


@dataclass(frozen=True)
class Clicks:
    """Row b clicked ``items[offsets[b]:offsets[b + 1]]``, oldest first (int64 item indices;
    ``offsets`` int64 [rows + 1], non-decreasing, ``offsets[0] == 0``, ``offsets[-1] == len(items)``)."""

    items: np.ndarray
    offsets: np.ndarray

    @classmethod
    def none(cls, rows: int) -> Clicks:
        """``rows`` rows without a click."""
        return cls(np.zeros(0, dtype=np.int64), np.zeros(rows + 1, dtype=np.int64))

    @classmethod
    def window(cls, items: np.ndarray, offsets: np.ndarray, a: int, b: int) -> Clicks:
        """Sessions ``a .. b`` of flat sessions (``items``, ``offsets``), without a copy of the items."""
        return cls(items[offsets[a] : offsets[b]], offsets[a : b + 1] - offsets[a])

    @classmethod
    def of_rows(cls, rows: Sequence[np.ndarray]) -> Clicks:
        """One array of clicks per row (a server's sessions arrive so: one state each), joined once."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        items = np.concatenate(rows).astype(np.int64, copy=False) if offsets[-1] else np.zeros(0, dtype=np.int64)
        return cls(items, offsets)

    @property
    def n_rows(self) -> int:
        """The number of rows."""
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Clicks per row (int64 [rows])."""
        return np.diff(self.offsets)

    def rows(self) -> np.ndarray:
        """The row of every click (int64 [clicks])."""
        return np.repeat(np.arange(self.n_rows, dtype=np.int64), self.lengths)

    def ages(self) -> np.ndarray:
        """How many clicks of its row follow each click (0 for a row's last click)."""
        return np.repeat(self.offsets[1:], self.lengths) - np.arange(len(self.items), dtype=np.int64) - 1

    def where(self, keep: np.ndarray) -> Clicks:
        """The clicks of the rows with ``keep[b]`` true; the other rows get none."""
        keep = np.asarray(keep, dtype=bool)
        if keep.all():
            return self
        lengths = np.where(keep, self.lengths, 0)
        offsets = np.zeros(self.n_rows + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Clicks(self.items[np.repeat(keep, self.lengths)], offsets)

    def take(self, rows: np.ndarray) -> Clicks:
        """The clicks of rows ``rows`` (in that order), as a batch of ``len(rows)`` rows."""
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # click c of the new batch is click (c − its new row's start) of the old row
        source = np.repeat(self.offsets[:-1][rows] - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return Clicks(self.items[source], offsets)
