"""What a model offers to be run on sessions — the :class:`SessionModel` protocol — and the one
check that it is fitted.

A session model turns the items a session clicked, oldest first, into scores of every item for
its next click, one step per click. :class:`gru4rec.GRU4Rec` and every baseline of
:mod:`gru4rec.baselines` implement it; the inference engine (:mod:`gru4rec.inference.engine`)
and the evaluator (:func:`gru4rec.evaluate`) accept any model that does, and ask nothing else
of it. The contract, checked for every model by ``tests/test_session_model_contract.py``:

* ``init_state(B)`` is the state of B fresh sessions: a list of B×W_i tensors on ``device``;
* ``step(items, state)`` advances every row of ``state`` *in place* by one item (a B int64
  tensor of item indices) and returns ``state[-1]``, the row's *output*. It must work on
  row-range views (``[s[lo:hi] for s in state]``, e.g. the prefixes ``[s[:A] for s in state]``):
  rows outside are not touched, and a row's new state depends on its own state and item only
  (the evaluator may step row ranges side by side). It never trains
  (no dropout, no autograd graph), whatever mode the model was in;
* ``scores(out, buffer=None)`` are the raw scores of every item (B×N, item-map order), written
  into ``buffer`` when given; higher is better. Row b depends on row b of ``out`` only (the
  evaluator may score row ranges side by side). The result is the caller's to modify (a new
  tensor or ``buffer``, never a view of the model's own tables: exclusions are written into it);
* ``output_layer()`` is ``(Wy, By)`` when ``scores(out)`` is ``out·Wyᵀ + By`` (the exports and
  the int8 candidate scoring need it), else None;
* ``item_map`` (id ↔ index), ``item_support`` (training events per item: the popularity that
  orders the fallback list), ``device`` and ``config`` (its ``session_key``, ``item_key``,
  ``time_key`` columns) describe the fitted model; ``fitted`` says whether it is.

A model may also rank more items than it was trained on — a model with item attributes
(docs/attributes.md) scores the cold items of its attribute table after its training items:
its ``catalogue`` (an :class:`~gru4rec.data.ItemMap` whose first items are ``item_map``'s, in
order) then names the columns of ``scores``, which are B × ``len(catalogue)``, and ``step``
accepts any catalogue index. A model without it ranks ``item_map`` (:func:`catalogue_of`).

A model may also take each click's **context** (docs/attributes.md, "Click context"): its
``click_context`` is then True and its ``step(items, state, context=...)`` needs the clicks'
context (B×5, :mod:`gru4rec.items.context`); the evaluator and the engine compute it from the
clicks' times and hand it over (:func:`uses_context`). A model without it is stepped as always.

A model may also say which repeat boost its scores get before they are ranked
(:class:`gru4rec.inference.repeat.RepeatAware`: ``repeat_boost``); a model without it gets none.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from gru4rec.data import ItemMap
from gru4rec.errors import Gru4RecError, NotFittedError

__all__ = ["SessionModel", "advance", "catalogue_of", "catalogue_support", "check_session_model", "require_fitted",
           "uses_context"]


@runtime_checkable
class SessionModel(Protocol):
    """A fitted model that scores every item after each click of a session (see the module)."""

    config: Any
    device: torch.device
    item_map: ItemMap | None
    item_support: np.ndarray | None

    @property
    def fitted(self) -> bool: ...

    def init_state(self, batch_size: int) -> list[Tensor]: ...

    def step(self, items: Tensor, state: list[Tensor]) -> Tensor: ...

    def scores(self, out: Tensor, buffer: Tensor | None = None) -> Tensor: ...

    def output_layer(self) -> tuple[Tensor, Tensor] | None: ...


def check_session_model(model: Any, purpose: str) -> SessionModel:
    """``model`` itself when it implements :class:`SessionModel`, else one error naming what it
    lacks (``purpose``: who asks, e.g. ``"evaluate"``)."""
    if isinstance(model, SessionModel):
        return model
    wanted = ("config", "device", "item_map", "item_support", "fitted", "init_state", "step", "scores", "output_layer")
    missing = [name for name in wanted if not hasattr(type(model), name) and not hasattr(model, name)]
    raise Gru4RecError(f"{purpose}: a {type(model).__name__} is not a session model (it lacks {', '.join(missing)}); "
                       "pass a GRU4Rec or a baseline from gru4rec.baselines")


def require_fitted(model: SessionModel, how: str = "call fit()") -> tuple[ItemMap, np.ndarray]:
    """The item map and item supports of a fitted model; :class:`~gru4rec.errors.NotFittedError`
    otherwise, ending with ``how`` (what makes this model fitted; a model's own methods say more
    than ``fit()`` where they can) — the one "is it fitted?" check of the package."""
    if not model.fitted or model.item_map is None or model.item_support is None:
        raise NotFittedError(f"the {type(model).__name__} model is not fitted (not trained yet): {how}")
    return model.item_map, model.item_support


def catalogue_of(model: SessionModel) -> ItemMap:
    """The items ``model``'s scores rank, by column: its ``catalogue`` where it has one (the
    training items, then the cold items of a model with attributes), else its ``item_map``.
    :class:`~gru4rec.errors.NotFittedError` for a model that is not fitted."""
    item_map, _ = require_fitted(model)
    catalogue = getattr(model, "catalogue", None)
    if catalogue is None:
        return item_map
    if len(catalogue) < len(item_map):
        raise Gru4RecError(f"a {type(model).__name__}'s catalogue has {len(catalogue)} items, fewer than its "
                           f"{len(item_map)} training items")
    return catalogue


def catalogue_support(model: SessionModel) -> np.ndarray:
    """``item_support`` over :func:`catalogue_of`: a cold item has no training event (0). A
    model without cold items gets its ``item_support`` as it is (its shape checked by the caller)."""
    item_map, support = require_fitted(model)
    n_cold = len(catalogue_of(model)) - len(item_map)
    support = np.asarray(support)
    if n_cold == 0:
        return support
    return np.concatenate([support, np.zeros(n_cold, dtype=support.dtype)])


def uses_context(model: SessionModel) -> bool:
    """Whether ``model``'s steps take the clicks' context (its ``click_context``; False for a
    model without that attribute)."""
    return bool(getattr(model, "click_context", False))


def advance(model: SessionModel, items: Tensor, state: list[Tensor], context: Tensor | None = None) -> Tensor:
    """``model.step(items, state)``, with the clicks' ``context`` (B×5) for a model with click
    context (the protocol's step takes none: a plain model is called without it)."""
    if context is None:
        return model.step(items, state)
    return model.step(items, state, context=context)  # type: ignore[call-arg]  # uses_context(model)
