"""Messages and progress bars: one facility for the whole package.

Messages go through the standard :mod:`logging` module. Every module logs to a child of the
``gru4rec`` logger (``logging.getLogger(__name__)``) and never prints. As optuna does for its own
logger, the ``gru4rec`` logger comes with one default handler, so that a script or a notebook
sees the per-epoch lines without configuring anything: INFO goes to standard output (the lines
the original printed), WARNING and above to standard error as ``warning: ...``. An application
that embeds the library decides otherwise in the usual ways::

    gru4rec.log.set_verbosity(logging.WARNING)   # only warnings and errors
    gru4rec.log.disable_default_handler()        # no output of ours; records still propagate
    logging.getLogger("gru4rec").addHandler(...) # anywhere you like

Progress bars are tqdm's (it handles terminals, notebooks and redirected output: a bar is drawn
only where standard error is a terminal) and are made by :func:`progress_bar` only, so that every
bar follows the same switches: the caller's ``enabled`` flag and the ``gru4rec`` logger's level
(a logger quieter than INFO draws no bars). Where standard error is not a terminal (a job's log
file), a bar is replaced by a progress message every :data:`PROGRESS_LOG_INTERVAL` seconds, so
that a long epoch is not silent.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["LOGGER_NAME", "PROGRESS_LOG_INTERVAL", "disable_default_handler", "enable_default_handler", "progress_bar", "set_verbosity"]

#: The package's root logger; every module logs to a child of it.
LOGGER_NAME = "gru4rec"

#: Seconds between two progress messages where standard error is not a terminal.
PROGRESS_LOG_INTERVAL = 60.0


class _ConsoleHandler(logging.Handler):
    """INFO and below to the current ``sys.stdout``, WARNING and above to the current
    ``sys.stderr`` (looked up at each record, so redirections and test captures apply)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            if record.levelno >= logging.WARNING:
                stream = sys.stderr
                message = f"{record.levelname.lower()}: {message}"
            else:
                stream = sys.stdout
            stream.write(message + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


_root = logging.getLogger(LOGGER_NAME)
_default_handler = _ConsoleHandler()
_default_handler.setFormatter(logging.Formatter("%(message)s"))


def enable_default_handler() -> None:
    """Attach the default console handler (done on import) and stop propagation, so that a
    record is not printed twice by a handler of the root logger."""
    if _default_handler not in _root.handlers:
        _root.addHandler(_default_handler)
    _root.propagate = False


def disable_default_handler() -> None:
    """Remove the default console handler; records then propagate to the application's handlers."""
    _root.removeHandler(_default_handler)
    _root.propagate = True


def set_verbosity(level: int) -> None:
    """The level of the ``gru4rec`` logger: ``logging.INFO`` (default), ``WARNING`` (quiet),
    ``DEBUG`` (verbose)."""
    _root.setLevel(level)


if _root.level == logging.NOTSET:
    _root.setLevel(logging.INFO)
enable_default_handler()


class _ProgressMessages:
    """The part of tqdm's interface that the package uses (``n``, ``update``,
    ``set_postfix_str``, ``close``, ``disable``, ``with``), as an INFO message of the ``gru4rec.progress``
    logger at most every ``interval`` seconds: "Epoch3: 1,200/5,000 mb (24%), 61 s, 19.7 mb/s, loss 6.1"."""

    disable = False

    def __init__(self, total: int | None, desc: str, unit: str, interval: float, initial: int = 0) -> None:
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.n = self._start_n = initial
        self._postfix = ""
        self._start = self._last = time.perf_counter()
        self._log = logging.getLogger(f"{LOGGER_NAME}.progress")

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self._postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self._start
        done = f"{self.n:,}/{self.total:,} {self.unit} ({100 * self.n / self.total:.0f}%)" if self.total else f"{self.n:,} {self.unit}"
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        tail = f", {self._postfix}" if self._postfix else ""
        self._log.info(f"{self.desc}: {done}, {elapsed:.0f} s, {rate:.1f} {self.unit}/s{tail}")

    def close(self) -> None:
        pass

    def __enter__(self) -> _ProgressMessages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(total: int | None, desc: str, *, enabled: bool = True, unit: str = "it", **kwargs: Any) -> Any:
    """A tqdm progress bar on standard error; progress messages every
    :data:`PROGRESS_LOG_INTERVAL` seconds instead where standard error is not a terminal; or a
    disabled bar (same interface, draws nothing) when ``enabled`` is False or the ``gru4rec``
    logger is quieter than INFO. Closing it removes it from the screen (``leave=False``)."""
    show = enabled and _root.isEnabledFor(logging.INFO)
    isatty = getattr(sys.stderr, "isatty", None)
    if show and not (callable(isatty) and isatty()):
        return _ProgressMessages(total, desc, unit, PROGRESS_LOG_INTERVAL, int(kwargs.get("initial", 0)))
    from tqdm.auto import tqdm  # imported on first use: `import gru4rec` stays light

    options: dict[str, Any] = dict(unit=unit, leave=False, mininterval=0.5, dynamic_ncols=True, file=sys.stderr)
    options.update(kwargs)
    return tqdm(total=total, desc=desc, disable=None if show else True, **options)
