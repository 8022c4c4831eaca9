"""How often the next item is already in the session: the share of prediction targets (every
event but a session's first) whose item occurred earlier in the same session, and the share
that repeats the previous item. The evaluator predicts exactly these targets, so a data set's
repeat share is the part of its test that a model can win by scoring the session's own items.

Count on the sessions the evaluator sees: events of items unknown to the training split dropped
first (``sessions_from_events(..., drop_unknown=True)``), so that a session A, X, A with X
unknown has one target, A, and it is an immediate repeat.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gru4rec.data.sessions import Sessions

__all__ = ["RepeatShares", "repeat_shares"]


@dataclass(frozen=True)
class RepeatShares:
    """Counts of prediction targets; the shares are fractions of ``n_targets``."""

    n_targets: int
    n_repeats: int
    """Targets whose item occurred earlier in their session."""
    n_immediate: int
    """Targets equal to the item just before them."""

    @property
    def share(self) -> float:
        return self.n_repeats / self.n_targets if self.n_targets else float("nan")

    @property
    def immediate_share(self) -> float:
        return self.n_immediate / self.n_targets if self.n_targets else float("nan")


def repeat_shares(sessions: Sessions) -> RepeatShares:
    """The repeat counts of ``sessions`` (vectorised: an event repeats iff its (session, item)
    pair occurred before, and a session's first event never does)."""
    items = np.asarray(sessions.items, dtype=np.int64)
    offsets = np.asarray(sessions.offsets, dtype=np.int64)
    lengths = offsets[1:] - offsets[:-1]
    n_events = len(items)
    if n_events == 0:
        return RepeatShares(0, 0, 0)
    session = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    pairs = session * (int(items.max()) + 1) + items
    n_distinct = len(np.unique(pairs))
    same_session = session[1:] == session[:-1]
    immediate = int(np.count_nonzero(same_session & (items[1:] == items[:-1])))
    n_targets = n_events - int(np.count_nonzero(lengths))
    return RepeatShares(n_targets=n_targets, n_repeats=n_events - n_distinct, n_immediate=immediate)
