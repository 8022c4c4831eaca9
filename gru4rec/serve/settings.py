"""The server's settings: one dataclass, filled from ``gru4rec serve``'s flags or, for
``uvicorn --factory gru4rec.serve:create_app``, from ``GRU4REC_*`` environment variables
(``GRU4REC_MODEL``, ``GRU4REC_STATE``, ``GRU4REC_MAX_BATCH``, ... — the field name in capitals).
Every value is checked at once; :class:`~gru4rec.errors.ConfigError` lists every problem.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gru4rec.errors import ConfigError

__all__ = ["ENV_PREFIX", "MIN_TOKEN_CHARS", "ServeSettings"]

ENV_PREFIX = "GRU4REC_"
#: Shortest access token accepted (``secrets.token_urlsafe(32)`` gives 43 characters).
MIN_TOKEN_CHARS = 16
_SCORING = ("auto", "float32", "int8")


@dataclass(frozen=True)
class ServeSettings:
    """How one server process runs (see the README's "Serve it" section)."""

    #: The model file (``GRU4REC_MODEL``).
    model: str | None = None
    #: torch device of the model: auto (CUDA if present), cpu, cuda, cuda:1, ...
    device: str = "auto"
    #: Where sessions live: ``memory`` or a ``redis://host:port/db`` URL.
    state: str = "memory"
    #: Memory store: most sessions held; the least recently used one goes first.
    max_sessions: int = 1_000_000
    #: Seconds a session is kept after its last click (memory and Redis).
    session_ttl_s: float = 1800.0
    #: Most clicks or requests in one micro-batch (1 = one at a time).
    max_batch: int = 64
    #: How long a batch waits for more requests after its first (0: it takes what has arrived
    #: while the previous batch ran, and never waits).
    batch_window_ms: float = 0.0
    #: Requests waiting beyond this are refused with 503 (overload protection).
    max_queue: int = 4096
    #: Largest request body; a larger one is refused with 413 before it is read.
    max_body_bytes: int = 65_536
    #: Most items in one stateless request (each is a GRU step).
    max_items: int = 1000
    #: ``auto`` (int8 candidates with a certified exact top-k on the CPU, else float32),
    #: ``float32`` or ``int8``; every choice gives the same answers.
    scoring: str = "auto"
    #: Candidates per row for int8 scoring (at least 3k are taken for a request's k).
    candidates: int = 128
    #: Batches larger than this are scored in float32 (cheaper per row there).
    int8_max_batch: int = 64
    #: torch threads for the model's work, exactly (None: chosen online by the batcher's worker, gru4rec/machine/threads.py).
    threads: int | None = None
    #: Seconds between the one-line activity logs.
    log_interval_s: float = 60.0
    #: Seconds between checks of the model file for a replacement, which is then loaded and
    #: swapped in (0: only on SIGHUP); see :mod:`gru4rec.serve.reload`.
    watch_s: float = 0.0
    #: The access token the ``/v1`` routes require as ``Authorization: Bearer TOKEN``
    #: (``GRU4REC_TOKEN``; never a command-line value, which other users of the machine can
    #: read). None: the routes are open.
    token: str | None = dataclasses.field(default=None, repr=False)
    #: A file holding the access token (``GRU4REC_TOKEN_FILE``, ``--token-file``): its first
    #: line. Read when the app is created.
    token_file: str | None = None

    def access_token(self) -> str | None:
        """The access token: ``token``, or the first line of ``token_file``, or None."""
        if self.token_file is None:
            return None if self.token is None else self.token.strip()
        try:
            text = open(self.token_file, encoding="utf-8").read()  # noqa: SIM115 - one read
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {self.token_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"the token file {self.token_file} is not UTF-8 text") from None
        lines = text.strip().splitlines()
        token = lines[0].strip() if lines else ""
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"the token in {self.token_file} has {len(token)} characters; an access token needs at least "
                              f"{MIN_TOKEN_CHARS} (make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return token

    def __post_init__(self) -> None:
        problems = []
        positive_ints = ("max_sessions", "max_batch", "max_queue", "max_body_bytes", "max_items", "candidates", "int8_max_batch")
        for name in positive_ints:
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            problems.append(f"threads must be at least 1, got {self.threads}")
        if not self.session_ttl_s > 0:
            problems.append(f"session_ttl_s must be positive, got {self.session_ttl_s}")
        if not self.batch_window_ms >= 0:
            problems.append(f"batch_window_ms must be >= 0, got {self.batch_window_ms}")
        if not self.watch_s >= 0:
            problems.append(f"watch_s must be >= 0, got {self.watch_s}")
        if not self.log_interval_s > 0:
            problems.append(f"log_interval_s must be positive, got {self.log_interval_s}")
        if self.scoring not in _SCORING:
            problems.append(f"scoring must be one of {', '.join(_SCORING)}, got {self.scoring!r}")
        if self.state != "memory" and not self.state.startswith(("redis://", "rediss://", "unix://")):
            from gru4rec.serve.state import redacted_url

            problems.append(f"state must be 'memory' or a redis:// URL, got {redacted_url(self.state)!r}")
        if self.token is not None and self.token_file is not None:
            problems.append("give the access token once: token (GRU4REC_TOKEN) or token_file (GRU4REC_TOKEN_FILE), not both")
        if self.token is not None and len(self.token.strip()) < MIN_TOKEN_CHARS:
            problems.append(f"the access token (GRU4REC_TOKEN) has {len(self.token.strip())} characters; it needs at least "
                            f"{MIN_TOKEN_CHARS}")
        if problems:
            raise ConfigError("invalid server settings: " + "; ".join(problems))

    def replace(self, **changes: Any) -> ServeSettings:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServeSettings:
        """Settings from ``GRU4REC_<FIELD>`` variables (e.g. ``GRU4REC_MAX_BATCH=32``), then
        ``overrides``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems = []
        for f in fields(cls):
            text = environ.get(ENV_PREFIX + f.name.upper())
            if text is None or text == "":
                continue
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            try:
                if kind.startswith("int"):
                    values[f.name] = int(text)
                elif kind.startswith("float"):
                    values[f.name] = float(text)
                else:
                    values[f.name] = text
            except ValueError:
                problems.append(f"{ENV_PREFIX}{f.name.upper()}={text!r} is not a number")
        if problems:
            raise ConfigError("invalid server settings: " + "; ".join(problems))
        values.update(overrides)
        return cls(**values)
