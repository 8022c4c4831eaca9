"""Item and session vectors for a nearest-neighbour index (FAISS, ScaNN) or a notebook.

GRU4Rec scores item i after a session whose final hidden state is h as ``score_i = h·Wy_i + By_i``
(docs/behaviour.md §2). So the **output vectors** ``Wy`` (one row per item) with the **bias**
``By`` and the **session vectors** h are all a retrieval system needs: an inner-product index
over the rows ``[Wy_i, By_i]`` queried with ``[h, 1]`` returns exactly the model's top-k (or over
``Wy`` alone, queried with h, when the bias is to be left out).

The **input vector** of an item — what layer 0 reads when the item is clicked — depends on the
embedding mode:

* ``shared`` (``constrained_embedding``, the default): it *is* the output vector; no separate column.
* ``separate`` (``embedding=K``): the item's row of the input embedding ``E`` (K wide), a vector
  of its own space, comparable between items but not with output vectors or session states.
* ``none`` (one-hot input): there is no embedding; the item's row of layer 0's input weights
  ``Wx_0`` (3·L_0 wide: the item's contribution to the candidate, reset and update
  pre-activations, in that order) plays its role. It is exported as ``input`` too, but it is
  a projection into gate space rather than an embedding.

A model with **item attributes** (docs/attributes.md) exports its whole catalogue: the training
items, then the cold items of its attribute table, each with the row it is scored with — its id
row plus its attributes' embeddings (a cold item: its attributes alone) — and its bias (the id
bias plus the attributes' bias part; a cold item's: the attributes' alone), so an index built
from the file holds the cold items too and ranks them as the model does. The ``input`` column
then holds every item's composed input row (a cold item's from its attributes alone).
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from gru4rec.data import ColumnKeys, read_events, validate_events
from gru4rec.errors import DataError
from gru4rec.export.common import catalogue_tables, fitted
from gru4rec.inference.protocol import catalogue_of

if TYPE_CHECKING:
    from gru4rec.recommender import GRU4Rec

__all__ = ["INPUT_VECTOR_MEANING", "item_embeddings", "session_embeddings"]

log = logging.getLogger(__name__)

#: What the ``input`` column holds, by embedding mode (None: there is no such column).
INPUT_VECTOR_MEANING: dict[str, str | None] = {
    "shared": None,
    "separate": "the item's row of the separate input embedding E",
    "none": "the item's row of layer 0's input weights Wx_0 (one-hot input: candidate | reset | update blocks)",
}


def _numpy(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())


def item_embeddings(model: GRU4Rec) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The item vectors of ``model`` as columns, in item-index order, and their description.

    Columns: ``item_id`` (the ids as in the training data), ``output`` (N×L float32, the rows of
    ``Wy``), ``bias`` (N float32, ``By``) and, unless the embedding is shared, ``input``
    (see :data:`INPUT_VECTOR_MEANING`). With item attributes the rows are the catalogue's
    (:func:`~gru4rec.export.common.catalogue_tables`): N + C items, the cold ones last, ``output``
    the composed rows and biases, ``input`` the composed input rows (a cold item's from its
    attributes alone). The
    description (JSON-serialisable) says what each column is and how a score is formed;
    :func:`gru4rec.export.write_table` stores it with a Parquet file.
    """
    net, _ = fitted(model)
    catalogue = catalogue_of(model)
    attributes = net.attributes
    tables = catalogue_tables(net)
    columns: dict[str, np.ndarray] = {
        "item_id": np.asarray(catalogue.ids),
        "output": _numpy(tables.output),
        "bias": _numpy(tables.bias),
    }
    meaning = INPUT_VECTOR_MEANING[net.mode]
    if meaning is not None:
        columns["input"] = _numpy(tables.input)
    width = columns["output"].shape[1]
    if attributes is None:
        output = f"the item's output vector: its row of Wy ({width} wide)"
        bias = "the item's output bias: By_i"
        order = "the item id as in the training data (row order = the model's item index)"
        extra: dict[str, Any] = {}
    else:
        n_cold = attributes.n_items - attributes.n_warm
        encoding = attributes.source.encoding
        names = encoding.column_names
        output = (f"the item's output vector: its row of Wy plus its attributes' embeddings ({', '.join(names)}); "
                  f"a cold item's is its attributes' alone ({width} wide)")
        bias = "the item's output bias: By_i plus its attributes' bias part; a cold item's is its attributes' alone"
        order = (f"the item id (row order = the model's item index: the {attributes.n_warm} training items, then "
                 f"the {n_cold} cold items of its attribute table)")
        meaning = None if meaning is None else \
            f"{meaning} plus its attributes' input embeddings; a cold item's from its attributes alone"
        extra = {"n_cold_items": n_cold, "item_attributes": names}
    description = {
        "what": "gru4rec item embeddings",
        "embedding_mode": net.mode,
        "n_items": len(catalogue),
        **extra,
        "score": "score(item i | session state h) = h · output_i + bias_i",
        "columns": {
            "item_id": order,
            "output": output,
            "bias": bias,
            **({"input": f"{meaning} ({columns['input'].shape[1]} wide)"} if meaning is not None else {}),
        },
    }
    return columns, description


def session_embeddings(
    model: GRU4Rec,
    events: pd.DataFrame | str | os.PathLike[str],
    *,
    session_key: str | None = None,
    item_key: str | None = None,
    time_key: str | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The final hidden state of every session in ``events`` (a file or a DataFrame), as columns.

    Each session's known items are fed in time order from a zero state; its vector is the last
    layer's output after its last known item, so ``vector · output_i + bias_i`` is the score the
    model gives item i as the session's next click. Columns: ``session_id``, ``embedding``
    (S×L float32) and ``n_events`` (the known events used). Items the model does not know are
    skipped, and sessions with no known item left out, with one warning counting each.
    The column names default to the model's.
    """
    fitted(model)
    item_map = catalogue_of(model)  # a cold item of a model with attributes is a known click
    names = ColumnKeys.resolve(model.config, session_key=session_key, item_key=item_key, time_key=time_key)
    sk, ik, tk = names.session_key, names.item_key, names.time_key
    keys = names.as_dict()
    if isinstance(events, pd.DataFrame):
        frame, source = validate_events(events, source="<DataFrame>", **keys), "<DataFrame>"
    else:
        frame, source = read_events(events, **keys), os.fspath(events)
    known = item_map.index_of(frame[ik]) >= 0
    n_sessions = int(frame[sk].nunique())
    # Stable sort: events with equal times keep their file order, as everywhere else.
    frame = frame[known].sort_values([sk, tk], kind="stable")
    grouped = frame.groupby(sk, sort=False)[ik].agg(list)
    if (~known).any():
        log.warning("%s: %d event(s) with items the model does not know were skipped", source, int((~known).sum()))
    if n_sessions > len(grouped):
        log.warning("%s: %d session(s) with no item the model knows were left out", source, n_sessions - len(grouped))
    if len(grouped) == 0:
        raise DataError(f"{source}: no session has an item the model knows; nothing to export")
    states = model.session_embeddings(grouped.tolist())
    columns = {
        "session_id": grouped.index.to_numpy(),
        "embedding": states,
        "n_events": grouped.map(len).to_numpy(dtype=np.int64),
    }
    description = {
        "what": "gru4rec session embeddings",
        "n_sessions": len(grouped),
        "score": "score(item i | session) = embedding · output_i + bias_i (output, bias: the item embeddings)",
        "columns": {
            "session_id": "the session id as in the events",
            "embedding": f"the final hidden state: the last layer's output after the session's last known click "
                         f"({states.shape[1]} wide)",
            "n_events": "the session's events with items the model knows (fed in time order)",
        },
    }
    return columns, description
