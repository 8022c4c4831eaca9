"""The GRU4Rec recommender: ``fit`` on click sessions, ``recommend`` for live sessions, ``save``/``load``.

    >>> model = GRU4Rec(Config.from_file("paramfiles/rsc15_xe_shared_100_best.py")).fit("train.tsv")
    >>> model.recommend([214834865, 214706441], k=20).item_ids

Everything a trained model needs travels in one file (``save``, :mod:`gru4rec.formats.model_file`): the
weights, the config, the item map and the item supports; loading needs neither the training data
nor pickle. ``fit`` is wired in :mod:`gru4rec.fitting` (data, warm start, validation, callbacks)
over one :class:`gru4rec.training.fit.TrainingRun`; this class keeps the user API and the
:class:`~gru4rec.inference.SessionModel` methods.
"""
from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from gru4rec.config import Config
from gru4rec.data import IndexedSessions, ItemMap, index_sessions
from gru4rec.data.overlap import TrainingFingerprint
from gru4rec.errors import Gru4RecError
from gru4rec.fitting import EpochInfo, fit_model
from gru4rec.formats.model_file import read_model, write_model
from gru4rec.inference import Engine, require_fitted
from gru4rec.inference.repeat import RepeatBoost
from gru4rec.machine.devices import resolve_device
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.loop import EpochStats
from gru4rec.training.precision import check_precision

__all__ = ["GRU4Rec", "EpochInfo", "Recommendations", "load"]

log = logging.getLogger(__name__)


@dataclass
class Recommendations:
    """Top-k items for one session and the scores they were ranked by: the model's scores, plus
    the repeat boost when the model has one (``repeat_boost``, docs/python.md#repeat-aware-scoring).
    ``fallback`` is True when no item of the session was known and the most popular items were
    returned instead; their ``scores`` are then NaN (the model scored nothing)."""

    item_ids: np.ndarray
    scores: np.ndarray
    n_unknown: int = 0
    fallback: bool = False


def _as_config(config: Config | str | Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> Config:
    if config is None:
        base = Config()
    elif isinstance(config, Config):
        base = config
    elif isinstance(config, str):
        base = Config.from_string(config)
    else:
        base = Config.from_dict(config)
    return base.replace(**overrides) if overrides else base


class GRU4Rec:
    """Session-based recommender with a GRU (Hidasi et al. 2016, 2018).

    ``config`` is a :class:`Config`, a parameter string (``"loss=bpr-max,layers=200"``) or a dict;
    keyword arguments override single hyperparameters. ``device``: ``'auto'`` (CUDA if present),
    ``'cpu'``, ``'cuda'``, ``'cuda:1'``, ... ``precision``: ``'float32'`` (default), or
    ``'bfloat16'`` for mixed-precision training — bfloat16 operands in
    the matrix products, everything else in float32 (see :class:`gru4rec.training.precision.Matmuls`).
    ``threads``: torch threads while :meth:`fit` trains; None (default) means the CPUs this
    process may use — its affinity mask capped by its cgroup's CPU quota, or ``OMP_NUM_THREADS``
    when set (:mod:`gru4rec.machine.threads`). On a machine where other processes keep cores busy, fewer
    (often 1) is much faster.
    """

    def __init__(
        self,
        config: Config | str | Mapping[str, Any] | None = None,
        *,
        device: str | torch.device = "auto",
        precision: str = "float32",
        threads: int | None = None,
        **overrides: Any,
    ) -> None:
        self.config = _as_config(config, overrides)
        self.device = resolve_device(device)
        check_precision(precision, self.device, warn=False)  # a bad name fails here; fit's Trainer warns
        self.precision = precision
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise Gru4RecError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        self.item_map: ItemMap | None = None
        self.item_support: np.ndarray | None = None
        self.net: GRU4RecNet | None = None
        self.epochs_trained = 0
        self.history: list[EpochStats] = []
        #: After a fit with ``valid``: the validation metrics of every epoch, and the best epoch.
        self.valid_history: list[dict[str, float]] = []
        self.best_epoch: int | None = None
        #: The optimiser's state after :meth:`fit` (``Optimizer.state_dict()``: ``t`` and
        #: ``{param}.{acc|dacc|m|vel}``), or from a file saved with it; None otherwise. A warm
        #: start (``fit(init_from=...)``) continues from it; ``save(optimizer=True)`` writes it.
        self.optimizer_state: dict[str, torch.Tensor] | None = None
        #: A bounded sample of the training transitions (:mod:`gru4rec.data.overlap`): evaluating
        #: on data the model was trained on warns. None before fit and in files written without it.
        self.train_fingerprint: TrainingFingerprint | None = None
        self._engine: Engine | None = None

    def __repr__(self) -> str:
        state = f"{len(self.item_map)} items, {self.epochs_trained} epochs" if self.item_map is not None else "not fitted"
        precision = f", precision='{self.precision}'" if self.precision != "float32" else ""
        return f"GRU4Rec({self.config.to_param_string(only_changed=True)!r}, device='{self.device}'{precision}, {state})"

    # ------------------------------------------------------------------ training

    def fit(
        self,
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
        init_from: GRU4Rec | str | os.PathLike[str] | None = None,
        item_features: pd.DataFrame | str | os.PathLike[str] | None = None,
        attribute_min_count: int = 1,
        attribute_types: Mapping[str, str] | None = None,
    ) -> GRU4Rec:
        """Train on ``data`` (DataFrame or file with session, item and time columns): from scratch,
        or from a trained model with ``init_from`` (a ``GRU4Rec`` or a model file).

        ``init_from`` (a warm start, :mod:`gru4rec.training.warm_start`): the model's weights are the
        starting point; its items keep their indices and rows, the new data's new items get
        fresh rows; its optimiser state is carried when it has one (``optimizer_state``; a file
        saved with ``optimizer=True``); the item supports (sampling, fallback) are the new data's.
        The model's config is the default: this model's ``config`` becomes the model's with the
        fields this one was given (:attr:`Config.given`, e.g. ``GRU4Rec(n_epochs=1)``) on top; a
        given network field that differs from the model's is a
        :class:`~gru4rec.errors.ConfigError` naming it.

        ``valid`` (DataFrame or file): evaluate on it after every epoch at ``valid_cutoffs`` with
        ``valid_mode`` ties (:mod:`gru4rec.fitting.validation`); ``early_stop=P`` stops when ``metric``
        (``'recall@K'``, ``'mrr@K'`` or ``'ndcg@K'``) has not improved for P epochs and keeps the
        best epoch's weights (``best_epoch``, ``valid_history``).

        ``callback(info)`` (or each of a sequence of callbacks) runs after every epoch with an
        :class:`EpochInfo`. With ``checkpoint_dir`` the full training state (validation included)
        is saved there after every epoch, every ``checkpoint_every`` minutes inside an epoch, and
        at the next step boundary after SIGINT/SIGTERM (then :class:`~gru4rec.errors.TrainingInterrupted`
        is raised); ``resume=True`` continues from that checkpoint and ends with the same model as
        an uninterrupted run. A folder that already holds a checkpoint is refused without
        ``resume``, and ``resume`` without one is an error. When training completes, the
        checkpoint is removed unless ``keep_checkpoint``. See :mod:`gru4rec.training.resume`.
        ``progress``: a progress bar per epoch on a terminal. The per-epoch lines are logged at
        INFO by ``gru4rec.training.loop`` (see :mod:`gru4rec.log`).

        ``item_features`` (a file — TSV/CSV/Parquet — or a DataFrame keyed by the item column): item
        attributes (docs/attributes.md). Each item's output row (and in shared mode its input row)
        is its id row plus its attributes' embeddings; the vocabularies keep values seen on at
        least ``attribute_min_count`` training items; ``attribute_types={column: kind}`` overrides
        the inferred kinds (``categorical``, ``multi``, ``numeric``). Training then runs FastStep
        on the CPU, the autograd reference step elsewhere. With ``init_from`` a model with
        attributes grows its vocabularies with the new table's values (docs/attributes.md);
        ``checkpoint_dir`` resumes such a run when given the same ``item_features``.
        :meth:`save` writes such a model whole.
        """
        fit_model(self, data, valid=valid, early_stop=early_stop, metric=metric, valid_cutoffs=valid_cutoffs,
                  valid_mode=valid_mode, callback=callback, checkpoint_dir=checkpoint_dir, resume=resume,
                  checkpoint_every=checkpoint_every, keep_checkpoint=keep_checkpoint, progress=progress,
                  init_from=init_from, item_features=item_features, attribute_min_count=attribute_min_count,
                  attribute_types=attribute_types)
        return self

    # ------------------------------------------------------------------ model files

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False, optimizer: bool = False) -> None:
        """Write the model to one file (atomic; an existing file is kept unless ``overwrite``).

        ``optimizer``: also write the optimiser's state (``optimizer_state``), so that a warm
        start from the file continues it; the file is then about 2-4 times larger (one table
        per state per item table), which a server does not need. A model trained with item
        attributes also writes them: the attribute tables, the projection and the encoding
        (:mod:`gru4rec.formats.model_file`), so that :meth:`load` scores bit for bit alike."""
        net, item_map, support = self._parts()
        if optimizer and self.optimizer_state is None:
            raise Gru4RecError("this model has no optimiser state to save (it was loaded from a file saved without it)")
        write_model(path, net=net, config=self.config, item_map=item_map, item_support=support,
                    epochs_trained=self.epochs_trained, optimizer_state=self.optimizer_state if optimizer else None,
                    train_fingerprint=self.train_fingerprint, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str | torch.device = "auto") -> GRU4Rec:
        """Read a model written by :meth:`save` (:mod:`gru4rec.formats.model_file`). Never executes code from the file."""
        parts = read_model(path)
        model = cls(parts.config, device=device)
        model.item_map, model.item_support = parts.item_map, parts.item_support
        model.optimizer_state = parts.optimizer_state  # kept on the CPU: only a warm start reads it
        model.net = parts.net.to(model.device).eval()
        model.epochs_trained = parts.epochs_trained
        model.train_fingerprint = parts.train_fingerprint  # None in older files
        return model

    # ------------------------------------------------------------------ the SessionModel protocol

    @property
    def fitted(self) -> bool:
        """Whether the model is trained (or loaded): it has a network, an item map and supports."""
        return self.net is not None and self.item_map is not None and self.item_support is not None

    @property
    def catalogue(self) -> ItemMap | None:
        """The items this model ranks, by score column: :attr:`item_map` (the training items,
        whose indices the item supports, warm starts and the model file keep) followed, for a
        model with item attributes, by the cold items of its attribute table — items no
        training event has, scored from their attributes alone (docs/attributes.md). For a
        plain model it is :attr:`item_map` itself. ``recommend`` returns, ``score_sessions``
        scores and ``evaluate`` ranks these items; a clicked cold item is a known item. None
        before fit."""
        if self.item_map is None or self.net is None or self.net.attributes is None:
            return self.item_map
        return self.net.attributes.item_map

    def _parts(self) -> tuple[GRU4RecNet, ItemMap, np.ndarray]:
        item_map, support = require_fitted(self, "call fit() or GRU4Rec.load()")
        assert self.net is not None
        return self.net, item_map, support

    def init_state(self, batch_size: int) -> list[torch.Tensor]:
        """Zero states of ``batch_size`` fresh sessions: one B×L_i tensor per GRU layer."""
        return self._parts()[0].init_hidden(batch_size)

    @property
    def click_context(self) -> bool:
        """Whether the model takes each click's context (``config.click_context``): its steps
        then need the clicks' context (:meth:`step`), which the evaluator and the engine compute
        from the clicks' times (docs/attributes.md, "Click context")."""
        return self.net is not None and self.net.uses_context

    @torch.no_grad()
    def step(self, items: torch.Tensor, state: list[torch.Tensor], context: torch.Tensor | None = None) -> torch.Tensor:
        """One GRU step of every row (item indices ``items``), in place; returns the last layer's
        output, which is ``state[-1]``. Never trains: the network stays in evaluation mode.
        ``context`` (B×5, :mod:`gru4rec.items.context`): the clicks' context, which a model with
        :attr:`click_context` needs (and a plain one refuses)."""
        return self._parts()[0].step(items, state, context)

    @torch.no_grad()
    def scores(self, out: torch.Tensor, buffer: torch.Tensor | None = None) -> torch.Tensor:
        """Raw scores of every item of :attr:`catalogue` after the outputs ``out``: ``out·Wyᵀ + By``
        (B×N; with attributes B×(N + C), a cold item's bias its attributes' part: :meth:`GRU4RecNet.score_all`)."""
        return self._parts()[0].score_all(out, buffer=buffer)

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(Wy, By)``: the scores are ``out·Wyᵀ + By``; None with item attributes (the scores
        read composed rows, not Wy: the int8 candidates, built on Wy, do not apply)."""
        net = self._parts()[0]
        if net.attributes is not None:
            return None
        return net.Wy, net.By

    @property
    def repeat_boost(self) -> RepeatBoost:
        """The repeat boost ranked scores get (``repeat_weight``, ``repeat_decay`` of the config;
        none by default): :class:`~gru4rec.inference.repeat.RepeatAware`."""
        return RepeatBoost(self.config.repeat_weight, self.config.repeat_decay)

    def with_repeat_boost(self, weight: float, decay: float = 1.0) -> GRU4Rec:
        """This model with repeat-aware scoring ``weight``, ``decay`` (docs/python.md#repeat-aware-scoring):
        a new ``GRU4Rec`` that shares this one's network, item map and supports (no tensor is
        copied; training either one later gives it a network of its own) and whose config holds
        the two coefficients, so that ``save`` writes them. This model is not changed."""
        boosted = copy.copy(self)
        boosted.config = self.config.replace(repeat_weight=weight, repeat_decay=decay)
        boosted._engine = None
        return boosted

    def engine(self) -> Engine:
        """The inference engine of this model (:class:`gru4rec.inference.Engine`, float32 scores),
        built on first use and again when ``fit``/``load`` gave the model a new item map and supports."""
        _, item_map, support = self._parts()
        engine = self._engine
        if engine is None or engine.item_map is not item_map or engine.item_support is not support:
            self._engine = engine = Engine(self)
        return engine

    # ------------------------------------------------------------------ recommendations

    def _flatten(self, sessions: Sequence[Iterable[Any]], times: Sequence[Sequence[float]] | None = None) -> IndexedSessions:
        """The sessions' known item indices (flat), their offsets, each session's number of
        unknown ids and, for a model with click context given ``times`` (``times[s]``: session
        s's, one unix time per item), the known clicks' times (else None: the clock at the call,
        :class:`~gru4rec.inference.Engine`) — one lookup for all ids, with one warning (to the
        caller of the public method) that counts the skipped ids."""
        self._parts()
        item_map = self.catalogue
        assert item_map is not None
        lists = [list(s) for s in sessions]
        lengths = np.array([len(s) for s in lists], dtype=np.int64)
        flat_times = None
        if times is not None and self.click_context:
            if len(times) != len(lists):
                raise Gru4RecError(f"times: {len(times)} lists of click times for {len(lists)} sessions")
            for s, (ids, ts) in enumerate(zip(lists, times)):
                if len(ts) != len(ids):
                    raise Gru4RecError(f"times[{s}]: {len(ts)} click times for {len(ids)} items")
            flat_times = [t for ts in times for t in ts]
        flat = index_sessions(item_map, [i for s in lists for i in s], np.repeat(np.arange(len(lists)), lengths), len(lists),
                              flat_times)
        if flat.n_unknown.any():
            warnings.warn(f"{int(flat.n_unknown.sum())} unknown item id(s) skipped in {int((flat.n_unknown > 0).sum())} "
                          "session(s)", stacklevel=3)
        return flat

    def _flatten_nonempty(self, sessions: Sequence[Iterable[Any]], purpose: str,
                          times: Sequence[Sequence[float]] | None) -> IndexedSessions:
        """:meth:`_flatten` where every session needs at least one known item."""
        flat = self._flatten(sessions, times)
        empty = np.flatnonzero(np.diff(flat.offsets) == 0)
        if len(empty):
            raise Gru4RecError(f"every session needs at least one known item {purpose}; session(s) at position "
                               f"{', '.join(map(str, empty[:5].tolist()))} have none")
        return flat

    def recommend_batch(self, sessions: Sequence[Iterable[Any]], k: int = 20, *, exclude_seen: bool = False,
                        times: Sequence[Sequence[float]] | None = None) -> list[Recommendations]:
        """Top-``k`` items for each session (the items clicked so far, oldest first), ranked by the
        model's scores plus its repeat boost when it has one (:attr:`repeat_boost`).

        Unknown item ids are skipped with one warning that counts them; a session with no known
        item gets the most popular items, flagged ``fallback=True``, with NaN scores. With
        ``exclude_seen`` a session's own items are never recommended (a session may then get
        fewer than ``k``). Sessions run in chunks (:class:`gru4rec.inference.Engine`): memory
        is bounded by the chunk, not by the number of sessions. ``times`` (one list per session,
        one unix time per item): the clicks' times, which a model with :attr:`click_context`
        computes the clicks' context from (None: every click at the clock's time now, gaps 0); a
        plain model ignores them.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        items, offsets, n_unknown, known_times = self._flatten(sessions, times)
        assert self.catalogue is not None
        ids = self.catalogue.ids  # the cold items of a model with attributes can be recommended
        results: list[Recommendations] = []
        for chunk in self.engine().recommend(items, offsets, k, exclude_seen=exclude_seen, times=known_times):
            for r in range(len(chunk.fallback)):
                kept = chunk.indices[r] >= 0
                results.append(Recommendations(ids[chunk.indices[r][kept]], chunk.scores[r][kept],
                                               int(n_unknown[chunk.start + r]), bool(chunk.fallback[r])))
        return results

    def recommend(self, session_items: Iterable[Any], k: int = 20, *, exclude_seen: bool = False,
                  times: Sequence[float] | None = None) -> Recommendations:
        """Top-``k`` next items for one session given the items clicked so far (oldest first)
        and, for a model with click context, their unix times (see :meth:`recommend_batch`)."""
        return self.recommend_batch([list(session_items)], k, exclude_seen=exclude_seen,
                                    times=None if times is None else [list(times)])[0]

    def score_sessions(self, sessions: Sequence[Iterable[Any]], times: Sequence[Sequence[float]] | None = None) -> np.ndarray:
        """The model's scores of every item (B×N, columns in :attr:`catalogue` order) after each session,
        without the repeat boost (:meth:`recommend_batch` ranks with it). Unknown item ids are
        skipped with one warning that counts them, as in :meth:`recommend_batch`; a session with
        no known item is an error. ``times``: the clicks' times, as :meth:`recommend_batch` takes them."""
        items, offsets, _, known_times = self._flatten_nonempty(sessions, "to be scored", times)
        engine = self.engine()
        result = np.empty((len(offsets) - 1, engine.n_items), dtype=np.float32)
        for start, scores in engine.session_scores(items, offsets, known_times):
            result[start : start + len(scores)] = scores.float().cpu().numpy()
        return result

    def session_embeddings(self, sessions: Sequence[Iterable[Any]], times: Sequence[Sequence[float]] | None = None) -> np.ndarray:
        """The final hidden state of each session (B×L float32): the last layer's output after
        its known items, from a zero state — ``score_sessions(s)`` is
        ``session_embeddings(s) @ Wyᵀ + By``. Unknown items are skipped with a counted warning; a
        session with no known item is an error. ``times``: the clicks' times, as
        :meth:`recommend_batch` takes them."""
        items, offsets, _, known_times = self._flatten_nonempty(sessions, "for its embedding", times)
        engine = self.engine()
        result = np.empty((len(offsets) - 1, engine.sizes[-1]), dtype=np.float32)
        for start, out in engine.outputs(items, offsets, known_times):
            result[start : start + len(out)] = out.float().cpu().numpy()
        return result

    def predict_next_batch(self, session_ids: Sequence[Any], input_item_ids: Sequence[Any],
                           predict_for_item_ids: Sequence[Any] | None = None) -> pd.DataFrame:
        """The original's streaming API: one hidden state per batch position, reset whenever the
        session id at that position changes (the engine holds them: :meth:`Engine.predict_next
        <gru4rec.inference.Engine.predict_next>`). Returns the model's scores (without the repeat
        boost) as a DataFrame (items × positions).

        An unknown input item leaves that position's state unchanged (with a warning), and its
        column holds the scores of that kept state: the scores the previous call returned there
        for the same session, or those of a zero state (the item biases) for a new one."""
        self._parts()
        item_map = self.catalogue
        assert item_map is not None
        idx = item_map.index_of(list(input_item_ids))
        if (idx < 0).any():
            warnings.warn(f"{int((idx < 0).sum())} unknown input item id(s): their positions keep their state", stacklevel=2)
        scores = self.engine().predict_next(np.asarray(session_ids), idx)
        columns = item_map.ids
        if predict_for_item_ids is not None:
            cols = item_map.index_of(np.asarray(predict_for_item_ids))
            if (cols < 0).any():
                raise Gru4RecError(f"{int((cols < 0).sum())} of predict_for_item_ids are not known items")
            scores = scores[:, torch.from_numpy(cols).to(self.device)]
            columns = np.asarray(predict_for_item_ids)
        return pd.DataFrame(scores.t().cpu().numpy(), index=columns)


def load(path: str | os.PathLike[str], *, device: str | torch.device = "auto") -> GRU4Rec:
    """Load a model file written by :meth:`GRU4Rec.save`."""
    return GRU4Rec.load(path, device=device)
