"""Evaluation data that the model was trained on: the share of a validation or test set's
prediction targets that repeat a training transition of the same session.

A validation or test set must hold sessions the model has not seen. When its sessions are also
in the training data (``train_full`` validated on its own last sessions, ``train_valid``), the
figures measure memory, not prediction, and early stopping selects on a leak. A *transition* is
one prediction target: ``(session id, previous item, item)`` for every event but a session's
first. The overlap is the share of the evaluation set's transitions that also occur in the
training data: 0 for a time split, 1 when the evaluation sessions are training sessions; a
session id reused for an unrelated session matches only where its items match too.

Memory stays bounded, whatever the size of the training data: :class:`TrainingFingerprint` keeps
64-bit hashes of at most :data:`MAX_KEPT` distinct training transitions — those with the smallest
hashes (a bottom-k sample: deterministic, and the same transitions are chosen from any data set
that holds them). An evaluation transition is *checked* when its hash is at most the largest kept
one, :attr:`TrainingFingerprint.threshold`; the share among the checked transitions estimates the
share among all, and is exact when every training transition was kept (``threshold`` is then
2**64 - 1 and every transition is checked). The fingerprint travels in the model file
(:meth:`~TrainingFingerprint.to_meta`, about 700 kB at most), so that ``gru4rec evaluate MODEL
TEST`` can check without the training data.

The warning (:func:`warn_overlap`) is a WARNING record of this module's logger (the package's
log facility, :mod:`gru4rec.log`) whose message is a :class:`DataLeakWarning`; a check made once
for many evaluations (a paropt study) silences the per-evaluation checks with :func:`checked_once`.
"""
from __future__ import annotations

import base64
import contextlib
import contextvars
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.data.items import ItemMap
from gru4rec.data.sessions import Sessions, sessions_from_events
from gru4rec.errors import DataLeakWarning

__all__ = [
    "MAX_KEPT", "WARN_SHARE", "Overlap", "TrainingFingerprint", "checked_once", "paired_sessions", "transition_hashes",
    "warn_overlap",
]

log = logging.getLogger(__name__)

#: The most training transitions a fingerprint keeps (8 bytes each in memory and in the file).
MAX_KEPT = 65_536
#: The overlap from which evaluating on the data is called a leak.
WARN_SHARE = 0.01
#: The threshold of a fingerprint that kept every transition: every hash is checked.
_ALL = (1 << 64) - 1
#: Events hashed at once: the temporary arrays stay a few tens of MB, whatever the data's size.
CHUNK_EVENTS = 1 << 20

_MIX1, _MIX2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)

_skip: contextvars.ContextVar[bool] = contextvars.ContextVar("gru4rec_overlap_checked", default=False)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic): a bijection that spreads
    every input bit over the output."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _chunks(sessions: Sessions) -> Iterator[Sessions]:
    """``sessions`` as consecutive runs of whole sessions of about :data:`CHUNK_EVENTS` events each (views)."""
    events = CHUNK_EVENTS
    offsets = np.asarray(sessions.offsets, dtype=np.int64)
    start = 0
    while start < len(offsets) - 1:
        stop = max(int(np.searchsorted(offsets, offsets[start] + events, side="right")) - 1, start + 1)
        stop = min(stop, len(offsets) - 1)
        yield Sessions(sessions.items[offsets[start]:offsets[stop]], offsets[start:stop + 1] - offsets[start],
                       sessions.session_ids[start:stop])
        start = stop


def transition_hashes(sessions: Sessions) -> np.ndarray:
    """uint64 hashes of ``sessions``' transitions, ``(session id, previous item, item)`` for every
    event but a session's first, in order (vectorised). Items are the dense indices of one item
    map, so two Sessions are comparable when they were made with the same map (or a grown one)."""
    items = np.asarray(sessions.items, dtype=np.int64)
    lengths = np.diff(np.asarray(sessions.offsets, dtype=np.int64)).astype(np.int64)
    if len(items) < 2:
        return np.zeros(0, dtype=np.uint64)
    session_of = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    inside = session_of[1:] == session_of[:-1]  # event i+1 has a predecessor in its session
    ids = pd.util.hash_array(np.asarray(sessions.session_ids))  # stable across processes (fixed key)
    with np.errstate(over="ignore"):
        pair = _mix(items[:-1][inside].astype(np.uint64)) ^ _mix(items[1:][inside].astype(np.uint64) + _GOLDEN)
        return _mix(ids[session_of[1:][inside]] ^ _mix(pair))


@dataclass(frozen=True)
class Overlap:
    """How many of an evaluation set's transitions were checked and how many of those occur in
    the training data; ``share`` is the estimate (exact when ``n_checked == n_targets``)."""

    n_targets: int
    n_checked: int
    n_shared: int

    @property
    def share(self) -> float:
        """The share of the checked transitions that occur in the training data (0 when none was checked)."""
        return self.n_shared / self.n_checked if self.n_checked else 0.0

    @property
    def exact(self) -> bool:
        """Whether every transition was checked (the share is then a count, not an estimate)."""
        return self.n_checked == self.n_targets


@dataclass(frozen=True)
class TrainingFingerprint:
    """A bounded sample of the training transitions' hashes: every distinct hash ``<= threshold``
    (sorted, at most :data:`MAX_KEPT`)."""

    hashes: np.ndarray
    threshold: int

    @classmethod
    def of(cls, sessions: Sessions, *, limit: int = MAX_KEPT) -> TrainingFingerprint:
        """The fingerprint of the training ``sessions``: linear time (a partition per chunk, no
        full sort), memory bounded by a chunk of :data:`CHUNK_EVENTS` events and ``limit``."""
        fingerprint = cls(np.zeros(0, dtype=np.uint64), _ALL)
        for chunk in _chunks(sessions):
            fingerprint = fingerprint.merged(cls._bottom(transition_hashes(chunk), _ALL, limit), limit=limit)
        return fingerprint

    @classmethod
    def _bottom(cls, hashes: np.ndarray, threshold: int, limit: int) -> TrainingFingerprint:
        """The distinct ``hashes`` at most ``threshold``, cut to the ``limit`` smallest."""
        hashes = hashes[hashes <= np.uint64(threshold)]
        if len(hashes) > limit:
            threshold = int(np.partition(hashes, limit - 1)[limit - 1])
            hashes = hashes[hashes <= np.uint64(threshold)]
        return cls(np.unique(hashes), threshold)  # at most `limit`: copies of the cut value add none

    def merged(self, other: TrainingFingerprint, *, limit: int = MAX_KEPT) -> TrainingFingerprint:
        """The fingerprint of both training sets (a model trained on one, then on the other)."""
        threshold = min(self.threshold, other.threshold)
        return self._bottom(np.concatenate([self.hashes, other.hashes]), threshold, limit)

    def overlap(self, sessions: Sessions) -> Overlap:
        """How many of ``sessions``' transitions occur in the training data (see :class:`Overlap`)."""
        n_targets = n_checked = n_shared = 0
        for chunk in _chunks(sessions):
            hashes = transition_hashes(chunk)
            checked = hashes[hashes <= np.uint64(self.threshold)]
            n_targets, n_checked = n_targets + len(hashes), n_checked + len(checked)
            n_shared += int(np.count_nonzero(np.isin(checked, self.hashes)))
        return Overlap(n_targets=n_targets, n_checked=n_checked, n_shared=n_shared)

    def to_meta(self) -> dict[str, Any]:
        """The JSON form kept in a model file's metadata (the hashes as base64 little-endian bytes)."""
        return {"version": 1, "threshold": str(self.threshold),
                "hashes": base64.b64encode(self.hashes.astype("<u8").tobytes()).decode("ascii")}

    @classmethod
    def from_meta(cls, meta: Any) -> TrainingFingerprint | None:
        """The fingerprint from :meth:`to_meta`'s form; None for a file without one (or of an
        unknown version): the overlap cannot be checked."""
        if not isinstance(meta, dict) or meta.get("version") != 1:
            return None
        hashes = np.frombuffer(base64.b64decode(meta["hashes"]), dtype="<u8").astype(np.uint64)
        return cls(hashes, int(meta["threshold"]))


def paired_sessions(train: pd.DataFrame, evaluation: pd.DataFrame, *, session_key: str = "SessionId",
                    item_key: str = "ItemId", time_key: str = "Time") -> tuple[Sessions, Sessions, int]:
    """Validated training and evaluation events as Sessions in the training item map, the
    evaluation's unknown items dropped as the evaluator drops them; returns ``(train_sessions,
    evaluation_sessions, n_dropped)``."""
    item_map = ItemMap.from_ids(train[item_key])
    train_sessions, _ = sessions_from_events(train, item_map, order="id", session_key=session_key, item_key=item_key,
                                             time_key=time_key)
    evaluation_sessions, n_dropped = sessions_from_events(evaluation, item_map, order="id", drop_unknown=True,
                                                          session_key=session_key, item_key=item_key, time_key=time_key)
    return train_sessions, evaluation_sessions, n_dropped


@contextlib.contextmanager
def checked_once() -> Iterator[None]:
    """Skip :func:`warn_overlap` inside the block: the caller checked the data once for many
    evaluations (a paropt study's trials)."""
    token = _skip.set(True)
    try:
        yield
    finally:
        _skip.reset(token)


def warn_overlap(fingerprint: TrainingFingerprint | None, sessions: Sessions, what: str) -> Overlap | None:
    """Warn when ``sessions`` (``what``: e.g. "the validation data data/valid.tsv") share at least
    :data:`WARN_SHARE` of their transitions with the training data of ``fingerprint``; returns the
    overlap (None when there is no fingerprint, a model file written before it was kept, or
    inside :func:`checked_once`)."""
    if fingerprint is None or _skip.get():
        return None
    found = fingerprint.overlap(sessions)
    log.debug("Overlap of %s with the training data: %d of %d checked transitions (%d in all)",
              what, found.n_shared, found.n_checked, found.n_targets)
    if found.share >= WARN_SHARE:
        how = (f"{found.n_shared:,} of {found.n_targets:,}" if found.exact
               else f"estimated from {found.n_checked:,} of {found.n_targets:,}")
        log.warning(DataLeakWarning(
            f"{found.share:.1%} of the prediction targets of {what} (session id, previous item -> item; {how}) "
            "are in the training data: its figures measure memory, not prediction. Evaluate on sessions the "
            "model was not trained on (e.g. train on train_tr, validate on train_valid, test on test)"))
    return found
