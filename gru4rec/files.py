"""Writing files so that nothing a user has is ever half-overwritten.

:func:`atomic_write` is the one way the package writes an output file (event files, split files,
model files, JSON reports): the content goes to a temporary file in the target's folder, which
is then renamed over the target — a crash or an error leaves the old file or none, never a
truncated one.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "current_umask"]


def current_umask() -> int:
    """The process umask without changing it (reading /proc avoids the racy set-and-restore)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None], *, overwrite: bool = True) -> Path:
    """Create or replace ``path`` with what ``write(tmp)`` writes to the temporary file ``tmp``.

    The file gets the permissions a plain ``open()`` would give it (``mkstemp`` makes 0600).
    ``overwrite=False`` never replaces a file, even one that appeared while ``write`` ran:
    FileExistsError. OSError from creating the temporary file (e.g. an unwritable folder) and
    anything ``write`` raises propagate; the temporary file is removed in every case.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        if overwrite:
            os.replace(tmp, path)
        else:
            # link() fails if the target exists, so a file created concurrently is never
            # clobbered; fall back to replace() where links are unsupported.
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
