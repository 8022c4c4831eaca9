"""Warm start: continue a trained model on new data (daily retraining, docs/retraining.md).

``GRU4Rec.fit(data, init_from=model)`` starts from ``model``'s weights instead of a fresh
initialisation. What carries over and what does not:

* **Items.** The item map grows: every item of the old model keeps its index (and its rows),
  items it has not seen are appended in order of first appearance in the new data. The new rows
  are drawn exactly as :class:`~gru4rec.model.GRU4RecNet` draws the rows of a table of the new
  size (same seed, same per-block scale), so a warm start with no new item differs from a fresh
  model only in the rows it carries. Items absent from the new data keep their rows.
* **Configuration.** The fields that define the network (:data:`NETWORK_FIELDS`) must be equal;
  a difference is one :class:`~gru4rec.errors.ConfigError` naming the fields. Everything else
  (learning rate, epochs, loss, n_sample, ...) may change.
* **Optimiser state.** A model file holds no optimiser state unless it was saved with it
  (``save(path, optimizer=True)``, ``gru4rec train --save-optimizer``). When the old model has
  it and the method (``adapt``) is the same, every state table the new optimiser keeps is
  carried — the old items' rows, the dense parameters' state and Adam's step count — and the
  new items' rows start at zero; otherwise the state starts fresh, said in one log line.
  The state is copied into the optimiser's own tables (:meth:`Optimizer.load_state_dict`), so
  this works with every training backend.
* **Popularity.** The item supports (negative sampling, logQ, the popularity fallback) are the
  new data's: an item absent from it has support 0.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.errors import ConfigError
from gru4rec.model import GRU4RecNet
from gru4rec.training.optim import Optimizer

__all__ = ["NETWORK_FIELDS", "check_same_network", "grow_item_map", "warm_net", "carry_optimizer_state"]

log = logging.getLogger(__name__)

#: Config values that define the network's shape and function; a warm start keeps them.
#: (``embedding_mode`` is derived from ``constrained_embedding`` and ``embedding``; the width
#: ``embedding`` matters only in separate mode.)
NETWORK_FIELDS: tuple[str, ...] = ("layers", "hidden_act", "embedding_mode", "embedding")


def _network_values(config: Config) -> dict[str, Any]:
    return {
        "layers": tuple(config.layers),
        "hidden_act": config.hidden_act,
        "embedding_mode": config.embedding_mode,
        "embedding": int(config.embedding) if config.embedding_mode == "separate" else None,
    }


def check_same_network(old: Config, new: Config, source: str) -> None:
    """Raise :class:`ConfigError` naming every network field in which ``new`` differs from the
    config of the model in ``source`` (a file name or a description, for the message)."""
    theirs, ours = _network_values(old), _network_values(new)
    show = lambda v: "/".join(map(str, v)) if isinstance(v, tuple) else str(v)  # noqa: E731  # as in a parameter string
    changed = [
        f"{name}: {show(theirs[name])} in the model, {show(ours[name])} now" for name in NETWORK_FIELDS if theirs[name] != ours[name]
    ]
    if changed:
        raise ConfigError(f"cannot warm-start from {source}: the network differs ({'; '.join(changed)}); "
                          "only training parameters may change")


def grow_item_map(old: ItemMap, ids: pd.Series | np.ndarray) -> ItemMap:
    """``old`` with the ids of ``ids`` it does not hold appended, in order of first appearance."""
    seen = pd.Index(ids).unique()
    new = seen[old.index_of(seen) < 0]
    if not len(new):
        return old
    return ItemMap.from_list(old.to_list() + new.tolist())


@torch.no_grad()
def warm_net(old: GRU4RecNet, n_items: int, config: Config, *, generator: torch.Generator | None = None) -> GRU4RecNet:
    """A network of ``n_items`` items (≥ the old one's) holding ``old``'s weights: the dense
    parameters and the first ``old.n_items`` rows of every item table; the other rows as a
    fresh ``GRU4RecNet(n_items, config, generator=generator)`` draws them. On the CPU (``old``
    may be anywhere and is not changed)."""
    if n_items < old.n_items:
        raise ValueError(f"a warm start cannot drop items ({n_items} < {old.n_items})")
    net = GRU4RecNet(n_items, config, generator=generator)
    tables = set(old.sparse_parameters())
    ours = dict(net.named_parameters())
    for name, p in old.named_parameters():
        if name in tables:
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
            if key.rsplit(".", 1)[0] in tables:
                value[:n_old_items].copy_(saved[:n_old_items])
            else:
                value.copy_(saved)
    if fresh:  # e.g. momentum switched on: its velocities start at zero
        log.info("Warm start from %s: optimiser state carried, except %s (not in the file: zero)", source, ", ".join(fresh))
    else:
        log.info("Warm start from %s: optimiser state carried", source)
    return True
