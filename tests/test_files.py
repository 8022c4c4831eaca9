"""files.atomic_write: the one way output files are written."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gru4rec.files import atomic_write, current_umask


def test_writes_with_the_permissions_of_a_plain_open(tmp_path: Path) -> None:
    p = atomic_write(tmp_path / "out.txt", lambda tmp: tmp.write_text("new"))
    assert p.read_text() == "new"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o666 & ~current_umask()
    assert [q.name for q in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "out.txt"
    p.write_text("old")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(p, fail)
    assert p.read_text() == "old"
    assert [q.name for q in tmp_path.iterdir()] == ["out.txt"]


def test_overwrite_false_never_replaces_a_file(tmp_path: Path) -> None:
    p = tmp_path / "out.txt"

    def appears_meanwhile(tmp: Path) -> None:  # another process creates the file during the write
        p.write_text("theirs")
        tmp.write_text("ours")

    with pytest.raises(FileExistsError):
        atomic_write(p, appears_meanwhile, overwrite=False)
    assert p.read_text() == "theirs"
    assert [q.name for q in tmp_path.iterdir()] == ["out.txt"]
    atomic_write(p, lambda tmp: tmp.write_text("ours"))  # overwrite=True replaces it
    assert p.read_text() == "ours"
