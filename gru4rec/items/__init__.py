"""What an item is: its id row plus its attributes, built the same way for training, evaluation,
inference, serving and export (docs/attributes.md).

Today this room holds the data side: the attribute table as read (:mod:`~gru4rec.items.table`),
its encoding aligned to a model's items with the cold items after them
(:mod:`~gru4rec.items.attributes`), the click context from the time column
(:mod:`~gru4rec.items.context`), and the composed item rows — id row plus attribute embeddings,
with their backward (:mod:`~gru4rec.items.rows`; imported on first use, so that the data side
needs no torch). The network composes its output rows with them (``fit(item_features=...)``,
on the reference step) and scores, recommends and evaluates the cold items with them; the model
file, the exports, the server and paropt carry them (docs/attributes.md).
"""
from __future__ import annotations

from typing import Any

from gru4rec.items.attributes import UNKNOWN, AttributeEncoding, ItemAttributes
from gru4rec.items.context import CONTEXT_FEATURES, click_context, context_of
from gru4rec.items.table import KINDS, HighCardinalityWarning, IntegerCodesWarning, ItemTable, item_table_from_frame, read_item_table

__all__ = ["CONTEXT_FEATURES", "KINDS", "UNKNOWN", "AttributeEncoding", "ComposedRows", "HighCardinalityWarning", "IntegerCodesWarning",
           "ItemAttributes", "ItemTable", "RowGrad", "RowGrads", "click_context", "context_of", "item_table_from_frame", "read_item_table"]

_LAZY = {"ComposedRows", "RowGrad", "RowGrads"}  # gru4rec.items.rows imports torch


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from gru4rec.items import rows

        value = getattr(rows, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
