"""Where a command's output goes: its results on standard output, its messages through logging.

A command's *result* (metric lines, a table, JSON, the paths it wrote) is product output, written
with :func:`result` to standard output. Everything else (what is being done, timings, warnings)
is a log record of the ``gru4rec`` logger (see :mod:`gru4rec.log`), and the command line decides
where records go for the duration of one command (:func:`command_console`):

* ``gru4rec COMMAND``: every message on standard error, beside the results on standard output,
  so that ``gru4rec evaluate ... > metrics.txt`` keeps only the results; warnings and errors read
  ``gru4rec: warning: ...``;
* ``run.py`` and ``gru4rec paropt`` keep the package's default console (INFO on standard output,
  warnings on standard error), as the original scripts printed everything on standard output.

``-q/--quiet`` keeps warnings and errors only (and draws no progress bar), ``-v/--verbose``
adds the DEBUG records. The previous logging set-up is restored when the command ends, so that
calling :func:`gru4rec.cli.main` from Python leaves the caller's logging as it was.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from gru4rec.cli.common import UsageError
from gru4rec.log import LOGGER_NAME, disable_default_handler

__all__ = ["VERBOSITY_DESTS", "add_verbosity_flags", "command_console", "result", "verbosity"]

#: The destinations of the verbosity flags (shared by the main parser and every subcommand).
VERBOSITY_DESTS = ("quiet", "verbose")


def result(line: str = "") -> None:
    """Write one line of a command's result to standard output."""
    print(line, file=sys.stdout, flush=True)


def add_verbosity_flags(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """``-q/--quiet`` and ``-v/--verbose``; on a subcommand their default is suppressed so that
    the flag given before the command name (``gru4rec -q train ...``) is not reset."""
    default = argparse.SUPPRESS if sub else False
    parser.add_argument("-q", "--quiet", action="store_true", default=default,
                        help="only warnings and errors: no progress messages or bars")
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="also show debugging messages")


def verbosity(args: argparse.Namespace) -> int:
    """The ``gru4rec`` logger's level the parsed flags ask for (INFO without either flag)."""
    quiet, verbose = bool(getattr(args, "quiet", False)), bool(getattr(args, "verbose", False))
    if quiet and verbose:
        raise UsageError("-q/--quiet and -v/--verbose cannot be used together")
    return logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO


class _StderrHandler(logging.Handler):
    """Every record on the current ``sys.stderr`` (looked up at each record, so redirections
    and test captures apply); WARNING and above as ``<prog>: warning: ...``."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            if record.levelno >= logging.WARNING:
                message = f"{self.prog}: {record.levelname.lower()}: {message}"
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never raise into the command
            self.handleError(record)


@contextlib.contextmanager
def command_console(prog: str, *, level: int, messages_on_stdout: bool = False) -> Iterator[None]:
    """Route the ``gru4rec`` logger's records for one command, then restore the previous set-up.

    level: the logger's level during the command (see :func:`verbosity`).
    messages_on_stdout: keep the package's default console (INFO on standard output), as
        ``run.py`` and ``paropt`` do; otherwise every message goes to standard error.
    """
    root = logging.getLogger(LOGGER_NAME)
    saved_level, saved_handlers, saved_propagate = root.level, list(root.handlers), root.propagate
    root.setLevel(level)
    if not messages_on_stdout:
        # Our handler takes the default one's place; other handlers (an application's) stay.
        disable_default_handler()
        root.addHandler(_StderrHandler(prog))
        root.propagate = False
    try:
        yield
    finally:
        root.handlers[:] = saved_handlers
        root.propagate = saved_propagate
        root.setLevel(saved_level)
