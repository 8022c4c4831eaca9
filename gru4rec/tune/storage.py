"""Where a study lives: an Optuna storage named by a URL, the ``--storage`` option or the
environment variable ``GRU4REC_OPTUNA_STORAGE``, by default a SQLite file ``paropt.db`` in the
output folder. Several processes, on one machine or many, share a study through its storage.
"""
from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

from gru4rec.errors import Gru4RecError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.settings import DEFAULT_OUT

__all__ = [
    "HEARTBEAT_GRACE_S",
    "HEARTBEAT_INTERVAL_S",
    "STORAGE_ENV",
    "open_storage",
    "redact",
    "resolve_storage_url",
]

#: Environment variable holding the default storage URL.
STORAGE_ENV = "GRU4REC_OPTUNA_STORAGE"
#: RDB storages get Optuna heartbeats, so that trials of a killed worker are marked FAIL once
#: they have been silent for the grace period (checked when a worker starts its next trial).
HEARTBEAT_INTERVAL_S = 60
HEARTBEAT_GRACE_S = 180
# Attempts at opening an RDB storage whose schema another worker is creating at the same time.
_STORAGE_ATTEMPTS = 8


def redact(url: str) -> str:
    """A storage URL fit for printing (password hidden)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def resolve_storage_url(url: str | None, out_dir: Path) -> str:
    """The storage URL that :func:`open_storage` opens for ``url`` (see there), without opening it."""
    url = url or os.environ.get(STORAGE_ENV) or ""
    if not url:
        return f"sqlite:///{(out_dir / 'paropt.db').resolve()}"
    if url.startswith("journal:") or "://" in url:
        return url
    # A bare path: SQLite unless it names a journal file.
    path = Path(url).expanduser().resolve()
    if path.suffix in (".log", ".journal", ".jsonl"):
        return f"journal:{path}"
    return f"sqlite:///{path}"


def open_storage(url: str | None = None, out_dir: str | os.PathLike[str] = DEFAULT_OUT) -> tuple[Any, str]:
    """Open the Optuna storage a URL names; returns ``(storage, url)``.

    ``url`` (or, when None, the environment variable ``GRU4REC_OPTUNA_STORAGE``):

    * any SQLAlchemy URL (``sqlite:///abs/path.db``, ``postgresql://user:pw@host/db``, ...):
      an RDB storage with heartbeats, so trials of a killed worker end up FAIL;
    * ``journal:PATH``: Optuna's journal file storage (safe for several processes on one
      machine or on a shared file system without a database server);
    * a bare path: ``*.log``/``*.journal``/``*.jsonl`` -> journal, anything else -> SQLite;
    * nothing: ``sqlite:///<out_dir>/paropt.db``.
    """
    optuna = import_optuna()
    out = Path(out_dir)
    resolved = resolve_storage_url(url, out)
    if resolved.startswith("journal:"):
        path = Path(resolved[len("journal:"):].removeprefix("//")).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(path))), resolved
    engine_kwargs: dict[str, Any] = {}
    if resolved.startswith("sqlite:"):
        db = resolved.split(":///", 1)[-1]
        if db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        # Several local workers write to one SQLite file: wait for the lock instead of failing
        # after SQLite's default 5 s (a trial's writes are tiny; waits are short but can stack).
        engine_kwargs["connect_args"] = {"timeout": 120}
    for attempt in range(_STORAGE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                # Heartbeats are flagged experimental in Optuna; they are what marks a killed
                # worker's trials FAIL, so use them without the warning on every start.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(
                    resolved,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=HEARTBEAT_GRACE_S,
                )
            return storage, resolved
        except ImportError as exc:  # e.g. the database driver of a postgresql:// URL
            raise Gru4RecError(f"storage {redact(resolved)}: {exc}") from exc
        except Exception as exc:  # SQLAlchemy raises many types for a bad URL or an unreachable server
            # Workers that start together race to create the schema of a new database
            # ("table ... already exists", "database is locked"): the loser tries again.
            if attempt + 1 < _STORAGE_ATTEMPTS and _is_transient(exc):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise Gru4RecError(f"cannot open the Optuna storage {redact(resolved)}: {type(exc).__name__}: {exc}") from exc
    raise AssertionError("unreachable")


def _is_transient(exc: BaseException) -> bool:
    # A schema race between workers opening a new database (see open_storage).
    text = str(exc)
    return "already exists" in text or "database is locked" in text or "UNIQUE constraint failed" in text

