"""What the exports share: checking an output path before any work, writing it atomically, the
fitted network they read, and the item tables of its whole catalogue (:func:`catalogue_tables`:
with item attributes, the composed rows of the training and the cold items)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from gru4rec.errors import Gru4RecError, OutputExistsError
from gru4rec.files import atomic_write, check_output_path

if TYPE_CHECKING:
    from gru4rec.data import ItemMap
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.recommender import GRU4Rec

__all__ = ["CatalogueTables", "as_plain_network", "catalogue_tables", "check_target", "fitted", "write_atomically"]


def check_target(path: str | os.PathLike[str], what: str, *, overwrite: bool) -> Path:
    """``path`` as a Path, checked by :func:`gru4rec.files.check_output_path` (an existing file
    is replaced only with ``overwrite``)."""
    return check_output_path(path, what, overwrite, argument="overwrite")


def write_atomically(path: Path, write: Callable[[Path], object], *, what: str, overwrite: bool) -> Path:
    """:func:`gru4rec.files.atomic_write` with its failures as one Gru4RecError naming ``path``
    (the old file, if any, is left as it was)."""
    try:
        return atomic_write(path, write, overwrite=overwrite)
    except FileExistsError as exc:  # created by someone else since check_target
        raise OutputExistsError(path, what, "overwrite") from exc
    except OSError as exc:
        raise Gru4RecError(f"cannot write {what} {path}: {exc.strerror or exc}") from exc


def fitted(model: GRU4Rec) -> tuple[GRU4RecNet, ItemMap]:
    """The network and item map of a trained or loaded model
    (:func:`gru4rec.inference.require_fitted`: NotFittedError otherwise)."""
    net, item_map, _ = model._parts()
    return net, item_map


class CatalogueTables(NamedTuple):
    """Every catalogue item's rows as the network scores and steps with them, in catalogue order
    (the training items, then the cold items of a model with attributes)."""

    #: (N + C) × L: the rows the scores are ``out·outputᵀ + bias`` with (composed with attributes).
    output: Tensor
    #: N + C: the biases the scores add (with attributes: the id bias ``By`` plus the attributes'
    #: bias part; a cold item's is its attributes' part alone).
    bias: Tensor
    #: (N + C) × d: layer 0's input row of each item (``GRU4RecNet.input_rows``): the output rows
    #: in shared mode, else the rows of ``E`` or ``Wx_0``, composed with attributes (a cold
    #: item's from its attributes alone).
    input: Tensor


@torch.no_grad()
def catalogue_tables(net: GRU4RecNet) -> CatalogueTables:
    """The item tables of ``net``'s whole catalogue (:attr:`GRU4RecNet.n_catalogue` items).

    A plain network's are its own tensors (``Wy``, ``By``, :attr:`~GRU4RecNet.input_table`), not
    copies. With item attributes the output rows and biases are composed as ``score_all``
    composes them (:meth:`~gru4rec.items.rows.ComposedRows.compose_all`, so the exported rows
    are the scored ones bit for bit), and the input rows are composed as the network steps with
    them: the output rows in shared mode, ``input_attributes`` over ``E`` or ``Wx_0`` otherwise
    (a cold item clicked feeds layer 0 its attributes' input rows) — :meth:`GRU4RecNet.input_rows`, whole."""
    rows = net.attributes
    if rows is None:
        return CatalogueTables(net.Wy, net.By, net.input_table)
    output, bias = rows.compose_all(net.Wy, net.By)
    if net.input_attributes is None:
        return CatalogueTables(output, bias, output)
    return CatalogueTables(output, bias, net.input_attributes.compose_all_rows(net.input_table))


@torch.no_grad()
def as_plain_network(net: GRU4RecNet) -> GRU4RecNet:
    """``net`` itself when it has no item attributes; else ``net`` turned, **in place**, into the
    plain network of its catalogue: ``Wy``, ``By`` and the input table (``E``, or ``Wx_0`` in
    one-hot mode) become the (N + C)-row tables of :func:`catalogue_tables` and the attributes
    are dropped. It steps and scores every item exactly as ``net`` did — an export traces or
    reads it as it would a plain model. Give it a copy (the ONNX export traces a deep copy)."""
    if net.attributes is None:
        return net
    tables = catalogue_tables(net)
    net.attributes = net.input_attributes = None  # the rows they composed are now the tables themselves
    net.n_items = len(tables.bias)
    net.Wy = nn.Parameter(tables.output, requires_grad=False)
    net.By = nn.Parameter(tables.bias, requires_grad=False)
    if net.mode == "separate":
        net.E = nn.Parameter(tables.input, requires_grad=False)
    elif net.mode == "none":
        net.layers[0].Wx = nn.Parameter(tables.input, requires_grad=False)
    return net
