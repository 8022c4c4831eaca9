"""What a GRU4Rec model file holds, over the container of :mod:`gru4rec.formats.checkpoint`.

A model file is one safetensors file (:func:`gru4rec.formats.checkpoint.save_file`) whose

* tensors are the network's ``state_dict`` (``GRU4RecNet``'s parameter names), ``item_support``
  (int64, one count per item) and, when saved with the optimiser, its state as
  ``optimizer.<Optimizer.state_dict key>`` (:data:`OPTIMIZER_PREFIX`);
* metadata is ``kind`` (:data:`MODEL_KIND`), ``config`` (:meth:`Config.to_dict`), ``item_ids``
  (the item map, index order) and ``epochs_trained``.

A model trained with item attributes (issue 49, docs/attributes.md) adds, and a plain model
file never has:

* the tensors of its :class:`~gru4rec.items.rows.ComposedRows` parameters in the ``state_dict``
  (``attributes.tables.{c}``, ``attributes.projection``; in the separate and one-hot modes also
  ``input_attributes.tables.{c}``, ``input_attributes.projection``) — but not their buffers
  (codes, offsets, numbers), which are rebuilt from
* the encoded attributes, :meth:`ItemAttributes.to_tensors` under :data:`ATTRIBUTES_PREFIX`
  (``item_attributes.cat{c}.codes``, ``….offsets``, ``….numeric``, ``….has_row``), and
* the metadata entry ``item_attributes`` (:data:`ATTRIBUTES_KEY`): the encoding (vocabularies,
  kinds, numeric mean/std), ``n_warm`` and the cold items' ids.

This is an extension within format version 2, not a new version: the container and every entry
a plain file has are unchanged, so plain files stay compatible both ways — its ``config`` leaves
out the parameters that came with the extension while they have their defaults
(:data:`EXTENSION_DEFAULTS`: ``click_context``, ``dropout_p_id``; the reader fills the defaults in),
as a reader before them refuses a parameter it does not know. A reader older
than this extension refuses such a file rather than misreading it: it builds a plain network and
loads the tensors strictly, and the ``attributes.*``/``item_attributes.*`` tensors are
unexpected keys (its ``ModelFileError`` names them).

Loading needs neither the training data nor pickle, and never executes code from the file.
``GRU4Rec.save``/``GRU4Rec.load`` are the user API over :func:`write_model`/:func:`read_model`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.data.overlap import TrainingFingerprint
from gru4rec.errors import DataError, ModelFileError
from gru4rec.formats import checkpoint
from gru4rec.items.attributes import ItemAttributes
from gru4rec.network.gru import GRU4RecNet

__all__ = ["ATTRIBUTES_KEY", "ATTRIBUTES_PREFIX", "EXTENSION_DEFAULTS", "MODEL_KIND", "OPTIMIZER_PREFIX", "ModelParts", "read_model",
           "read_model_config", "write_model"]

#: The ``kind`` metadata entry of a model file (training checkpoints have another).
MODEL_KIND = "gru4rec-model"
#: Prefix of the optimiser-state tensors in a model file saved with the optimiser.
OPTIMIZER_PREFIX = "optimizer."
#: Prefix of the encoded item attributes' tensors (a model trained with item attributes only).
ATTRIBUTES_PREFIX = "item_attributes."
#: The metadata entry of the attributes' encoding (a model trained with item attributes only).
ATTRIBUTES_KEY = "item_attributes"
#: The parameters that came with the attributes and click context extension, and their defaults:
#: a model file's ``config`` leaves out each that has its default, so that a plain model's file
#: stays readable by releases before it (they refuse unknown parameters).
EXTENSION_DEFAULTS: dict[str, Any] = {"click_context": False, "dropout_p_id": 0.0}


@dataclass(frozen=True)
class ModelParts:
    """Everything a model file holds: the network (on the CPU, in evaluation mode), its config,
    item map and item supports, the optimiser state (None unless saved with it) and the number
    of epochs it was trained."""

    config: Config
    net: GRU4RecNet
    item_map: ItemMap
    item_support: np.ndarray
    optimizer_state: dict[str, torch.Tensor] | None
    epochs_trained: int
    #: The training transitions' sample (:mod:`gru4rec.data.overlap`); None in older files.
    train_fingerprint: TrainingFingerprint | None = None


def write_model(
    path: str | os.PathLike[str],
    *,
    net: GRU4RecNet,
    config: Config,
    item_map: ItemMap,
    item_support: np.ndarray,
    epochs_trained: int,
    optimizer_state: Mapping[str, torch.Tensor] | None = None,
    train_fingerprint: TrainingFingerprint | None = None,
    overwrite: bool = False,
) -> None:
    """Write a model file (atomic; an existing file is kept unless ``overwrite``);
    ``optimizer_state`` (``Optimizer.state_dict()``) is written when given."""
    tensors = dict(net.state_dict())
    attributes_meta = None
    if net.attributes is not None:
        # The buffers are a device copy of the encoded attributes: written once, as the latter.
        for name in _attribute_buffers(net):
            del tensors[name]
        encoded, attributes_meta = net.attributes.source.to_tensors(ATTRIBUTES_PREFIX)
        tensors.update(encoded)
    tensors["item_support"] = torch.from_numpy(item_support)
    if optimizer_state is not None:
        tensors.update({OPTIMIZER_PREFIX + k: v for k, v in optimizer_state.items()})
    params = {name: value for name, value in config.to_dict().items()
              if not (name in EXTENSION_DEFAULTS and value == EXTENSION_DEFAULTS[name])}
    meta: dict[str, Any] = {"kind": MODEL_KIND, "config": params, "item_ids": item_map.to_list(),
                            "epochs_trained": epochs_trained}
    if attributes_meta is not None:
        meta[ATTRIBUTES_KEY] = attributes_meta
    if train_fingerprint is not None:
        meta["train_transitions"] = train_fingerprint.to_meta()
    checkpoint.save_file(path, tensors, meta, overwrite=overwrite)


def _attribute_buffers(net: GRU4RecNet) -> list[str]:
    """The ``state_dict`` names of the buffers of the network's compositions (none without
    attributes): device copies of the encoded attributes, which the file holds once."""
    return [f"{module}.{name}" for module, rows in net.compositions().items() for name, _ in rows.named_buffers()]


def _check_kind(path: str | os.PathLike[str], meta: Mapping[str, Any]) -> None:
    if meta.get("kind") != MODEL_KIND:
        raise ModelFileError(f"{path} is not a gru4rec model file (kind {meta.get('kind')!r})")


def read_model(path: str | os.PathLike[str]) -> ModelParts:
    """Read a file written by :func:`write_model` (checksums verified); :class:`ModelFileError`
    for anything else or for parts that do not fit together."""
    tensors, meta = checkpoint.load_file(path)
    _check_kind(path, meta)
    try:
        config = Config.from_dict(meta["config"])
        item_map = ItemMap.from_list(meta["item_ids"])
        support = tensors.pop("item_support").numpy().astype(np.int64)
        state = {k[len(OPTIMIZER_PREFIX):]: tensors.pop(k) for k in [k for k in tensors if k.startswith(OPTIMIZER_PREFIX)]}
        attributes = None
        if ATTRIBUTES_KEY in meta:
            attributes = ItemAttributes.from_tensors(tensors, meta[ATTRIBUTES_KEY], item_map, ATTRIBUTES_PREFIX)
            for name in [k for k in tensors if k.startswith(ATTRIBUTES_PREFIX)]:
                del tensors[name]
        net = GRU4RecNet(len(item_map), config, attributes=attributes)
        if attributes is not None and net.attributes is None:
            raise ValueError(f"its {ATTRIBUTES_KEY!r} have no column")
        # The composition's buffers are rebuilt from the encoded attributes (not in the file).
        own = net.state_dict()
        tensors.update({name: own[name] for name in _attribute_buffers(net)})
        net.load_state_dict(tensors)
    except (KeyError, RuntimeError, ValueError, TypeError, DataError) as exc:
        raise ModelFileError(f"{path} does not hold a consistent gru4rec model: {exc}") from exc
    return ModelParts(config, net.eval(), item_map, support, state or None, int(meta.get("epochs_trained", 0)),
                      TrainingFingerprint.from_meta(meta.get("train_transitions")))


def read_model_config(path: str | os.PathLike[str]) -> Config:
    """The config of the model in ``path``, from the file's metadata alone (no tensor is read)."""
    meta = checkpoint.read_meta(path)
    _check_kind(path, meta)
    try:
        return Config.from_dict(meta["config"])
    except (KeyError, ValueError) as exc:
        raise ModelFileError(f"{path} does not hold a consistent gru4rec model: {exc}") from exc
