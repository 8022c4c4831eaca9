"""Progress lines of the preprocessing pipelines: one line per step on stderr.

Each line names the pipeline and says how long it has been running and how much memory the
process has needed so far, so that a run over tens of millions of rows shows where its time and
memory go::

    [diginetica     1.2s    143MB] train-item-views.csv: 1,000,000 rows read, 998,870 events kept
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

__all__ = ["Progress", "chunk_progress", "peak_rss_mb"]


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
    """Prints one line per step to stderr (elapsed time, peak memory so far), or nothing."""

    def __init__(self, name: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.name = name
        self.enabled = enabled
        self.stream = stream
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.t0
            print(
                f"[{self.name} {elapsed:7.1f}s {peak_rss_mb():6.0f}MB] {message}",
                file=self.stream or sys.stderr,
                flush=True,
            )


def chunk_progress(prog: Progress, path: Path, n_rows: int, n_kept: int) -> None:
    """The line a reader logs after each chunk of a raw file."""
    prog(f"{path.name}: {n_rows:,} rows read, {n_kept:,} events kept")
