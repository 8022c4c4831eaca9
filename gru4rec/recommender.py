"""The GRU4Rec recommender: ``fit`` on click sessions, ``recommend`` for live sessions, ``save``/``load``.

    >>> model = GRU4Rec(Config.from_file("paramfiles/rsc15_xe_shared_100_best.py")).fit("train.tsv")
    >>> model.recommend([214834865, 214706441], k=20).item_ids

Everything a trained model needs travels in one file (``save``): the weights, the config, the
item map and the item supports; loading needs neither the training data nor pickle.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from gru4rec import checkpoint
from gru4rec.config import Config
from gru4rec.devices import resolve_device
from gru4rec.data import ItemMap, Sessions, index_sessions, item_support, read_events, sessions_from_events, validate_events
from gru4rec.data.overlap import TrainingFingerprint, warn_overlap
from gru4rec.errors import Gru4RecError, ModelFileError
from gru4rec.inference import Engine, require_fitted
from gru4rec.model import GRU4RecNet
from gru4rec.resources import peak_device_memory_mb, peak_host_memory_mb
from gru4rec.threads import using_threads
from gru4rec.training.loop import EpochStats, train_epochs
from gru4rec.training.precision import check_precision
from gru4rec.training.resume import TrainingCheckpoint
from gru4rec.training.trainer import Trainer
from gru4rec.validation import Validator, check_patience, parse_metric
from gru4rec.warm_start import carry_optimizer_state, check_same_network, grow_item_map, warm_net

__all__ = ["GRU4Rec", "EpochInfo", "Recommendations", "load"]

log = logging.getLogger(__name__)

MODEL_KIND = "gru4rec-model"
#: Prefix of the optimiser-state tensors in a model file saved with ``optimizer=True``.
OPTIMIZER_PREFIX = "optimizer."


@dataclass(frozen=True)
class _Base:
    """What a warm start takes from the model it starts from (``fit(init_from=...)``)."""

    name: str
    net: GRU4RecNet
    item_map: ItemMap
    optimizer_state: dict[str, torch.Tensor] | None
    config: Config
    train_fingerprint: TrainingFingerprint | None


@dataclass
class EpochInfo:
    """Passed to the ``fit`` callback after every epoch. Raising in the callback stops training.

    ``valid``: the validation metrics after this epoch (``{'recall@20': ..., 'mrr@20': ...,
    'ndcg@20': ...}``) and ``best_epoch`` the best epoch so far, when ``fit`` validates;
    ``peak_host_mb`` / ``peak_device_mb``: the process's peak resident memory and (on CUDA)
    the peak memory torch allocated, so far, in MiB (:mod:`gru4rec.resources`).
    """

    epoch: int
    loss: float
    seconds: float
    events_per_s: float
    mb_per_s: float
    model: "GRU4Rec" = field(repr=False)
    valid: dict[str, float] | None = None
    best_epoch: int | None = None
    peak_host_mb: float = 0.0
    peak_device_mb: float | None = None


@dataclass
class Recommendations:
    """Top-k items for one session and their raw scores. ``fallback`` is True when no item of
    the session was known and the most popular items were returned instead; their ``scores``
    are then NaN (the model scored nothing)."""

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
    when set (:mod:`gru4rec.threads`). On a machine where other processes keep cores busy, fewer
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
        self._live: tuple[np.ndarray, list[torch.Tensor]] | None = None
        self._engine: Engine | None = None

    def __repr__(self) -> str:
        state = f"{len(self.item_map)} items, {self.epochs_trained} epochs" if self.item_map is not None else "not fitted"
        precision = f", precision='{self.precision}'" if self.precision != "float32" else ""
        return f"GRU4Rec({self.config.to_param_string(only_changed=True)!r}, device='{self.device}'{precision}, {state})"

    # ------------------------------------------------------------------ training

    def _events(self, data: pd.DataFrame | str | os.PathLike[str]) -> pd.DataFrame:
        c = self.config
        keys = dict(session_key=c.session_key, item_key=c.item_key, time_key=c.time_key)
        if isinstance(data, pd.DataFrame):
            return validate_events(data, source="<DataFrame>", **keys)
        return read_events(data, **keys)

    def _sessions(self, events: pd.DataFrame, *, drop_unknown: bool, order: str) -> tuple[Sessions, int]:
        assert self.item_map is not None
        c = self.config
        return sessions_from_events(
            events, self.item_map, session_key=c.session_key, item_key=c.item_key, time_key=c.time_key,
            order=order, drop_unknown=drop_unknown,  # type: ignore[arg-type]
        )

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
        init_from: "GRU4Rec | str | os.PathLike[str] | None" = None,
    ) -> "GRU4Rec":
        """Train on ``data`` (DataFrame or file with session, item and time columns): from scratch,
        or from a trained model with ``init_from`` (a ``GRU4Rec`` or a model file).

        ``init_from`` (a warm start, :mod:`gru4rec.warm_start`): the model's weights are the
        starting point; its items keep their indices and rows, the new data's new items get
        fresh rows; its optimiser state is carried when it has one (``optimizer_state``; a file
        saved with ``optimizer=True``); the network fields of the config must equal the model's
        (else :class:`~gru4rec.errors.ConfigError`), training fields may differ; the item
        supports (sampling, fallback) are the new data's.

        ``valid`` (DataFrame or file): evaluate on it after every epoch at ``valid_cutoffs`` with
        ``valid_mode`` ties (:mod:`gru4rec.validation`); ``early_stop=P`` stops when ``metric``
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
        """
        c = self.config
        chosen = parse_metric(metric)  # bad validation arguments fail before any data is read
        check_patience(early_stop)
        if early_stop is not None and valid is None:
            raise Gru4RecError("early_stop needs valid= (the events to validate on)")
        callbacks = [] if callback is None else [callback] if callable(callback) else list(callback)
        if checkpoint_dir is None and (resume or checkpoint_every is not None):
            raise Gru4RecError(f"{'resume=True' if resume else 'checkpoint_every'} needs checkpoint_dir (where the checkpoint is)")
        ckpt = TrainingCheckpoint(checkpoint_dir, resume=resume, every_minutes=checkpoint_every) if checkpoint_dir is not None else None
        base: _Base | None = None
        if init_from is not None:
            source = init_from if isinstance(init_from, GRU4Rec) else GRU4Rec.load(init_from, device=self.device)
            old_net, old_map, _ = source._parts()
            # Taken before anything is assigned: init_from may be this very model.
            base = _Base("the given model" if source is init_from else str(init_from), old_net, old_map, source.optimizer_state, source.config,
                         source.train_fingerprint)
            check_same_network(base.config, c, base.name)
        events = self._events(data)
        self.item_map = ItemMap.from_ids(events[c.item_key]) if base is None else grow_item_map(base.item_map, events[c.item_key])
        sessions, _ = self._sessions(events, drop_unknown=False, order="time" if c.time_sort else "id")
        self.item_support = item_support(sessions.items, len(self.item_map))
        del events
        # A warm-started model was trained on the base model's data too (its item indices are kept).
        fingerprint = TrainingFingerprint.of(sessions)
        if base is not None and base.train_fingerprint is not None:
            fingerprint = fingerprint.merged(base.train_fingerprint)
        self.train_fingerprint = fingerprint
        validator = None
        if valid is not None:
            valid_sessions, _ = self._sessions(self._events(valid), drop_unknown=True, order="id")
            warn_overlap(fingerprint, valid_sessions, f"the validation data {valid}" if isinstance(valid, (str, os.PathLike)) else "the validation data")
            validator = Validator(self, valid_sessions, metric=chosen, cutoffs=valid_cutoffs, mode=valid_mode, patience=early_stop)

        with using_threads(self.threads):
            torch.manual_seed(c.seed)
            init_gen = torch.Generator().manual_seed(c.seed)
            if base is None:
                self.net = GRU4RecNet(len(self.item_map), c, generator=init_gen).to(self.device).eval()
            else:
                self.net = warm_net(base.net, len(self.item_map), c, generator=init_gen).to(self.device).eval()
                log.info("Warm start from %s: %d items kept, %d new", base.name, len(base.item_map), len(self.item_map) - len(base.item_map))
            trainer = Trainer(self.net, c, self.item_support, precision=self.precision)
            log.debug("training backend: %s", trainer.backend.describe())
            if base is not None:
                carry_optimizer_state(trainer.optimizer, base.optimizer_state, base.config, len(base.item_map), base.name)
            rng = np.random.default_rng(c.seed + 3)
            start = ckpt.attach(trainer, c, self._fingerprint(sessions), extra=validator) if ckpt is not None else None
            self.history = []
            self.epochs_trained = start.epoch - 1 if start is not None else 0
            # Validation runs inside the loop, after an epoch and before its checkpoint, so that
            # the checkpoint of epoch e holds the validation of epoch e.
            scores: dict[int, dict[str, float]] = {}
            validate = None if validator is None else (lambda stats: scores.__setitem__(stats.epoch, validator.after_epoch(stats.epoch)))
            stopped = validator is not None and validator.should_stop  # resumed after it had stopped early
            with ckpt.catching_signals() if ckpt is not None else contextlib.nullcontext():
                epochs = () if stopped else train_epochs(trainer, sessions.items, sessions.offsets, rng=rng, progress=progress,
                                                         start=start, checkpoints=ckpt, on_epoch_end=validate)
                for stats in epochs:
                    self.epochs_trained = stats.epoch
                    self.history.append(stats)
                    info = EpochInfo(
                        stats.epoch, stats.loss, stats.seconds, stats.events_per_s, stats.mb_per_s, self,
                        valid=scores.get(stats.epoch), best_epoch=validator.best_epoch if validator is not None else None,
                        peak_host_mb=peak_host_memory_mb(), peak_device_mb=peak_device_memory_mb(self.device),
                    )
                    for observer in callbacks:
                        observer(info)
                    if validator is not None and validator.should_stop:
                        break
        if validator is not None:
            self.valid_history = list(validator.history)
            self.best_epoch = validator.finish()
            if early_stop is not None and self.best_epoch is not None:
                self.epochs_trained = self.best_epoch  # the weights are that epoch's
        # Views into the trainer's tables: kept so that a warm start from this model carries them.
        # (After early stopping the weights are the best epoch's, the state the last epoch's.)
        self.optimizer_state = trainer.optimizer.state_dict()
        if ckpt is not None and not keep_checkpoint:
            ckpt.remove()
        return self

    def _fingerprint(self, sessions: Sessions) -> dict[str, Any]:
        """What a resumed run's data must match (:class:`~gru4rec.training.resume.TrainingCheckpoint`)."""
        assert self.item_map is not None
        return {"n_items": len(self.item_map), "n_events": int(sessions.n_events), "n_sessions": int(sessions.n_sessions)}

    # ------------------------------------------------------------------ model files

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False, optimizer: bool = False) -> None:
        """Write the model to one file (atomic; an existing file is kept unless ``overwrite``).

        ``optimizer``: also write the optimiser's state (``optimizer_state``), so that a warm
        start from the file continues it; the file is then about 2-4 times larger (one table
        per state per item table), which a server does not need."""
        net, item_map, support = self._parts()
        if optimizer and self.optimizer_state is None:
            raise Gru4RecError("this model has no optimiser state to save (it was loaded from a file saved without it)")
        tensors = {k: v for k, v in net.state_dict().items()}
        tensors["item_support"] = torch.from_numpy(support)
        if optimizer:
            assert self.optimizer_state is not None
            tensors.update({OPTIMIZER_PREFIX + k: v for k, v in self.optimizer_state.items()})
        meta = {"kind": MODEL_KIND, "config": self.config.to_dict(), "item_ids": item_map.to_list(), "epochs_trained": self.epochs_trained}
        if self.train_fingerprint is not None:
            meta["train_transitions"] = self.train_fingerprint.to_meta()
        checkpoint.save_file(path, tensors, meta, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str | torch.device = "auto") -> "GRU4Rec":
        """Read a model written by :meth:`save`. Never executes code from the file."""
        tensors, meta = checkpoint.load_file(path)
        if meta.get("kind") != MODEL_KIND:
            raise ModelFileError(f"{path} is not a gru4rec model file (kind {meta.get('kind')!r})")
        try:
            model = cls(Config.from_dict(meta["config"]), device=device)
            model.item_map = ItemMap.from_list(meta["item_ids"])
            model.item_support = tensors.pop("item_support").numpy().astype(np.int64)
            state = {k[len(OPTIMIZER_PREFIX):]: tensors.pop(k) for k in [k for k in tensors if k.startswith(OPTIMIZER_PREFIX)]}
            model.optimizer_state = state or None  # kept on the CPU: only a warm start reads it
            net = GRU4RecNet(len(model.item_map), model.config)
            net.load_state_dict(tensors)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ModelFileError(f"{path} does not hold a consistent gru4rec model: {exc}") from exc
        model.net = net.to(model.device).eval()
        model.epochs_trained = int(meta.get("epochs_trained", 0))
        model.train_fingerprint = TrainingFingerprint.from_meta(meta.get("train_transitions"))  # None in older files
        return model

    # ------------------------------------------------------------------ the SessionModel protocol

    @property
    def fitted(self) -> bool:
        """Whether the model is trained (or loaded): it has a network, an item map and supports."""
        return self.net is not None and self.item_map is not None and self.item_support is not None

    def _parts(self) -> tuple[GRU4RecNet, ItemMap, np.ndarray]:
        item_map, support = require_fitted(self)
        assert self.net is not None
        return self.net, item_map, support

    def init_state(self, batch_size: int) -> list[torch.Tensor]:
        """Zero states of ``batch_size`` fresh sessions: one B×L_i tensor per GRU layer."""
        return self._parts()[0].init_hidden(batch_size)

    @torch.no_grad()
    def step(self, items: torch.Tensor, state: list[torch.Tensor]) -> torch.Tensor:
        """One GRU step of every row (item indices ``items``), in place; returns the last layer's
        output, which is ``state[-1]``. Never trains: the network stays in evaluation mode."""
        return self._parts()[0].step(items, state)

    @torch.no_grad()
    def scores(self, out: torch.Tensor, buffer: torch.Tensor | None = None) -> torch.Tensor:
        """Raw scores of every item after the outputs ``out``: ``out·Wyᵀ + By`` (B×N)."""
        return self._parts()[0].score_all(out, buffer=buffer)

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Wy, By)``: the scores are ``out·Wyᵀ + By``."""
        net = self._parts()[0]
        return net.Wy, net.By

    def engine(self) -> Engine:
        """The inference engine of this model (:class:`gru4rec.inference.Engine`, float32 scores),
        built on first use and again when ``fit``/``load`` gave the model a new item map and supports."""
        _, item_map, support = self._parts()
        engine = self._engine
        if engine is None or engine.item_map is not item_map or engine.item_support is not support:
            self._engine = engine = Engine(self)
        return engine

    # ------------------------------------------------------------------ recommendations

    def _flatten(self, sessions: Sequence[Iterable[Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sessions' known item indices (flat), their offsets and each session's number of
        unknown ids — one lookup for all ids, with one warning (to the caller of the public
        method) that counts the skipped ids."""
        _, item_map, _ = self._parts()
        lists = [list(s) for s in sessions]
        lengths = np.array([len(s) for s in lists], dtype=np.int64)
        items, offsets, n_unknown = index_sessions(item_map, [i for s in lists for i in s],
                                                   np.repeat(np.arange(len(lists)), lengths), len(lists))
        if n_unknown.any():
            warnings.warn(f"{int(n_unknown.sum())} unknown item id(s) skipped in {int((n_unknown > 0).sum())} session(s)", stacklevel=3)
        return items, offsets, n_unknown

    def _flatten_nonempty(self, sessions: Sequence[Iterable[Any]], purpose: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_flatten` where every session needs at least one known item."""
        items, offsets, _ = self._flatten(sessions)
        empty = np.flatnonzero(np.diff(offsets) == 0)
        if len(empty):
            raise Gru4RecError(f"every session needs at least one known item {purpose}; session(s) at position "
                               f"{', '.join(map(str, empty[:5].tolist()))} have none")
        return items, offsets

    def recommend_batch(self, sessions: Sequence[Iterable[Any]], k: int = 20, *, exclude_seen: bool = False) -> list[Recommendations]:
        """Top-``k`` items for each session (the items clicked so far, oldest first).

        Unknown item ids are skipped with one warning that counts them; a session with no known
        item gets the most popular items, flagged ``fallback=True``, with NaN scores. With
        ``exclude_seen`` a session's own items are never recommended (a session may then get
        fewer than ``k``). Sessions run in chunks (:class:`gru4rec.inference.Engine`): memory
        is bounded by the chunk, not by the number of sessions.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        items, offsets, n_unknown = self._flatten(sessions)
        ids = self._parts()[1].ids
        results: list[Recommendations] = []
        for chunk in self.engine().recommend(items, offsets, k, exclude_seen=exclude_seen):
            for r in range(len(chunk.fallback)):
                kept = chunk.indices[r] >= 0
                results.append(Recommendations(ids[chunk.indices[r][kept]], chunk.scores[r][kept],
                                               int(n_unknown[chunk.start + r]), bool(chunk.fallback[r])))
        return results

    def recommend(self, session_items: Iterable[Any], k: int = 20, *, exclude_seen: bool = False) -> Recommendations:
        """Top-``k`` next items for one session given the items clicked so far (oldest first)."""
        return self.recommend_batch([list(session_items)], k, exclude_seen=exclude_seen)[0]

    def score_sessions(self, sessions: Sequence[Iterable[Any]]) -> np.ndarray:
        """Raw scores of every item (B×N, columns in item-map order) after each session.
        Unknown item ids are skipped with one warning that counts them, as in
        :meth:`recommend_batch`; a session with no known item is an error."""
        items, offsets = self._flatten_nonempty(sessions, "to be scored")
        engine = self.engine()
        result = np.empty((len(offsets) - 1, engine.n_items), dtype=np.float32)
        with torch.inference_mode():
            for start, out in engine.outputs(items, offsets):
                result[start : start + len(out)] = self.scores(out).float().cpu().numpy()
        return result

    def session_embeddings(self, sessions: Sequence[Iterable[Any]]) -> np.ndarray:
        """The final hidden state of each session (B×L float32): the last layer's output after
        its known items, from a zero state — ``score_sessions(s)`` is
        ``session_embeddings(s) @ Wyᵀ + By``. Unknown items are skipped with a counted warning; a
        session with no known item is an error."""
        items, offsets = self._flatten_nonempty(sessions, "for its embedding")
        engine = self.engine()
        result = np.empty((len(offsets) - 1, engine.sizes[-1]), dtype=np.float32)
        for start, out in engine.outputs(items, offsets):
            result[start : start + len(out)] = out.float().cpu().numpy()
        return result

    @torch.inference_mode()
    def predict_next_batch(self, session_ids: Sequence[Any], input_item_ids: Sequence[Any], predict_for_item_ids: Sequence[Any] | None = None) -> pd.DataFrame:
        """The original's streaming API: one hidden state per batch position, reset whenever the
        session id at that position changes. Returns scores as a DataFrame (items × positions).

        An unknown input item leaves that position's state unchanged (with a warning), and its
        column holds the scores of that kept state: the scores the previous call returned there
        for the same session, or those of a zero state (the item biases) for a new one."""
        _, item_map, _ = self._parts()
        engine = self.engine()
        session_ids = np.asarray(session_ids)
        idx = item_map.index_of(list(input_item_ids))
        batch = len(session_ids)
        if self._live is None or len(self._live[0]) != batch:
            self._live = (np.full(batch, None, dtype=object), self.init_state(batch))
        previous, state = self._live
        changed = torch.from_numpy(session_ids.astype(object) != previous).to(self.device).unsqueeze(1)
        for s in state:
            s.masked_fill_(changed, 0.0)
        if (idx < 0).any():
            warnings.warn(f"{int((idx < 0).sum())} unknown input item id(s): their positions keep their state", stacklevel=2)
        out = engine.step_known(state, idx)
        self._live = (session_ids.astype(object), state)
        scores = self.scores(out)
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
