"""The GRU4Rec recommender: ``fit`` on click sessions, ``recommend`` for live sessions, ``save``/``load``.

    >>> model = GRU4Rec(Config.from_file("paramfiles/rsc15_xe_shared_100_best.py")).fit("train.tsv")
    >>> model.recommend([214834865, 214706441], k=20).item_ids

Everything a trained model needs travels in one file (``save``): the weights, the config, the
item map and the item supports; loading needs neither the training data nor pickle.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from gru4rec import checkpoint
from gru4rec.config import Config
from gru4rec.data import ItemMap, Sessions, item_support, read_events, sessions_from_events, validate_events
from gru4rec.errors import Gru4RecError, ModelFileError
from gru4rec.model import GRU4RecNet
from gru4rec.training.loop import EpochStats, train_epochs
from gru4rec.training.precision import check_precision
from gru4rec.training.trainer import Trainer

__all__ = ["GRU4Rec", "EpochInfo", "Recommendations", "load", "resolve_device"]

log = logging.getLogger(__name__)

MODEL_KIND = "gru4rec-model"
CHECKPOINT_KIND = "gru4rec-training-checkpoint"
CHECKPOINT_NAME = "checkpoint.pt"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``'auto'`` picks CUDA when it is available, else the CPU; anything else is validated."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise Gru4RecError(f"unknown device {device!r} (use cpu, cuda, cuda:N or auto)") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise Gru4RecError(f"device {device!r} was asked for but CUDA is not available (use --device cpu)")
    return resolved


@dataclass
class EpochInfo:
    """Passed to the ``fit`` callback after every epoch. Raising in the callback stops training."""

    epoch: int
    loss: float
    seconds: float
    events_per_s: float
    mb_per_s: float
    model: "GRU4Rec" = field(repr=False)


@dataclass
class Recommendations:
    """Top-k items for one session. ``fallback`` is True when no item of the session was known
    and the most popular items were returned instead."""

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
    """

    def __init__(
        self,
        config: Config | str | Mapping[str, Any] | None = None,
        *,
        device: str | torch.device = "auto",
        precision: str = "float32",
        **overrides: Any,
    ) -> None:
        self.config = _as_config(config, overrides)
        self.device = resolve_device(device)
        check_precision(precision, self.device, warn=False)  # a bad name fails here; fit's Trainer warns
        self.precision = precision
        self.item_map: ItemMap | None = None
        self.item_support: np.ndarray | None = None
        self.net: GRU4RecNet | None = None
        self.epochs_trained = 0
        self.history: list[EpochStats] = []
        self._live: tuple[np.ndarray, list[torch.Tensor]] | None = None

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
        callback: Callable[[EpochInfo], Any] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        resume: bool = False,
        progress: bool = True,
    ) -> "GRU4Rec":
        """Train from scratch on ``data`` (DataFrame or file with session, item and time columns).

        ``callback(info)`` runs after every epoch. With ``checkpoint_dir`` the full training state
        is saved after every epoch; ``resume=True`` continues from the checkpoint there and ends
        with the same model as an uninterrupted run. ``progress``: a progress bar per epoch on a
        terminal. The per-epoch lines are logged at INFO by ``gru4rec.training.loop`` (see
        :mod:`gru4rec.log`).
        """
        c = self.config
        events = self._events(data)
        self.item_map = ItemMap.from_ids(events[c.item_key])
        sessions, _ = self._sessions(events, drop_unknown=False, order="time" if c.time_sort else "id")
        self.item_support = item_support(sessions.items, len(self.item_map))
        del events

        torch.manual_seed(c.seed)
        init_gen = torch.Generator().manual_seed(c.seed)
        self.net = GRU4RecNet(len(self.item_map), c, generator=init_gen).to(self.device)
        trainer = Trainer(self.net, c, self.item_support, precision=self.precision)
        rng = np.random.default_rng(c.seed + 3)
        first_epoch = 1
        ckpt_path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
        if ckpt_path is not None:
            _check_writable_dir(ckpt_path.parent)
            if resume and ckpt_path.exists():
                first_epoch = self._restore_checkpoint(ckpt_path, trainer, rng, sessions) + 1
                log.info("Resuming from %s after epoch %d", ckpt_path, first_epoch - 1)
        elif resume:
            raise Gru4RecError("resume=True needs checkpoint_dir (where the checkpoint is)")

        self.history = []
        self.epochs_trained = first_epoch - 1
        for stats in train_epochs(trainer, sessions.items, sessions.offsets, first_epoch=first_epoch, rng=rng, progress=progress):
            self.epochs_trained = stats.epoch
            self.history.append(stats)
            if ckpt_path is not None:
                self._save_checkpoint(ckpt_path, trainer, rng, sessions)
            if callback is not None:
                self.net.eval()
                callback(EpochInfo(stats.epoch, stats.loss, stats.seconds, stats.events_per_s, stats.mb_per_s, self))
        self.net.eval()
        return self

    # ------------------------------------------------------------------ resumable training state

    def _fingerprint(self, sessions: Sessions) -> dict[str, Any]:
        assert self.item_map is not None
        return {"n_items": len(self.item_map), "n_events": int(sessions.n_events), "n_sessions": int(sessions.n_sessions)}

    def _save_checkpoint(self, path: Path, trainer: Trainer, rng: np.random.Generator, sessions: Sessions) -> None:
        assert self.net is not None
        state = trainer.state_dict()
        tensors = {f"net.{k}": v for k, v in self.net.state_dict().items()}
        tensors.update({f"opt.{k}": v for k, v in state["optimizer"].items()})  # type: ignore[union-attr]
        tensors["rng.dropout"] = state["dropout_gen"]  # type: ignore[assignment]
        sampler = state["sampler"]
        if sampler:
            tensors["rng.sampler"] = sampler["generator"]  # type: ignore[index]
            tensors["sampler.store"] = sampler["store"]  # type: ignore[index]
        meta = {
            "kind": CHECKPOINT_KIND,
            "epoch": self.epochs_trained,
            "config": self.config.to_dict(),
            "data": self._fingerprint(sessions),
            "sampler_cursor": sampler["cursor"] if sampler else 0,  # type: ignore[index]
            "numpy_rng": rng.bit_generator.state,
        }
        checkpoint.save_file(path, tensors, meta, overwrite=True)

    def _restore_checkpoint(self, path: Path, trainer: Trainer, rng: np.random.Generator, sessions: Sessions) -> int:
        assert self.net is not None
        tensors, meta = checkpoint.load_file(path)
        if meta.get("kind") != CHECKPOINT_KIND:
            raise ModelFileError(f"{path} is not a gru4rec training checkpoint")
        # n_epochs may differ: a finished run can be resumed to train for more epochs.
        theirs = {k: v for k, v in meta["config"].items() if k != "n_epochs"}
        ours = {k: v for k, v in self.config.to_dict().items() if k != "n_epochs"}
        if theirs != ours:
            changed = sorted(k for k in ours if theirs.get(k) != ours[k])
            raise ModelFileError(
                f"{path} was written with other hyperparameters ({', '.join(changed)}); "
                "resume with the same ones or remove the checkpoint"
            )
        if meta["data"] != self._fingerprint(sessions):
            raise ModelFileError(f"{path} was written for other training data ({meta['data']}); resume on the same data or remove it")
        self.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
        state: dict[str, Any] = {
            "optimizer": {k[4:]: v for k, v in tensors.items() if k.startswith("opt.")},
            "dropout_gen": tensors["rng.dropout"],
            "sampler": {},
        }
        if "rng.sampler" in tensors:
            state["sampler"] = {"generator": tensors["rng.sampler"], "store": tensors["sampler.store"], "cursor": meta["sampler_cursor"]}
        trainer.load_state_dict(state)
        rng.bit_generator.state = meta["numpy_rng"]
        return int(meta["epoch"])

    # ------------------------------------------------------------------ model files

    def _require_fitted(self) -> tuple[GRU4RecNet, ItemMap, np.ndarray]:
        if self.net is None or self.item_map is None or self.item_support is None:
            raise Gru4RecError("the model is not trained yet: call fit() or GRU4Rec.load()")
        return self.net, self.item_map, self.item_support

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the model to one file (atomic; an existing file is kept unless ``overwrite``)."""
        net, item_map, support = self._require_fitted()
        tensors = {k: v for k, v in net.state_dict().items()}
        tensors["item_support"] = torch.from_numpy(support)
        meta = {"kind": MODEL_KIND, "config": self.config.to_dict(), "item_ids": item_map.to_list(), "epochs_trained": self.epochs_trained}
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
            net = GRU4RecNet(len(model.item_map), model.config)
            net.load_state_dict(tensors)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ModelFileError(f"{path} does not hold a consistent gru4rec model: {exc}") from exc
        model.net = net.to(model.device).eval()
        model.epochs_trained = int(meta.get("epochs_trained", 0))
        return model

    # ------------------------------------------------------------------ recommendations

    @torch.no_grad()
    def _final_states(self, sequences: list[np.ndarray]) -> torch.Tensor:
        """Last-layer output after feeding each sequence of item indices from a zero state (B×L)."""
        net, _, _ = self._require_fitted()
        net.eval()
        lengths = torch.tensor([len(s) for s in sequences], device=self.device)
        width = int(lengths.max()) if len(sequences) else 0
        padded = np.zeros((len(sequences), max(width, 1)), dtype=np.int64)
        for row, seq in enumerate(sequences):
            padded[row, : len(seq)] = seq
        items = torch.from_numpy(padded).to(self.device)
        hidden = net.init_hidden(len(sequences))
        out = torch.zeros(len(sequences), net.sizes[-1], device=self.device)
        for t in range(width):
            live = (lengths > t).unsqueeze(1)
            out = torch.where(live, _step_rows(net, items[:, t], hidden, live), out)
        return out

    def recommend_batch(self, sessions: Sequence[Iterable[Any]], k: int = 20, *, exclude_seen: bool = False) -> list[Recommendations]:
        """Top-``k`` items for each session (the items clicked so far, oldest first).

        Unknown item ids are skipped with one warning that counts them; a session with no known
        item gets the most popular items, flagged ``fallback=True``.
        """
        net, item_map, support = self._require_fitted()
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        k = min(k, len(item_map))
        indexed = [item_map.index_of(list(s)) for s in sessions]
        n_unknown = [int((idx < 0).sum()) for idx in indexed]
        known = [idx[idx >= 0] for idx in indexed]
        if sum(n_unknown):
            warnings.warn(f"{sum(n_unknown)} unknown item id(s) skipped in {sum(1 for n in n_unknown if n)} session(s)", stacklevel=2)
        results: list[Recommendations | None] = [None] * len(known)
        live_rows = [i for i, seq in enumerate(known) if len(seq)]
        popular = np.argsort(-support, kind="stable")[:k]
        for i, seq in enumerate(known):
            if not len(seq):
                results[i] = Recommendations(item_map.ids[popular], support[popular].astype(np.float32), n_unknown[i], True)
        if live_rows:
            out = self._final_states([known[i] for i in live_rows])
            with torch.no_grad():
                scores = net.score_all(out)
                if exclude_seen:
                    for row, i in enumerate(live_rows):
                        scores[row, torch.from_numpy(known[i]).to(self.device)] = -torch.inf
                top = torch.topk(scores, k, dim=1)
            top_scores, top_idx = top.values.cpu().numpy(), top.indices.cpu().numpy()
            for row, i in enumerate(live_rows):
                results[i] = Recommendations(item_map.ids[top_idx[row]], top_scores[row], n_unknown[i], False)
        return [r for r in results if r is not None]

    def recommend(self, session_items: Iterable[Any], k: int = 20, *, exclude_seen: bool = False) -> Recommendations:
        """Top-``k`` next items for one session given the items clicked so far (oldest first)."""
        return self.recommend_batch([list(session_items)], k, exclude_seen=exclude_seen)[0]

    def _known_items(self, sessions: Sequence[Iterable[Any]], purpose: str) -> list[np.ndarray]:
        """Each session's known item indices (unknown ids skipped); every session needs one."""
        _, item_map, _ = self._require_fitted()
        known = [idx[idx >= 0] for idx in (item_map.index_of(list(s)) for s in sessions)]
        if any(len(seq) == 0 for seq in known):
            raise Gru4RecError(f"every session needs at least one known item {purpose}")
        return known

    @torch.no_grad()
    def score_sessions(self, sessions: Sequence[Iterable[Any]]) -> np.ndarray:
        """Raw scores of every item (B×N, columns in item-map order) after each session."""
        net, _, _ = self._require_fitted()
        return net.score_all(self._final_states(self._known_items(sessions, "to be scored"))).cpu().numpy()

    @torch.no_grad()
    def session_embeddings(self, sessions: Sequence[Iterable[Any]], *, batch_size: int = 1024) -> np.ndarray:
        """The final hidden state of each session (B×L float32): the last layer's output after
        its known items, from a zero state — ``score_sessions(s)`` is
        ``session_embeddings(s) @ Wyᵀ + By``. Unknown items are skipped; a session with no known
        item is an error. Sessions run ``batch_size`` at a time, grouped by length."""
        net, _, _ = self._require_fitted()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        known = self._known_items(sessions, "for its embedding")
        out = np.empty((len(known), net.sizes[-1]), dtype=np.float32)
        by_length = np.argsort([len(seq) for seq in known], kind="stable")
        for start in range(0, len(known), batch_size):
            rows = by_length[start:start + batch_size]
            out[rows] = self._final_states([known[i] for i in rows]).float().cpu().numpy()
        return out

    @torch.no_grad()
    def predict_next_batch(self, session_ids: Sequence[Any], input_item_ids: Sequence[Any], predict_for_item_ids: Sequence[Any] | None = None) -> pd.DataFrame:
        """The original's streaming API: one hidden state per batch position, reset whenever the
        session id at that position changes. Returns scores as a DataFrame (items × positions).
        Unknown input items leave that position's state unchanged (with a warning)."""
        net, item_map, _ = self._require_fitted()
        session_ids = np.asarray(session_ids)
        idx = item_map.index_of(list(input_item_ids))
        batch = len(session_ids)
        if self._live is None or len(self._live[0]) != batch:
            self._live = (np.full(batch, None, dtype=object), net.init_hidden(batch))
        previous, hidden = self._live
        changed = torch.from_numpy(np.array([a != b for a, b in zip(session_ids, previous)])).to(self.device)
        for h in hidden:
            h.masked_fill_(changed.unsqueeze(1), 0.0)
        known = torch.from_numpy(idx >= 0).to(self.device).unsqueeze(1)
        if not bool(known.all()):
            warnings.warn(f"{int((idx < 0).sum())} unknown input item id(s): their positions keep their state", stacklevel=2)
        out = _step_rows(net, torch.from_numpy(np.maximum(idx, 0)).to(self.device), hidden, known)
        self._live = (session_ids.astype(object), hidden)
        scores = net.score_all(out)
        columns = item_map.ids
        if predict_for_item_ids is not None:
            cols = item_map.index_of(np.asarray(predict_for_item_ids))
            if (cols < 0).any():
                raise Gru4RecError(f"{int((cols < 0).sum())} of predict_for_item_ids are not known items")
            scores = scores[:, torch.from_numpy(cols).to(self.device)]
            columns = np.asarray(predict_for_item_ids)
        return pd.DataFrame(scores.t().cpu().numpy(), index=columns)


def _step_rows(net: GRU4RecNet, items: torch.Tensor, hidden: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``net.step`` for the rows where ``rows`` (B×1 bool) is true; the other rows keep their
    hidden state. Returns the step's output for all rows."""
    before = [h.clone() for h in hidden]
    out = net.step(items, hidden)
    for h, h_old in zip(hidden, before):
        h.copy_(torch.where(rows, h, h_old))
    return out


def _check_writable_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Gru4RecError(f"cannot create checkpoint folder {directory}: {exc.strerror}") from exc
    if not os.access(directory, os.W_OK):
        raise Gru4RecError(f"checkpoint folder {directory} is not writable")


def load(path: str | os.PathLike[str], *, device: str | torch.device = "auto") -> GRU4Rec:
    """Load a model file written by :meth:`GRU4Rec.save`."""
    return GRU4Rec.load(path, device=device)
