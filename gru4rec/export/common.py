"""What the exports share: checking an output path before any work, writing it atomically, and
the fitted network they read."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gru4rec.errors import Gru4RecError, OutputExistsError
from gru4rec.files import atomic_write, check_output_path

if TYPE_CHECKING:
    from gru4rec.data import ItemMap
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.recommender import GRU4Rec

__all__ = ["check_target", "fitted", "write_atomically"]


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


def fitted(model: GRU4Rec, *, tables_for: str | None = None) -> tuple[GRU4RecNet, ItemMap]:
    """The network and item map of a trained or loaded model
    (:func:`gru4rec.inference.require_fitted`: NotFittedError otherwise).

    ``tables_for``: the export (e.g. "the ONNX export") reads the item tables themselves, which a
    model trained with item attributes does not score with (its rows are built from them): such a
    model is refused, naming the export, instead of exported with its id rows alone."""
    net, item_map, _ = model._parts()
    if tables_for is not None and getattr(net, "attributes", None) is not None:
        raise Gru4RecError(f"{tables_for} of a model with item attributes is not there yet: its item rows are built from "
                           "the attributes (docs/attributes.md)")
    return net, item_map
