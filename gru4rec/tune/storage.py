"""Where a study lives: an Optuna storage named by a URL, the ``--storage`` option or the
environment variable ``GRU4REC_OPTUNA_STORAGE``, by default a SQLite file ``paropt.db`` in the
output folder. Several processes, on one machine or many, share a study through its storage.

RDB storages (SQLite, PostgreSQL, MySQL, ...) get Optuna's heartbeat: a running trial writes a
heartbeat every ``heartbeat_interval`` seconds, and a trial silent for longer than
``grace_period`` (its worker was killed, its machine died) is marked FAIL by the next worker that
starts a trial and queued again with the same parameters (:func:`retry_callback`). Optuna's
journal storage has no heartbeat: there, only a killed *local* worker's trial is recovered (by
its parent, :mod:`gru4rec.tune.workers`); the trial of a killed process elsewhere stays RUNNING.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gru4rec.errors import Gru4RecError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.settings import DEFAULT_OUT

__all__ = [
    "HEARTBEAT_GRACE_S",
    "HEARTBEAT_INTERVAL_S",
    "MAX_RETRIES",
    "POSTGRES_HINT",
    "STORAGE_ENV",
    "dashboard_command",
    "has_heartbeat",
    "open_storage",
    "redact",
    "resolve_storage_url",
    "retry_callback",
]

#: Environment variable holding the default storage URL.
STORAGE_ENV = "GRU4REC_OPTUNA_STORAGE"
#: Default heartbeat settings of RDB storages (``--heartbeat-interval``, ``--grace-period``).
HEARTBEAT_INTERVAL_S = 60
HEARTBEAT_GRACE_S = 180
#: A trial whose worker died is queued again at most this many times (a trial that kills every
#: worker that runs it, e.g. through the kernel's out-of-memory killer, must not loop forever).
MAX_RETRIES = 2
POSTGRES_HINT = "a PostgreSQL storage needs psycopg: pip install 'gru4rec[postgres]' (or pip install 'psycopg[binary]')"
# Attempts at opening an RDB storage whose schema another worker is creating at the same time.
_STORAGE_ATTEMPTS = 8


def redact(url: str) -> str:
    """A storage URL fit for printing (password hidden)."""
    url = re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


def _postgres_driver(url: str) -> str:
    """``postgresql://`` with the driver that is installed: SQLAlchemy's default for the bare
    scheme is psycopg2, while ``gru4rec[postgres]`` installs psycopg (3)."""
    scheme, sep, rest = url.partition("://")
    if scheme == "postgres":  # the spelling of many hosting services; SQLAlchemy 2 refuses it
        scheme = "postgresql"
    if scheme != "postgresql":
        return url
    if importlib.util.find_spec("psycopg2") is not None:
        return f"{scheme}{sep}{rest}"
    if importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg{sep}{rest}"
    raise Gru4RecError(f"storage {redact(url)}: {POSTGRES_HINT}")


def resolve_storage_url(url: str | None, out_dir: Path) -> str:
    """The storage URL that :func:`open_storage` opens for ``url`` (see there), without opening it."""
    url = url or os.environ.get(STORAGE_ENV) or ""
    if not url:
        return f"sqlite:///{(out_dir / 'paropt.db').resolve()}"
    if url.startswith("journal:"):
        return f"journal:{Path(url[len('journal:'):].removeprefix('//')).expanduser().resolve()}"
    if "://" in url:
        return _postgres_driver(url)
    # A bare path: SQLite unless it names a journal file.
    path = Path(url).expanduser().resolve()
    if path.suffix in (".log", ".journal", ".jsonl"):
        return f"journal:{path}"
    return f"sqlite:///{path}"


def open_storage(
    url: str | None = None,
    out_dir: str | os.PathLike[str] = DEFAULT_OUT,
    *,
    heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
    grace_period: int = HEARTBEAT_GRACE_S,
) -> tuple[Any, str]:
    """Open the Optuna storage a URL names; returns ``(storage, url)``.

    ``url`` (or, when None, the environment variable ``GRU4REC_OPTUNA_STORAGE``):

    * any SQLAlchemy URL (``sqlite:///abs/path.db``, ``postgresql://user:pw@host/db``, ...):
      an RDB storage with heartbeats (``heartbeat_interval``, ``grace_period`` in seconds), so
      that the trial of a killed worker ends up FAIL and is queued again (:func:`retry_callback`);
      ``postgresql://`` uses psycopg when psycopg2 is not installed;
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
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    **{_stale_callback_argument(optuna): retry_callback()},
                )
            return storage, resolved
        except ImportError as exc:  # e.g. the database driver of a mysql:// URL
            hint = f"; {POSTGRES_HINT}" if resolved.startswith("postgresql") else ""
            raise Gru4RecError(f"storage {redact(resolved)}: {exc}{hint}") from exc
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



def retry_callback() -> Callable[[Any, Any], None]:
    """Optuna's callback that queues a failed-by-heartbeat (or killed) trial again with the same
    parameters, at most :data:`MAX_RETRIES` times (``RetryHeartbeatStaleTrialCallback``; before
    Optuna 4.9 ``RetryFailedTrialCallback``). The queued copy's system attribute
    ``failed_trial`` is the number of the trial it repeats."""
    optuna = import_optuna()
    callback_class = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if callback_class is None:  # Optuna < 4.9
        callback_class = optuna.storages.RetryFailedTrialCallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return callback_class(max_retry=MAX_RETRIES)


def _stale_callback_argument(optuna: Any) -> str:
    # RDBStorage's argument for that callback: renamed in Optuna 4.9.
    parameters = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
    return "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in parameters else "failed_trial_callback"


def has_heartbeat(storage: Any) -> bool:
    """Whether ``storage`` marks the trials of dead workers FAIL by itself (RDB storages)."""
    optuna = import_optuna()
    return isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval() is not None


def dashboard_command(url: str) -> str:
    """The ``optuna-dashboard`` command line that shows the studies of the storage ``url``
    (password redacted; a journal storage is given by its file)."""
    if url.startswith("journal:"):
        return f"optuna-dashboard {url[len('journal:'):].removeprefix('//')}"
    return f"optuna-dashboard '{redact(url)}'"
