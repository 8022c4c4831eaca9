"""Progress lines of the preprocessing pipelines: one log record per step.

Each line names the pipeline and says how long it has been running and how much memory the
process has needed so far, so that a run over tens of millions of rows shows where its time and
memory go::

    [diginetica     1.2s    143MB] train-item-views.csv: 1,000,000 rows read, 998,870 events kept

The lines are INFO records of the ``gru4rec.datasets.progress`` logger (see `gru4rec.log`:
by default they are written to standard output; ``gru4rec.log.set_verbosity(logging.WARNING)``
or the pipelines' ``progress=False`` silences them).
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

__all__ = ["Progress", "chunk_progress", "peak_rss_mb"]

log = logging.getLogger(__name__)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux/macOS; 0 where unknown)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):  # pragma: no cover - Windows
        return 0.0
    # ru_maxrss is in bytes on macOS and in KiB on Linux
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


class Progress:
    """Logs one line per step (elapsed time since creation, peak memory so far), or nothing.

    name: the pipeline's name, shown at the start of every line.
    enabled: False silences this pipeline's lines (the ``progress=False`` of `preprocess`).
    """

    def __init__(self, name: str, enabled: bool = True) -> None:
        self.name = name
        self.enabled = enabled
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        """Log `message` as one step of this pipeline."""
        # checked first: getrusage is a system call, not worth making for a dropped record
        if self.enabled and log.isEnabledFor(logging.INFO):
            elapsed = time.perf_counter() - self.t0
            log.info("[%s %7.1fs %6.0fMB] %s", self.name, elapsed, peak_rss_mb(), message)


def chunk_progress(prog: Progress, path: Path, n_rows: int, n_kept: int) -> None:
    """The line a reader logs after each chunk of a raw file."""
    prog(f"{path.name}: {n_rows:,} rows read, {n_kept:,} events kept")
