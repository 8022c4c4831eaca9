"""Serving a new model without downtime: the model file is loaded again on SIGHUP, or when
``--watch`` sees it replaced, checked, and switched in between two micro-batches.

A reload reads the file (its checksums verified by :mod:`gru4rec.formats.checkpoint`), checks that every
weight is finite and that one click through the new model scores finitely, builds its engine
(the int8 copy included) — all on a thread of its own while the old model keeps serving — and
hands the engine to the batcher (:meth:`MicroBatcher.swap`), whose worker switches before its next
batch. A file that fails any check is refused with one log line, and the old model keeps
serving. An unchanged file (same SHA-256) is not reloaded.

Live sessions keep their hidden state when the new model keeps the old one's layers and the old
items at their indices (:meth:`Engine.keeps_states_of`: a warm start does); otherwise the store
moves to the new model's namespace and every session starts afresh (``"new_session": true`` on
its next click). Replace the file atomically (write a temporary file, then rename it over the
served one): ``gru4rec train --save`` does. ``--watch`` compares the file's inode, size and
modification time every ``watch_s`` seconds.

**A refused file is a trap**: the old model serves on from memory, but the file on disk is the
broken one, and the next restart would fail on it. Until a good file arrives (or the served
one is put back), :attr:`ModelReloader.stale` holds the reason: ``/healthz`` and ``/v1/model``
report ``"stale": true`` with it, the app logs a warning with every activity line, and
``--watch`` keeps watching the file and tries every replacement.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from gru4rec.errors import Gru4RecError
from gru4rec.inference import Engine, Work
from gru4rec.recommender import GRU4Rec
from gru4rec.serve.batcher import MicroBatcher
from gru4rec.serve.settings import ServeSettings

__all__ = ["ModelReloader", "file_sha256"]

log = logging.getLogger(__name__)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (what ``/v1/model`` shows)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_model_file(path: Path, device: str) -> tuple[GRU4Rec, str]:
    """The model in ``path`` and the file's sha256, read again when the file was replaced while
    it was read (three tries). The optimiser state a file may hold for warm starts is dropped:
    a server never reads it."""
    for _ in range(3):
        checksum = file_sha256(path)
        model = GRU4Rec.load(path, device=device)
        if file_sha256(path) == checksum:
            model.optimizer_state = None
            return model, checksum
    raise Gru4RecError(f"{path} kept changing while it was read")


class ModelReloader:
    """Reloads the served model file into ``batcher`` (see the module docstring).

    :meth:`request` (the SIGHUP handler) starts a reload on a thread and returns at once;
    :meth:`reload` does one synchronously and says whether the model changed; :meth:`start_watching`
    polls the file. ``engine_for(model, checksum, file)`` builds an engine as the app does.
    """

    def __init__(self, path: str | os.PathLike[str], batcher: MicroBatcher, settings: ServeSettings,
                 engine_for: Callable[[GRU4Rec, str, str], Engine]) -> None:
        self.path = Path(path)
        self.batcher, self.settings, self.engine_for = batcher, settings, engine_for
        self.reloads = 0
        self.refused = 0
        #: Why the file on disk is not the served model (its last reload was refused), or None.
        self.stale: str | None = None
        self._lock = threading.Lock()  # one reload at a time
        self._stop = threading.Event()
        self._seen = _signature(self.path)
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ triggers

    def request(self) -> None:
        """Reload soon, on a thread of its own (safe to call from a signal handler)."""
        threading.Thread(target=self._reload_logged, name="gru4rec-reload", daemon=True).start()

    def start_watching(self, interval_s: float) -> None:
        """Check every ``interval_s`` seconds whether the file was replaced, and reload it then."""
        self._watcher = threading.Thread(target=self._watch, args=(interval_s,), name="gru4rec-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop watching (a reload in progress finishes)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5)
            self._watcher = None

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            now = _signature(self.path)
            if now is not None and now != self._seen:
                self._seen = now
                self._reload_logged()

    def _reload_logged(self) -> None:
        try:
            self.reload()
        except Exception:  # noqa: BLE001 - a reload thread must never take the server down
            log.exception("reloading %s failed; the previous model keeps serving", self.path)

    # ------------------------------------------------------------------ the reload

    def reload(self) -> bool:
        """Load, check and switch to the file's model; False when it was refused or unchanged.
        A request during a reload waits for it, then reads the file again (unchanged: one hash)."""
        with self._lock:
            return self._reload_once()

    def _reload_once(self) -> bool:
        current = self.batcher.engine
        try:
            engine = self._load_checked(current)
        except (Gru4RecError, OSError, ValueError, RuntimeError) as exc:
            self.refused += 1
            self.stale = f"the new model in {self.path} was refused: {_one_line(exc)}"
            log.warning("Refused the new model in %s: %s; still serving sha256 %s", self.path, _one_line(exc), current.checksum[:12])
            return False
        if engine is None:
            if self.stale is not None:
                log.info("Model file %s is the served model again (sha256 %s)", self.path, current.checksum[:12])
            else:
                log.info("Model file %s is unchanged (sha256 %s); nothing to reload", self.path, current.checksum[:12])
            self.stale = None
            return False
        keep = engine.keeps_states_of(current)
        # The flag clears before the swap becomes visible: /v1/model must never show the good
        # file's checksum beside the refused file's reason (a failed swap puts the reason back).
        stale, self.stale = self.stale, None
        try:
            self.batcher.swap(engine, keep_sessions=keep, namespace=engine.checksum[:16]).result(timeout=60)
        except BaseException:
            self.stale = stale
            raise
        self.reloads += 1
        log.info("Now serving %s: sha256 %s, %d items (%+d), epochs_trained %d; live sessions %s", self.path, engine.checksum[:12],
                 engine.n_items, engine.n_items - current.n_items, getattr(engine.model, "epochs_trained", -1),
                 "kept" if keep else "start afresh (another architecture or item map)")
        return True

    def _load_checked(self, current: Engine) -> Engine | None:
        """The checked engine of the file's model, or None when the file is the served one."""
        if file_sha256(self.path) == current.checksum:
            return None
        model, before = read_model_file(self.path, self.settings.device)
        assert model.net is not None  # loaded
        bad = [name for name, p in model.net.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise Gru4RecError(f"weights that are not finite in {', '.join(bad)}")
        engine = self.engine_for(model, before, str(self.path))
        probe = engine.run([Work(None, np.zeros(1, dtype=np.int64), 1)])[0]
        if probe.scores is None or not np.isfinite(probe.scores).all():
            raise Gru4RecError("one click through the new model does not give finite scores")
        return engine


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
