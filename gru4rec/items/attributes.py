"""Item attributes as arrays aligned to the model's items: what an item is, besides its id.

:class:`AttributeEncoding` is the fitted transform from an :class:`~gru4rec.items.table.ItemTable`
to codes and numbers, learnt once on the *training items* (the items of the events a model
trains on, i.e. its :class:`~gru4rec.data.ItemMap`) and kept with the model, so that the same
transform applies to tomorrow's items:

* a categorical column (``categorical`` or ``multi``) gets a vocabulary: the values that at least
  ``min_count`` training items have, most frequent first (ties: first appearance in the table).
  **Code 0 is the unknown value**, a vocabulary value v has code ``1 + vocabulary.index(v)``;
  a value outside the vocabulary (rare, or seen only on items no event has) is 0;
* a numeric column is standardised with the mean and (population) standard deviation of its
  values on the training items that have one; a standard deviation of 0 (or no value at all)
  counts as 1. A missing number, after standardisation, is 0: the training mean.

:class:`ItemAttributes` holds the encoded table for the items ``0..n_warm-1`` of the item map
(in its order) followed by the **cold items** — rows of the table for ids that no training event
has — in table order (``item_map`` is that extended map). An item of the events without a row
gets the unknown code (one 0 in a ``multi`` column) and 0 for every number. A categorical column
is int64 codes flat with int64 offsets (item i's codes are ``codes[offsets[i]:offsets[i + 1]]``;
exactly one per item for ``categorical``), the numerics one float32 matrix [items × columns].
Memory is proportional to the table; the encoding is vectorised (no loop over rows).

:meth:`ItemAttributes.to_tensors` / :meth:`~ItemAttributes.from_tensors` give named tensors and
JSON metadata, the two halves of a model file (:mod:`gru4rec.formats.checkpoint`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gru4rec.data.items import ItemMap
from gru4rec.errors import DataError
from gru4rec.items.table import ItemTable, TableColumn

if TYPE_CHECKING:
    import torch

__all__ = ["UNKNOWN", "AttributeEncoding", "CategoricalEncoding", "ItemAttributes", "NumericEncoding"]

#: The code of the unknown value in every categorical column.
UNKNOWN = 0
_FORMAT = 1  # version of the metadata layout written by to_tensors


@dataclass(frozen=True, eq=False)
class CategoricalEncoding:
    """A categorical column's vocabulary: value ``vocabulary[c - 1]`` has code c, 0 is unknown."""

    name: str
    multi: bool
    vocabulary: pd.Index
    min_count: int

    @property
    def n_codes(self) -> int:
        """The rows an embedding table of this column needs: the vocabulary plus the unknown."""
        return len(self.vocabulary) + 1

    def codes_of(self, values: np.ndarray) -> np.ndarray:
        """The codes (int64) of values; 0 for a value outside the vocabulary. Where one side is
        numbers and the other text — a column of integer codes read as text because one value
        in a later table is not a number (``28`` beside ``shoes``), or the reverse — values are
        matched by their text, so ``"28"`` is the vocabulary's 28 rather than an unknown value."""
        vocabulary, values = self.vocabulary, np.asarray(values)
        if _is_text(vocabulary.dtype) != _is_text(values.dtype):
            vocabulary, values = pd.Index(vocabulary.astype(str)), values.astype(str)
        return np.asarray(vocabulary.get_indexer(values), dtype=np.int64) + 1


def _is_text(dtype: np.dtype[Any] | pd.api.extensions.ExtensionDtype) -> bool:
    """Whether values of ``dtype`` are text (strings or Python objects), not numbers."""
    return not (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype))


@dataclass(frozen=True)
class NumericEncoding:
    """A numeric column's standardisation: ``(x - mean) / std``, missing -> 0."""

    name: str
    mean: float
    std: float


def _segments(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gather the flat segments ``rows`` of a flat column: (positions in the flat arrays, new offsets)."""
    lengths = offsets[1:][rows] - offsets[:-1][rows]
    new = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    pos = np.repeat(offsets[:-1][rows] - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
    return pos, new


@dataclass(frozen=True, eq=False)
class AttributeEncoding:
    """The transform from a table to codes and numbers, fitted on the training items
    (:meth:`fit`) and applied to any items (:meth:`encode`). Columns keep the table's order
    within each group (categoricals, numerics)."""

    item_key: str
    categorical: tuple[CategoricalEncoding, ...]
    numeric: tuple[NumericEncoding, ...]

    @classmethod
    def fit(cls, table: ItemTable, train_items: ItemMap, *, min_count: int = 1) -> AttributeEncoding:
        """Vocabularies and statistics from the rows of ``table`` whose ids are in ``train_items``.
        ``min_count`` (>= 1): the number of training items a value needs to enter its vocabulary
        (in a ``multi`` column each of an item's values counts once per occurrence)."""
        if not isinstance(min_count, (int, np.integer)) or isinstance(min_count, bool) or min_count < 1:
            raise DataError(f"{table.source}: min_count={min_count!r} is invalid; need an int >= 1")
        rows = np.flatnonzero(train_items.index_of(table.ids) >= 0)
        cats: list[CategoricalEncoding] = []
        nums: list[NumericEncoding] = []
        for col in table.columns:
            if col.kind == "numeric":
                v = col.values[rows]
                v = v[~np.isnan(v)]
                mean = float(v.mean()) if len(v) else 0.0
                std = float(v.std()) if len(v) else 1.0
                nums.append(NumericEncoding(col.name, mean, std if std > 0 else 1.0))
            else:
                cats.append(CategoricalEncoding(col.name, col.kind == "multi", _vocabulary(col, rows, int(min_count)),
                                                int(min_count)))
        return cls(table.item_key, tuple(cats), tuple(nums))

    def grown(self, table: ItemTable, train_items: ItemMap) -> AttributeEncoding:
        """This encoding with today's values added (a warm start, yesterday's model plus today's
        ``table``): each vocabulary keeps its values and codes, the values of ``table`` it lacks
        that reach its ``min_count`` on ``train_items`` get the next codes (most frequent first,
        as :meth:`fit` orders them). The numeric statistics stay: the learned projection reads
        numbers standardised as in training. DataError naming the table when it lacks a column
        of the encoding or has it as another kind (:meth:`encode`'s check)."""
        by_name = self._columns_of(table)
        rows = np.flatnonzero(train_items.index_of(table.ids) >= 0)
        cats = []
        for enc in self.categorical:
            today = _vocabulary(by_name[enc.name], rows, enc.min_count)
            added = today[enc.codes_of(today.to_numpy()) == UNKNOWN]  # matched as codes_of matches (text or number)
            vocabulary = enc.vocabulary.append(added) if len(added) else enc.vocabulary
            cats.append(CategoricalEncoding(enc.name, enc.multi, vocabulary, enc.min_count))
        return AttributeEncoding(self.item_key, tuple(cats), self.numeric)

    @property
    def column_names(self) -> list[str]:
        """The encoded columns' names: the categorical ones, then the numeric ones."""
        return [e.name for e in self.categorical] + [e.name for e in self.numeric]

    def ignored_columns(self, table: ItemTable) -> list[str]:
        """The columns of ``table`` this encoding has none of (encoding ignores them)."""
        known = set(self.column_names)
        return [c.name for c in table.columns if c.name not in known]

    def _columns_of(self, table: ItemTable) -> dict[str, TableColumn]:
        """The columns of ``table`` by name; DataError when one of this encoding's is missing
        or of another kind."""
        by_name = {c.name: c for c in table.columns}
        for enc, kind in [(e, "multi" if e.multi else "categorical") for e in self.categorical] + [
                (e, "numeric") for e in self.numeric]:
            col = by_name.get(enc.name)
            if col is None:
                raise DataError(f"{table.source}: missing attribute column {enc.name!r} (the model's columns: "
                                f"{self.column_names})")
            if col.kind != kind:
                raise DataError(f"{table.source}: column {enc.name!r} is {col.kind} here but {kind} in the model; "
                                f"say so: --item-types {enc.name}={kind} (Python: types={{{enc.name!r}: {kind!r}}})")
        return by_name

    def encode(self, table: ItemTable, item_ids: ItemMap) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
        """Encode the items of ``item_ids`` (in its order) from ``table``: ``(categorical, numeric,
        has_row)`` with ``categorical[c] = (codes int64, offsets int64 [n + 1])`` per categorical
        column, ``numeric`` float32 [n × numeric columns], ``has_row`` bool [n]. DataError naming
        the table when a column of the encoding is missing from it or of another kind."""
        by_name = self._columns_of(table)
        row_of = np.asarray(table.ids.get_indexer(item_ids.ids), dtype=np.int64)
        has_row = row_of >= 0
        # Items without a row read from one extra virtual row: one unknown code, NaN numbers.
        virtual = np.where(has_row, row_of, len(table))
        categorical = []
        for enc in self.categorical:
            col = by_name[enc.name]
            assert col.offsets is not None
            codes = np.append(enc.codes_of(col.values), UNKNOWN)
            offsets = np.append(col.offsets, col.offsets[-1] + 1)
            pos, new_offsets = _segments(offsets, virtual)
            categorical.append((codes[pos], new_offsets))
        numeric = np.zeros((len(item_ids), len(self.numeric)), dtype=np.float32)
        for j, num in enumerate(self.numeric):
            x = np.append(by_name[num.name].values, np.nan)[virtual]
            numeric[:, j] = np.nan_to_num((x - num.mean) / num.std, nan=0.0)
        return categorical, numeric, has_row

    def to_json(self) -> dict[str, Any]:
        """The encoding as plain JSON values (vocabularies as lists of ints/strings)."""
        return {
            "item_key": self.item_key,
            "categorical": [{"name": e.name, "multi": e.multi, "min_count": e.min_count,
                             "vocabulary": e.vocabulary.tolist()} for e in self.categorical],
            "numeric": [{"name": e.name, "mean": e.mean, "std": e.std} for e in self.numeric],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AttributeEncoding:
        """The inverse of :meth:`to_json`."""
        return cls(
            str(d["item_key"]),
            tuple(CategoricalEncoding(str(e["name"]), bool(e["multi"]), pd.Index(e["vocabulary"]), int(e["min_count"]))
                  for e in d["categorical"]),
            tuple(NumericEncoding(str(e["name"]), float(e["mean"]), float(e["std"])) for e in d["numeric"]),
        )


def _vocabulary(col: TableColumn, rows: np.ndarray, min_count: int) -> pd.Index:
    assert col.offsets is not None
    pos, _ = _segments(col.offsets, rows)
    codes, uniques = pd.factorize(col.values[pos])  # codes in order of first appearance
    counts = np.bincount(codes, minlength=len(uniques))
    order = np.lexsort((np.arange(len(uniques)), -counts))  # most frequent first, ties by first appearance
    order = order[counts[order] >= min_count]
    return pd.Index(np.asarray(uniques)[order])


@dataclass(frozen=True, eq=False)
class ItemAttributes:
    """The encoded attributes of a model's items: the ``n_warm`` items of its item map, then
    the cold items (see the module docstring). Build with :meth:`build`."""

    encoding: AttributeEncoding
    item_map: ItemMap
    n_warm: int
    codes: tuple[np.ndarray, ...]
    offsets: tuple[np.ndarray, ...]
    numeric: np.ndarray
    has_row: np.ndarray

    @classmethod
    def build(cls, table: ItemTable, item_map: ItemMap, *, min_count: int = 1) -> ItemAttributes:
        """Fit the encoding on ``item_map``'s items (the training items) and encode them and the
        table's cold items. DataError when the table's ids and the map's are of different types
        (ints and strings: no item would match)."""
        _check_id_types(table, item_map)
        encoding = AttributeEncoding.fit(table, item_map, min_count=min_count)
        cold = table.ids[item_map.index_of(table.ids) < 0]
        return cls._encoded(encoding, table, item_map, cold)

    @classmethod
    def _encoded(cls, encoding: AttributeEncoding, table: ItemTable, item_map: ItemMap, cold: pd.Index) -> ItemAttributes:
        everything = ItemMap(pd.Index(np.concatenate([item_map.ids, cold.to_numpy()])) if len(cold) else
                             pd.Index(item_map.ids))
        cats, numeric, has_row = encoding.encode(table, everything)
        return cls(encoding, everything, len(item_map), tuple(c for c, _ in cats), tuple(o for _, o in cats),
                   numeric, has_row)

    def warm_start(self, table: ItemTable, item_map: ItemMap) -> ItemAttributes:
        """The attributes of a warm start from the model these belong to: ``item_map`` is the
        grown map (this model's training items first, in their order), ``table`` today's
        attribute table. The encoding grows with today's values (:meth:`AttributeEncoding.grown`:
        old codes keep their meaning), every item is encoded from today's table (an item without
        a row there gets the unknown values), and the table's ids outside ``item_map`` are the
        cold items. DataError when ``item_map`` does not start with this model's training items."""
        _check_id_types(table, item_map)
        old = self.item_map.ids[: self.n_warm]
        if len(item_map) < self.n_warm or not np.array_equal(np.asarray(item_map.ids[: self.n_warm]), np.asarray(old)):
            raise DataError(f"{table.source}: a warm start's item map must start with the model's {self.n_warm} "
                            "training items, in their order")
        encoding = self.encoding.grown(table, item_map)
        cold = table.ids[item_map.index_of(table.ids) < 0]
        return ItemAttributes._encoded(encoding, table, item_map, cold)

    def add_items(self, table: ItemTable) -> ItemAttributes:
        """These attributes plus the ids of ``table`` that are not items yet, as new cold items
        encoded with this encoding (vocabularies and statistics unchanged); the existing items
        keep their rows. The way a new item becomes recommendable without retraining."""
        _check_id_types(table, self.item_map)
        new = table.ids[self.item_map.index_of(table.ids) < 0]
        cats, numeric, has_row = self.encoding.encode(table, ItemMap(new))
        codes = tuple(np.concatenate([old, c]) for old, (c, _) in zip(self.codes, cats, strict=True))
        offsets = tuple(np.concatenate([old, o[1:] + old[-1]]) for old, (_, o) in zip(self.offsets, cats, strict=True))
        return ItemAttributes(self.encoding, ItemMap(pd.Index(np.concatenate([self.item_map.ids, new.to_numpy()]))),
                              self.n_warm, codes, offsets, np.concatenate([self.numeric, numeric]),
                              np.concatenate([self.has_row, has_row]))

    @property
    def n_items(self) -> int:
        """Warm and cold items together."""
        return len(self.item_map)

    @property
    def n_cold(self) -> int:
        """Items with a row that no training event has."""
        return self.n_items - self.n_warm

    def counts(self) -> dict[str, int]:
        """``known``: training items with a row; ``unknown``: training items without; ``cold``."""
        known = int(self.has_row[: self.n_warm].sum())
        return {"known": known, "unknown": self.n_warm - known, "cold": self.n_cold}

    def to_tensors(self, prefix: str = "items.") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Named CPU tensors (``{prefix}cat{c}.codes``, ``{prefix}cat{c}.offsets`` for a multi
        column, ``{prefix}numeric``, ``{prefix}has_row`` as uint8) and the JSON metadata
        (the encoding, ``n_warm``, the cold ids); the warm ids are the model's own item ids."""
        import torch

        tensors: dict[str, torch.Tensor] = {}
        for c, enc in enumerate(self.encoding.categorical):
            tensors[f"{prefix}cat{c}.codes"] = torch.from_numpy(np.ascontiguousarray(self.codes[c]))
            if enc.multi:  # one code per item otherwise: the offsets are 0..n
                tensors[f"{prefix}cat{c}.offsets"] = torch.from_numpy(np.ascontiguousarray(self.offsets[c]))
        tensors[f"{prefix}numeric"] = torch.from_numpy(np.ascontiguousarray(self.numeric))
        tensors[f"{prefix}has_row"] = torch.from_numpy(self.has_row.astype(np.uint8))
        meta = {"format": _FORMAT, "encoding": self.encoding.to_json(), "n_warm": self.n_warm,
                "cold_item_ids": self.item_map.to_list()[self.n_warm:]}
        return tensors, meta

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], item_map: ItemMap,
                     prefix: str = "items.") -> ItemAttributes:
        """The inverse of :meth:`to_tensors`, given the model's (warm) item map. DataError when the
        parts do not fit together (a missing tensor, another number of items, another format)."""
        if meta.get("format") != _FORMAT:
            raise DataError(f"item attributes: metadata format {meta.get('format')!r}, expected {_FORMAT}")
        if int(meta["n_warm"]) != len(item_map):
            raise DataError(f"item attributes: made for {meta['n_warm']} items, the item map has {len(item_map)}")
        encoding = AttributeEncoding.from_json(meta["encoding"])
        everything = ItemMap(pd.Index(item_map.to_list() + list(meta["cold_item_ids"])))
        n = len(everything)

        def get(name: str) -> np.ndarray:
            if prefix + name not in tensors:
                raise DataError(f"item attributes: tensor {prefix + name!r} is missing")
            return tensors[prefix + name].numpy()

        codes, offsets = [], []
        for c, enc in enumerate(encoding.categorical):
            codes.append(get(f"cat{c}.codes"))
            offsets.append(get(f"cat{c}.offsets") if enc.multi else np.arange(n + 1, dtype=np.int64))
        numeric, has_row = get("numeric"), get("has_row").astype(bool)
        if numeric.shape != (n, len(encoding.numeric)) or has_row.shape != (n,) or any(
                len(o) != n + 1 or int(o[-1]) != len(cd) for o, cd in zip(offsets, codes, strict=True)):
            raise DataError(f"item attributes: tensors of other sizes than the {n} items of the metadata")
        return cls(encoding, everything, len(item_map), tuple(codes), tuple(offsets), numeric, has_row)


def _check_id_types(table: ItemTable, item_map: ItemMap) -> None:
    def kind(ids: np.ndarray) -> str:
        return "integer" if np.issubdtype(ids.dtype, np.integer) else "string"

    ids = table.ids.to_numpy()
    if len(ids) and len(item_map) and kind(ids) != kind(item_map.ids):
        raise DataError(f"{table.source}: column {table.item_key!r} holds {kind(ids)} ids but the training items are "
                        f"{kind(item_map.ids)} ids; no item would match")
