"""``gru4rec items add MODEL NEW_ITEMS -o MODEL2``: a copy of a model trained with item attributes
whose catalogue also holds the items of an attribute table, as cold items encoded with the
model's saved encoding (:meth:`~gru4rec.items.attributes.ItemAttributes.add_items`), so that a
new item becomes recommendable without retraining; a server running with ``--watch`` (or sent
SIGHUP) swaps MODEL2 in. See docs/attributes.md."""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from gru4rec.cli.common import (
    EXIT_OK,
    FORCE_FLAG,
    ColumnFlags,
    add_flags,
    check_readable,
    check_writable_target,
    column_flags,
    flag,
    flag_field,
)

__all__ = ["ACTIONS", "DESCRIPTION", "FLAGS", "ItemsSettings", "NO_ATTRIBUTES", "add_arguments", "run"]

log = logging.getLogger(__name__)

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
    from gru4rec.data import ColumnKeys
    from gru4rec.errors import DataError
    from gru4rec.items.table import read_item_table
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
    item_key = args.item_key or ColumnKeys.resolve(model.config).item_key
    encoding = rows.source.encoding
    kinds = {e.name: "multi" if e.multi else "categorical" for e in encoding.categorical}
    kinds.update({e.name: "numeric" for e in encoding.numeric})
    table = read_item_table(args.new_items, item_key=item_key)
    missing = [name for name in kinds if name not in table.kinds]
    if missing:
        raise DataError(f"{args.new_items}: missing the model's attribute column(s) {missing} "
                        f"(the model's columns: {list(kinds)})")
    # A column read as another kind than the model's (a numeric-looking code): read it as trained.
    differ = {name: kind for name, kind in kinds.items() if table.kinds[name] != kind}
    if differ:
        table = read_item_table(args.new_items, item_key=item_key, types=differ)
    grown = rows.source.add_items(table)
    n_new = grown.n_items - rows.n_items
    n_known = len(table) - n_new
    if n_new == 0:
        raise DataError(f"{args.new_items}: none of its {len(table)} item(s) is new to {args.model}: nothing to add")
    if n_known:
        log.warning("%s: %d item id(s) the model already has skipped (their rows are the model's)", args.new_items, n_known)
    net.attributes = rows.with_attributes(grown)
    model.save(args.output, overwrite=args.force, optimizer=model.optimizer_state is not None)
    log.info("Wrote %s: %d item(s) added as cold items (%d warm, %d cold in all)",
             args.output, n_new, grown.n_warm, grown.n_cold)
    return EXIT_OK
