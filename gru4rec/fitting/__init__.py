"""``GRU4Rec.fit`` wired together: the data, a warm start's model, validation and the per-epoch
callbacks around one :class:`~gru4rec.training.fit.TrainingRun`.

This module sits beside :mod:`gru4rec.fitting.validation`, above both :mod:`gru4rec.training` and
:mod:`gru4rec.evaluation`: it is the one place that hands a
:class:`~gru4rec.fitting.validation.Validator` (which evaluates) to a training run (which never imports
the evaluator). ``GRU4Rec.fit`` (the user API and its documentation) calls :func:`fit_model`;
the order of the work is

1. every argument checked (metric, patience, checkpoint flags) before any data is read;
2. a warm start's model read (:func:`warm_start_of`) and the config it trains with
   (:func:`gru4rec.training.warm_start.inherit_config`);
3. the training events read, the item map built (or grown), the sessions and item supports;
   with ``item_features`` the attribute table read and encoded on that item map (issue 49);
4. the validation sessions in the items the model ranks (with attributes, its cold items too);
5. the training run (:mod:`gru4rec.training.fit`), each epoch's :class:`EpochInfo` to every callback;
6. the best epoch's weights put back (early stopping), the optimiser state kept, the checkpoint removed.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gru4rec.config import Config
from gru4rec.data import ItemMap, Sessions, item_support, read_events, sessions_from_events, validate_events
from gru4rec.data.overlap import TrainingFingerprint, warn_overlap
from gru4rec.errors import Gru4RecError
from gru4rec.fitting.validation import Validator, check_patience, parse_metric
from gru4rec.inference import catalogue_of
from gru4rec.items import ItemAttributes, ItemTable, item_table_from_frame, read_item_table
from gru4rec.machine.resources import peak_device_memory_mb, peak_host_memory_mb
from gru4rec.machine.threads import using_threads
from gru4rec.training.fit import TrainingRun, WarmStart
from gru4rec.training.resume import TrainingCheckpoint
from gru4rec.training.warm_start import grow_item_map, inherit_config

__all__ = ["EpochInfo", "attribute_table", "fit_model", "warm_start_of"]

log = logging.getLogger(__name__)


@dataclass
class EpochInfo:
    """Passed to the ``fit`` callback after every epoch. Raising in the callback stops training.

    ``model``: the :class:`gru4rec.GRU4Rec` being fitted; ``valid``: the validation metrics after
    this epoch (``{'recall@20': ..., 'mrr@20': ..., 'ndcg@20': ...}``) and ``best_epoch`` the best
    epoch so far, when ``fit`` validates; ``peak_host_mb`` / ``peak_device_mb``: the process's
    peak resident memory and (on CUDA) the peak memory torch allocated, so far, in MiB
    (:mod:`gru4rec.machine.resources`).
    """

    epoch: int
    loss: float
    seconds: float
    events_per_s: float
    mb_per_s: float
    model: Any = field(repr=False)
    valid: dict[str, float] | None = None
    best_epoch: int | None = None
    peak_host_mb: float = 0.0
    peak_device_mb: float | None = None


def read_training_events(data: pd.DataFrame | str | os.PathLike[str], config: Config) -> pd.DataFrame:
    """The events of ``data`` (a DataFrame, validated, or a file, read), in ``config``'s columns."""
    keys = dict(session_key=config.session_key, item_key=config.item_key, time_key=config.time_key)
    if isinstance(data, pd.DataFrame):
        return validate_events(data, source="<DataFrame>", **keys)
    return read_events(data, **keys)


def sessions_of(events: pd.DataFrame, item_map: ItemMap, config: Config, *, drop_unknown: bool, order: str) -> Sessions:
    """The sessions of ``events`` in ``item_map`` (see :func:`gru4rec.data.sessions_from_events`)."""
    sessions, _ = sessions_from_events(
        events, item_map, session_key=config.session_key, item_key=config.item_key, time_key=config.time_key,
        order=order, drop_unknown=drop_unknown,  # type: ignore[arg-type]  # order is 'time' or 'id'
    )
    return sessions


def attribute_table(item_features: pd.DataFrame | str | os.PathLike[str], *, item_key: str,
                    types: Mapping[str, str] | None) -> ItemTable:
    """The item attribute table of ``fit(item_features=...)``: a DataFrame checked, or a file read
    (:func:`gru4rec.items.read_item_table`), keyed by the events' item column."""
    if isinstance(item_features, pd.DataFrame):
        return item_table_from_frame(item_features, item_key=item_key, types=types)
    return read_item_table(item_features, item_key=item_key, types=types)


def warm_start_of(model: Any, init_from: Any) -> tuple[WarmStart, TrainingFingerprint | None]:
    """What ``model.fit(init_from=...)`` starts from, and the sample of the data it was trained
    on: ``init_from`` is a model of ``model``'s class (possibly ``model`` itself) or a model file,
    read onto ``model``'s device. Everything is taken before ``fit`` assigns anything, so that a
    model can continue itself."""
    source = init_from if isinstance(init_from, type(model)) else type(model).load(init_from, device=model.device)
    net, item_map, _ = source._parts()
    name = "the given model" if source is init_from else str(init_from)
    return WarmStart(name, net, item_map, source.optimizer_state, source.config), source.train_fingerprint


def fit_model(
    model: Any,
    data: pd.DataFrame | str | os.PathLike[str],
    *,
    valid: pd.DataFrame | str | os.PathLike[str] | None = None,
    early_stop: int | None = None,
    metric: str = "recall@20",
    valid_cutoffs: Sequence[int] | None = None,
    valid_mode: str = "standard",
    callback: Callable[[EpochInfo], Any] | Sequence[Callable[[EpochInfo], Any]] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    checkpoint_every: float | None = None,
    keep_checkpoint: bool = False,
    progress: bool = True,
    init_from: Any = None,
    item_features: pd.DataFrame | str | os.PathLike[str] | None = None,
    attribute_min_count: int = 1,
    attribute_types: Mapping[str, str] | None = None,
) -> None:
    """Train ``model`` (a :class:`gru4rec.GRU4Rec`) in place: what ``GRU4Rec.fit`` documents.

    Sets the model's ``config`` (a warm start's, see :func:`gru4rec.training.warm_start.inherit_config`),
    ``item_map``, ``item_support``, ``net``, ``epochs_trained``, ``history``, ``valid_history``,
    ``best_epoch`` and ``optimizer_state``."""
    chosen = parse_metric(metric)  # bad validation arguments fail before any data is read
    check_patience(early_stop)
    if early_stop is not None and valid is None:
        raise Gru4RecError("early_stop needs valid= (the events to validate on)")
    callbacks = [] if callback is None else [callback] if callable(callback) else list(callback)
    if checkpoint_dir is None and (resume or checkpoint_every is not None):
        raise Gru4RecError(f"{'resume=True' if resume else 'checkpoint_every'} needs checkpoint_dir (where the checkpoint is)")
    ckpt = TrainingCheckpoint(checkpoint_dir, resume=resume, every_minutes=checkpoint_every) if checkpoint_dir is not None else None
    if item_features is not None and model.precision != "float32":
        raise Gru4RecError(f"item_features trains on the reference step, which runs in float32 only: "
                           f"precision={model.precision!r} cannot be used with it yet (issue 49)")
    # The attribute table is read (and checked) before the events: a bad file fails fast.
    table = attribute_table(item_features, item_key=model.config.item_key, types=attribute_types) \
        if item_features is not None else None
    base, base_fingerprint = warm_start_of(model, init_from) if init_from is not None else (None, None)
    if base is not None:
        model.config = inherit_config(base.config, model.config, base.name)
    c: Config = model.config
    if c.dropout_p_id > 0 and table is None:
        log.warning("dropout_p_id=%g has no effect without item attributes (item_features): it drops the id part "
                    "of items composed from their attributes", c.dropout_p_id)
    events = read_training_events(data, c)
    model.item_map = ItemMap.from_ids(events[c.item_key]) if base is None else grow_item_map(base.item_map, events[c.item_key])
    sessions = sessions_of(events, model.item_map, c, drop_unknown=False, order="time" if c.time_sort else "id")
    model.item_support = item_support(sessions.items, len(model.item_map))
    attributes = None
    if table is not None:
        # A warm start grows the model's own encoding (its codes keep their rows); else a new one.
        rows = base.net.attributes if base is not None else None
        attributes = rows.source.warm_start(table, model.item_map) if rows is not None else \
            ItemAttributes.build(table, model.item_map, min_count=attribute_min_count)
        ignored = attributes.encoding.ignored_columns(table)
        if ignored:  # a warm start keeps the model's columns: a column it was not trained with is not added
            log.warning("%s: column(s) %s ignored: the init_from model has no such attribute (its columns: %s)",
                        table.source, ignored, attributes.encoding.column_names)
        log.info("item attributes from %s: %s", table.source, attributes.counts())
    del events
    # A warm-started model was trained on the base model's data too (its item indices are kept).
    train_fingerprint = TrainingFingerprint.of(sessions)
    if base_fingerprint is not None:
        train_fingerprint = train_fingerprint.merged(base_fingerprint)
    model.train_fingerprint = train_fingerprint
    valid_events = read_training_events(valid, c) if valid is not None else None  # read (and checked) before training
    # What a resumed run's data must match (TrainingCheckpoint).
    fingerprint = {"n_items": len(model.item_map), "n_events": int(sessions.n_events), "n_sessions": int(sessions.n_sessions)}

    with using_threads(model.threads):
        run = TrainingRun(c, len(model.item_map), model.item_support, device=model.device, precision=model.precision, warm=base,
                          attributes=attributes)
        model.net = run.net
        model.history = []
        validator = None
        if valid_events is not None:
            # In the items the model ranks, as a test is (catalogue_of): with attributes, the
            # validation events of cold items are kept and ranked too.
            valid_sessions = sessions_of(valid_events, catalogue_of(model), c, drop_unknown=True, order="id")
            warn_overlap(train_fingerprint, valid_sessions,
                         f"the validation data {valid}" if isinstance(valid, (str, os.PathLike)) else "the validation data")
            validator = Validator(model, valid_sessions, metric=chosen, cutoffs=valid_cutoffs, mode=valid_mode, patience=early_stop)
        try:
            with contextlib.closing(run.epochs(sessions, checkpoint=ckpt, fingerprint=fingerprint, validation=validator,
                                               progress=progress)) as epochs:
                for epoch in epochs:
                    stats = epoch.stats
                    model.epochs_trained = stats.epoch
                    model.history.append(stats)
                    info = EpochInfo(
                        stats.epoch, stats.loss, stats.seconds, stats.events_per_s, stats.mb_per_s, model,
                        valid=epoch.valid, best_epoch=validator.best_epoch if validator is not None else None,
                        peak_host_mb=peak_host_memory_mb(), peak_device_mb=peak_device_memory_mb(model.device),
                    )
                    for observer in callbacks:
                        observer(info)
        finally:  # also after an interruption: the epochs whose weights the network holds (a resumed run's included)
            model.epochs_trained = run.epochs_done
    if validator is not None:
        model.valid_history = list(validator.history)
        model.best_epoch = validator.finish()
        if early_stop is not None and model.best_epoch is not None:
            model.epochs_trained = model.best_epoch  # the weights are that epoch's
    # Views into the trainer's tables: kept so that a warm start from this model carries them.
    # (After early stopping the weights are the best epoch's, the state the last epoch's.)
    model.optimizer_state = run.trainer.optimizer.state_dict()
    if ckpt is not None and not keep_checkpoint:
        ckpt.remove()
