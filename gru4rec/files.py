"""Writing files so that nothing a user has is ever half-overwritten.

:func:`atomic_write` is the one way the package writes an output file (event files, split files,
model files, JSON reports): the content goes to a temporary file in the target's folder, which
is then renamed over the target — a crash or an error leaves the old file or none, never a
truncated one. :func:`check_output_path` is the check made before any work starts (hours of
training must not end in "cannot write"), for files and folders alike.
"""
from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from gru4rec.errors import OutputExistsError, OutputPathError

__all__ = ["atomic_write", "check_output_path", "current_umask"]


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


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object], *, overwrite: bool = True) -> Path:
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


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (``.`` at worst)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _probe_writable(directory: Path) -> str | None:
    """Why a file cannot be created in ``directory`` (None when one can): a real attempt, since
    ``os.access`` says yes to root for /proc and to anyone on a read-only mount."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gru4rec-write-check.", dir=directory)
    except OSError as exc:
        if exc.errno == errno.ENOENT:  # the folder exists: a file system that takes no new files (/proc)
            return "it takes no new files"
        return exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    os.close(fd)
    os.unlink(name)
    return None


def check_output_path(path: str | os.PathLike[str], what: str, force: bool = False, *, folder: bool = False,
                      argument: str = "--force") -> Path:
    """Check, before any work, that ``path`` can be written as a file (or, with ``folder``, used
    as a folder to write files into, created if missing); returns it as a Path. The one
    output-path check of the package: the commands, the model files, the exports, the reports.

    ``what`` names the output in the message ("model file", "checkpoint folder", "run folder").
    An existing file, or an existing non-empty folder, is refused unless ``force``;
    ``argument`` is what the caller calls ``force`` ("--force" on the command line; "overwrite"
    or "force" for ``overwrite=True``/``force=True`` in Python). Raises
    :class:`~gru4rec.errors.OutputExistsError` ("PATH already exists; pass --force to replace
    it") or :class:`~gru4rec.errors.OutputPathError` with one of: "PATH is a folder, not a
    file", "PATH is a file, not a folder", "X is a file, not a folder" (a part of the path),
    "PATH exists and is not empty: pass --force to write into it", "folder D does not exist",
    "folder D is not writable (reason)".
    """
    p = Path(path)
    where = f"cannot write {what} {p}"
    how = argument if argument.startswith("-") else f"{argument}=True"
    if folder:
        if p.is_file():
            raise OutputPathError(f"{where}: {p} is a file, not a folder")
        if p.is_dir() and not force and any(p.iterdir()):
            raise OutputPathError(f"{what} {p} exists and is not empty: pass {how} to write into it")
        existing = _nearest_existing(p)
        if not existing.is_dir():  # a file where a parent folder should be
            raise OutputPathError(f"{where}: {existing} is a file, not a folder")
        target = existing
    else:
        if p.is_dir():
            raise OutputPathError(f"{where}: {p} is a folder, not a file")
        if p.exists() and not force:
            raise OutputExistsError(p, what, argument)
        parent = p.parent if str(p.parent) else Path(".")
        existing = _nearest_existing(parent)
        if not existing.is_dir():
            raise OutputPathError(f"{where}: {existing} is a file, not a folder")
        if existing != parent:
            raise OutputPathError(f"{where}: folder {parent} does not exist")
        target = parent
    reason = _probe_writable(target)
    if reason is not None:
        raise OutputPathError(f"{where}: folder {target} is not writable ({reason})")
    return p
