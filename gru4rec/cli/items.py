"""Item attributes on the command line (docs/attributes.md): the ``--item-features`` flags of
``gru4rec train`` and ``run.py`` (:class:`ItemFeatureFlags`, checked before the first epoch by
:func:`item_feature_options`), and ``gru4rec items add MODEL NEW_ITEMS -o MODEL2``: a copy of a model trained with item attributes
whose catalogue also holds the items of an attribute table, as cold items encoded with the
model's saved encoding (:meth:`~gru4rec.items.attributes.ItemAttributes.add_items`), so that a
new item becomes recommendable without retraining; a server running with ``--watch`` (or sent
SIGHUP) swaps MODEL2 in. See docs/attributes.md."""
from __future__ import annotations

import argparse
import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gru4rec.cli.common import (
    EXIT_OK,
    FORCE_FLAG,
    ColumnFlags,
    UsageError,
    add_flags,
    check_readable,
    check_writable_target,
    column_flags,
    flag,
    flag_field,
    positive_int,
)

__all__ = ["ACTIONS", "DESCRIPTION", "FLAGS", "ItemFeatureFlags", "ItemsSettings", "NO_ATTRIBUTES", "add_arguments",
           "item_feature_options", "item_types_argument", "parse_types", "run"]

if TYPE_CHECKING:
    import pandas as pd

    from gru4rec.items.attributes import AttributeEncoding
    from gru4rec.items.table import ItemTable

log = logging.getLogger(__name__)

_FEATURES = "item attributes (docs/attributes.md)"


@dataclass(frozen=True, kw_only=True)
class ItemFeatureFlags:
    """``--item-features``, ``--item-min-count``, ``--item-types``: ``fit``'s ``item_features``,
    ``attribute_min_count`` and ``attribute_types``, a field per flag (train and run.py)."""

    item_features: str | None = flag("--item-features", metavar="FILE", group=_FEATURES, default=None,
                                     help="item attribute table (TSV/CSV/Parquet, keyed by the item column): each "
                                          "item's row is its id row plus its attributes' embeddings, and the table's "
                                          "items without training events are recommended as cold items")
    item_min_count: int = flag("--item-min-count", metavar="N", type=positive_int, group=_FEATURES, default=1,
                               help="with --item-features: keep an attribute value seen on at least N training items "
                                    "(default: 1)")
    item_types: str | None = flag("--item-types", metavar="COL=KIND,...", group=_FEATURES, default=None,
                                  help="with --item-features: override inferred column kinds, e.g. "
                                       "'categoryId=categorical,price=numeric' (kinds: categorical, multi, numeric)")


def parse_types(text: str | None) -> dict[str, str] | None:
    """``'a=categorical,b=numeric'`` as ``{'a': 'categorical', 'b': 'numeric'}`` (None: none given);
    UsageError naming the bad part or kind."""
    from gru4rec.items.table import KINDS

    if text is None:
        return None
    types: dict[str, str] = {}
    for part in text.split(","):
        name, sep, kind = (s.strip() for s in part.partition("="))
        if not sep or not name or kind not in KINDS:
            raise UsageError(f"--item-types: {part!r} is not COLUMN=KIND with KIND one of {list(KINDS)}")
        types[name] = kind
    return types


def item_types_argument(text: str) -> dict[str, str]:
    """``--item-types`` as an argparse ``type`` (paropt, whose settings hold the parsed kinds):
    :func:`parse_types`, its usage error as argparse's."""
    try:
        return parse_types(text) or {}
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--item-types: ")) from None


def item_feature_options(args: ItemFeatureFlags, item_key: str) -> dict[str, Any]:
    """``fit``'s attribute arguments from the flags, after reading the table once as ``fit``
    will (so that a bad table fails before the first epoch, not after it: a DataError naming
    the file, column or line); ``{}`` without ``--item-features``. ``item_key``: the model's
    item column (the table's id column)."""
    from gru4rec.items.table import read_item_table

    if args.item_features is None:
        given = [f for f, on in (("--item-min-count", args.item_min_count != 1), ("--item-types", args.item_types))
                 if on]
        if given:
            raise UsageError(f"{', '.join(given)} needs --item-features (the attribute table)")
        return {}
    types = parse_types(args.item_types)
    check_readable([args.item_features], "item attribute table")
    read_item_table(args.item_features, item_key=item_key, types=types)
    return {"item_features": args.item_features, "attribute_min_count": args.item_min_count,
            "attribute_types": types}


#: What ``gru4rec items`` does (the first positional argument).
ACTIONS = ("add",)

#: The error for a model trained without attributes (nothing to encode new items with).
NO_ATTRIBUTES = "this model has no item attributes: train it with --item-features"

DESCRIPTION = (
    "items add MODEL NEW_ITEMS -o MODEL2: write a copy of MODEL whose catalogue also holds the\n"
    "items of NEW_ITEMS (an attribute table with the model's columns) as cold items, encoded\n"
    "with the model's saved encoding: no retraining, every existing score unchanged. Ids the\n"
    "model already has are skipped with a warning that counts them; a table with no new id is\n"
    "an error. MODEL must have been trained with --item-features."
)


#: The column flags' help: their default is the model's.
FLAGS = column_flags("the model's")


@dataclass(frozen=True, kw_only=True)
class ItemsSettings(ColumnFlags):
    """The settings of ``gru4rec items``: a field per flag, declared with it (of the column
    flags, only ``-ik`` is read: NEW_ITEMS' id column)."""

    action: str = flag(choices=ACTIONS, help="add: append the new items of NEW_ITEMS as cold items")
    model: str = flag(metavar="MODEL", help="a model file trained with --item-features (train --save)")
    new_items: str = flag(metavar="NEW_ITEMS",
                          help="an item attribute table (TSV/CSV/Parquet) with the model's item id and attribute columns")
    output: str = flag("-o", "--output", metavar="MODEL2", help="where to write the model with the new items")
    force: bool = flag_field(FORCE_FLAG, False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec items`` (:class:`ItemsSettings`)."""
    add_flags(parser, ItemsSettings, FLAGS)


def run(args: ItemsSettings) -> int:
    """Run ``gru4rec items add``: load MODEL on the CPU, encode NEW_ITEMS' new ids with its
    encoding, share the trained attribute tables with them, and write MODEL2 atomically."""
    from gru4rec.errors import DataError
    from gru4rec.items.table import HighCardinalityWarning, read_item_table
    from gru4rec.recommender import GRU4Rec

    # Every input and the output checked before the (possibly long) model load.
    check_writable_target(args.output, args.force, "output model file")
    check_readable([args.model], "model file")
    check_readable([args.new_items], "item attribute table")
    model = GRU4Rec.load(args.model, device="cpu")
    net = model.net
    if net is None or net.attributes is None:
        raise DataError(f"{args.model}: {NO_ATTRIBUTES}")
    rows = net.attributes
    encoding = rows.source.encoding
    item_key = args.item_key or encoding.item_key  # the id column of the table it was trained with
    kinds = {e.name: "multi" if e.multi else "categorical" for e in encoding.categorical}
    kinds.update({e.name: "numeric" for e in encoding.numeric})
    with warnings.catch_warnings():
        # A batch of new items lists about one value each, and their kinds and vocabularies are
        # the model's: the reader's warning about cardinality does not apply.
        warnings.simplefilter("ignore", HighCardinalityWarning)
        # The model's columns read as the model's kinds (a category code is no number, whatever the file's values).
        table = read_item_table(args.new_items, item_key=item_key, types=kinds, required=list(kinds))
    ignored = encoding.ignored_columns(table)
    if ignored:
        log.warning("%s: column(s) %s ignored: the model has no such attribute (its columns: %s)",
                    args.new_items, ignored, list(kinds))
    grown = rows.source.add_items(table)
    _warn_unknown_values(table, encoding, grown.item_map.ids[rows.n_items:], args.new_items)
    n_new = grown.n_items - rows.n_items
    n_known = len(table) - n_new
    if n_new == 0:
        raise DataError(f"{args.new_items}: none of its {len(table)} item(s) is new to {args.model}: nothing to add")
    if n_known:
        log.warning("%s: %d item id(s) the model already has skipped (their rows are the model's)", args.new_items, n_known)
    net.extend_catalogue(grown)
    model.save(args.output, overwrite=args.force, optimizer=model.optimizer_state is not None)
    log.info("Wrote %s: %d item(s) added as cold items (%d warm, %d cold in all)",
             args.output, n_new, grown.n_warm, grown.n_cold)
    return EXIT_OK


def _warn_unknown_values(table: ItemTable, encoding: AttributeEncoding, new_ids: pd.Index, source: str) -> None:
    """One warning per categorical column in which new items list values the model's
    vocabulary does not have (they are encoded as the unknown value: the model learnt nothing
    about them), with how many items and a few of the values."""
    import numpy as np
    import pandas as pd

    from gru4rec.items.attributes import UNKNOWN

    is_new = np.asarray(table.ids.isin(new_ids))
    columns = {c.name: c for c in table.columns}
    for enc in encoding.categorical:
        col = columns[enc.name]
        assert col.offsets is not None  # a categorical column
        owner = np.repeat(np.arange(len(table)), np.diff(col.offsets))
        unknown = (enc.codes_of(col.values) == UNKNOWN) & is_new[owner]
        if unknown.any():
            examples = ", ".join(repr(v) for v in pd.unique(col.values[unknown])[:3])
            log.warning("%s: column %r: %d new item(s) list a value the model does not know (e.g. %s); "
                        "each is encoded as the unknown value", source, enc.name, len(np.unique(owner[unknown])), examples)
