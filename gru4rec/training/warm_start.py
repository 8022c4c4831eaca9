"""Warm start: continue a trained model on new data (daily retraining, docs/retraining.md).

``GRU4Rec.fit(data, init_from=model)`` starts from ``model``'s weights instead of a fresh
initialisation. What carries over and what does not:

* **Items.** The item map grows: every item of the old model keeps its index (and its rows),
  items it has not seen are appended in order of first appearance in the new data. The new rows
  are drawn exactly as :class:`~gru4rec.network.gru.GRU4RecNet` draws the rows of a table of the new
  size (same seed, same per-block scale), so a warm start with no new item differs from a fresh
  model only in the rows it carries. Items absent from the new data keep their rows.
* **Configuration.** The model's config is the default (:func:`inherit_config`): a field the new
  config was not given (:attr:`Config.given`) is the model's, so the daily run states only what
  changes (``n_epochs=1``). The fields that define the network (:data:`NETWORK_FIELDS`, the
  ``network`` group of :mod:`gru4rec.config`) cannot change: a given one that differs is one
  :class:`~gru4rec.errors.ConfigError` naming the fields. Everything else (learning rate,
  epochs, loss, n_sample, ...) may change.
* **Optimiser state.** A model file holds no optimiser state unless it was saved with it
  (``save(path, optimizer=True)``, ``gru4rec train --save-optimizer``). When the old model has
  it and the method (``adapt``) is the same, every state table the new optimiser keeps is
  carried — the old items' rows, the dense parameters' state and Adam's step count — and the
  new items' rows start at zero; otherwise the state starts fresh, said in one log line.
  The state is copied into the optimiser's own tables (:meth:`Optimizer.load_state_dict`), so
  this works with every training backend.
* **Item attributes** (issue 49). A model trained with them needs today's attribute table:
  :meth:`ItemAttributes.warm_start` grows each vocabulary with today's values (old codes keep
  their values, new ones get the next codes; the numeric statistics stay, for the projection)
  and encodes every item from today's table; :func:`warm_net` keeps the attribute tables' rows
  of the old codes and the projection, and draws the new values' rows as a fresh network draws
  them; :func:`carry_optimizer_state` carries their state at the old codes. Without a table
  such a model is refused, as are attributes for a model trained without them.
* **Popularity.** The item supports (negative sampling, logQ, the popularity fallback) are the
  new data's: an item absent from it has support 0.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gru4rec.config import NETWORK_FIELDS, Config
from gru4rec.data import ItemMap
from gru4rec.errors import ConfigError, Gru4RecError
from gru4rec.items.attributes import ItemAttributes
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.optim import Optimizer

__all__ = ["NETWORK_FIELDS", "check_same_network", "inherit_config", "grow_item_map", "warm_net", "carry_optimizer_state"]

log = logging.getLogger(__name__)

def _network_differences(old: Config, new: Config) -> list[str]:
    """``'name: old in the model, new now'`` for each field of :data:`NETWORK_FIELDS` in which the
    networks differ. The width ``embedding`` is compared only when neither shares its output
    matrix as the embedding (``constrained_embedding``): a shared network has no width of its own."""
    show = lambda v: "/".join(map(str, v)) if isinstance(v, tuple) else str(v)  # noqa: E731  # as in a parameter string
    changed = []
    for name in NETWORK_FIELDS:
        if name == "embedding" and (old.constrained_embedding or new.constrained_embedding):
            continue
        theirs, ours = getattr(old, name), getattr(new, name)
        if theirs != ours:
            changed.append(f"{name}: {show(theirs)} in the model, {show(ours)} now")
    return changed


def check_same_network(old: Config, new: Config, source: str) -> None:
    """Raise :class:`ConfigError` naming every network field in which ``new`` differs from the
    config of the model in ``source`` (a file name or a description, for the message)."""
    changed = _network_differences(old, new)
    if changed:
        raise ConfigError(f"cannot warm-start from {source}: the network differs ({'; '.join(changed)}); "
                          "only training parameters may change")


def inherit_config(old: Config, new: Config, source: str) -> Config:
    """The config a warm start from the model in ``source`` (config ``old``) trains with: the
    fields given in ``new`` (:attr:`Config.given`), every other field the model's — so a daily
    ``-ps n_epochs=1`` needs no network field. A given network field that differs from the
    model's is a :class:`ConfigError` (:func:`check_same_network`). ``final_act`` follows a given
    ``loss`` when it is not given itself, as it does in a fresh config."""
    changes = {name: getattr(new, name) for name in new.given}
    if "loss" in new.given and "final_act" not in new.given:
        changes["final_act"] = new.final_act  # the new loss's default, as without a warm start
    config = old.replace(**changes)
    check_same_network(old, config, source)
    return config


def grow_item_map(old: ItemMap, ids: pd.Series | np.ndarray) -> ItemMap:
    """``old`` with the ids of ``ids`` it does not hold appended, in order of first appearance."""
    seen = pd.Index(ids).unique()
    new = seen[old.index_of(seen) < 0]
    if not len(new):
        return old
    return ItemMap.from_list(old.to_list() + new.tolist())


@torch.no_grad()
def warm_net(old: GRU4RecNet, n_items: int, config: Config, *, generator: torch.Generator | None = None,
             attributes: ItemAttributes | None = None) -> GRU4RecNet:
    """A network of ``n_items`` items (≥ the old one's) holding ``old``'s weights: the dense
    parameters and the first ``old.n_items`` rows of every item table; the other rows as a
    fresh ``GRU4RecNet(n_items, config, generator=generator, attributes=attributes)`` draws
    them. On the CPU (``old`` may be anywhere and is not changed).

    A model trained with item attributes needs ``attributes``: today's, grown from its own
    (:meth:`ItemAttributes.warm_start`); its attribute tables keep their rows (the old codes)
    and the projection is carried whole, the new values' rows are drawn as the fresh network
    draws them. Without ``attributes`` such a model is refused: carrying its id rows alone
    would silently change every item's row."""
    if n_items < old.n_items:
        raise ValueError(f"a warm start cannot drop items ({n_items} < {old.n_items})")
    if old.attributes is not None and attributes is None:
        raise Gru4RecError("init_from: the model was trained with item attributes; a warm start from it needs "
                           "item_features (today's attribute table) so that its items keep their rows")
    if attributes is not None:
        if old.attributes is None:
            raise Gru4RecError("item_features: the init_from model was trained without item attributes; "
                               "attributes cannot be added to it by a warm start (train from scratch)")
        ours_enc, theirs_enc = attributes.encoding, old.attributes.source.encoding
        if [(e.name, e.multi) for e in ours_enc.categorical] != [(e.name, e.multi) for e in theirs_enc.categorical] \
                or [e.name for e in ours_enc.numeric] != [e.name for e in theirs_enc.numeric]:
            raise Gru4RecError("item_features: the attribute columns differ from the init_from model's "
                               "(build today's attributes with ItemAttributes.warm_start)")
    net = GRU4RecNet(n_items, config, generator=generator, attributes=attributes)
    tables = set(old.sparse_parameters())
    code_indexed = {id(t) for rows in old.compositions().values() for t in rows.tables}
    ours = dict(net.named_parameters())
    for name, p in old.named_parameters():
        if id(p) in code_indexed:  # an attribute table: the old codes' rows
            ours[name][: p.shape[0]].copy_(p)
        elif name in tables:
            ours[name][: old.n_items].copy_(p)
        else:
            ours[name].copy_(p)
    return net


def carry_optimizer_state(
    optimizer: Optimizer,
    state: Mapping[str, Tensor] | None,
    old_config: Config,
    n_old_items: int,
    source: str,
) -> bool:
    """Copy a saved optimiser ``state`` (``Optimizer.state_dict()`` of the old model's training,
    or None) into ``optimizer``: item tables at their first ``n_old_items`` rows (the new items'
    rows stay zero), the dense state and the step count whole. Returns whether it was carried;
    when not (no state, another method), the state stays fresh and one INFO line says why."""
    if state is None:
        log.info("Warm start from %s: the file holds no optimiser state; the optimiser starts fresh "
                 "(save with --save-optimizer to carry it)", source)
        return False
    if old_config.adapt != optimizer.method:
        log.info("Warm start from %s: the optimiser changed (%s -> %s); its state starts fresh", source, old_config.adapt, optimizer.method)
        return False
    target = optimizer.state_dict()  # views into the optimiser's own tables
    tables = set(optimizer.sparse)
    fresh = sorted(key for key in target if key not in state)
    with torch.no_grad():
        for key, value in target.items():
            saved = state.get(key)
            if saved is None:
                continue
            saved = saved.to(device=value.device, dtype=value.dtype)
            if key.startswith(("attributes.", "input_attributes.")):  # an attribute table's state: the old codes' rows (a grown vocabulary)
                if saved.dim() and key.rsplit(".", 1)[0] in tables:
                    value[: saved.shape[0]].copy_(saved)
                else:
                    value.copy_(saved)
            elif key.rsplit(".", 1)[0] in tables:
                value[:n_old_items].copy_(saved[:n_old_items])
            else:
                value.copy_(saved)
    if fresh:  # e.g. momentum switched on: its velocities start at zero
        log.info("Warm start from %s: optimiser state carried, except %s (not in the file: zero)", source, ", ".join(fresh))
    else:
        log.info("Warm start from %s: optimiser state carried", source)
    return True
