"""The item map: item id <-> dense item index 0..N-1, the index the model's rows use.

Ids keep their type (int ids stay ints, string ids stay strings), so ``214821371`` in the
training file and ``214821371`` in a test file or a live request map to the same item.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.data.events import show_value
from gru4rec.errors import DataError

__all__ = ["ItemMap"]


class ItemMap:
    """Item id <-> dense index 0..N-1, in order of first appearance in the training data
    (docs/behaviour.md §1).

    Saved with the model as a JSON list (`to_list` / `from_list`). Ids keep their type: int ids
    stay ints, string ids stay strings.
    """

    __slots__ = ("_index", "_ids")

    def __init__(self, index: pd.Index) -> None:
        """Wrap a unique pandas Index (use `from_ids` or `from_list` rather than this)."""
        if not index.is_unique:
            dup = index[index.duplicated()][0]
            raise DataError(f"item map: duplicate item id {show_value(dup)}")
        self._index = index
        self._ids: np.ndarray | None = None

    @classmethod
    def from_ids(cls, ids: Iterable[Any] | np.ndarray | pd.Series | pd.Index) -> ItemMap:
        """Build the map from a sequence of item ids (typically the training ItemId column as
        read): index i is the i-th distinct id in order of first appearance."""
        if not isinstance(ids, (pd.Series, pd.Index, np.ndarray)):
            ids = list(ids)
        return cls(pd.Index(ids).unique())

    @classmethod
    def from_list(cls, ids: list[Any]) -> ItemMap:
        """Rebuild a map saved with `to_list` (the list position is the index)."""
        if not isinstance(ids, list):
            raise DataError(f"item map: expected a list of ids, got {type(ids).__name__}")
        return cls(pd.Index(ids))

    def to_list(self) -> list[Any]:
        """The ids in index order as plain Python scalars (int/str/float): JSON-serialisable."""
        return self._index.tolist()

    @property
    def ids(self) -> np.ndarray:
        """The ids in index order as a NumPy array (int64 for int ids, object for strings);
        ``ids[k]`` is the id of item index k."""
        if self._ids is None:
            self._ids = self._index.to_numpy()
        return self._ids

    def __len__(self) -> int:
        return len(self._index)

    def index_of(self, ids: Any) -> np.ndarray:
        """Dense indices (int64) of the given ids; -1 for ids not in the map. Accepts a scalar,
        a list, a NumPy array, a Series or an Index."""
        if np.isscalar(ids):
            ids = [ids]
        return np.asarray(self._index.get_indexer(ids), dtype=np.int64)

    def __contains__(self, item_id: Any) -> bool:
        return item_id in self._index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ItemMap):
            return NotImplemented
        return (
            len(self) == len(other)
            and self._index.inferred_type == other._index.inferred_type
            and bool(self._index.equals(other._index))
        )

    __hash__ = None  # type: ignore[assignment]  # equal by contents and mutable: unhashable, as a dict is

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self._index[:3].tolist())
        more = ", ..." if len(self) > 3 else ""
        return f"ItemMap(n_items={len(self)}, ids=[{head}{more}])"
