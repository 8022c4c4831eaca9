"""What an item is: its id row plus its attributes, built the same way for training, evaluation,
inference, serving and export (docs/attributes.md).

Today this room holds the data side: the attribute table as read (:mod:`~gru4rec.items.table`),
its encoding aligned to a model's items with the cold items after them
(:mod:`~gru4rec.items.attributes`), and the click context from the time column
(:mod:`~gru4rec.items.context`). Training with attributes is not there yet.
"""
from __future__ import annotations

from gru4rec.items.attributes import UNKNOWN, AttributeEncoding, ItemAttributes
from gru4rec.items.context import CONTEXT_FEATURES, click_context, context_of
from gru4rec.items.table import KINDS, HighCardinalityWarning, ItemTable, item_table_from_frame, read_item_table

__all__ = ["CONTEXT_FEATURES", "KINDS", "UNKNOWN", "AttributeEncoding", "HighCardinalityWarning", "ItemAttributes",
           "ItemTable", "click_context", "context_of", "item_table_from_frame", "read_item_table"]
