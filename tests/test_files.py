"""files.atomic_write (the one way output files are written) and files.check_output_path (the check before any work)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gru4rec.errors import OutputPathError
from gru4rec.files import atomic_write, check_output_path, current_umask


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


def test_check_output_path_for_files(tmp_path: Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    assert check_output_path(tmp_path / "new.safetensors", "model file") == tmp_path / "new.safetensors"
    cases = {
        a_file / "model.safetensors": f"cannot write model file {a_file}/model.safetensors: {a_file} is a file, not a folder",
        a_file / "deeper" / "m": f"{a_file} is a file, not a folder",
        tmp_path / "none" / "m": f"folder {tmp_path}/none does not exist",
        tmp_path: f"{tmp_path} is a folder, not a file",
        a_file: f"model file {a_file} already exists; pass --force to replace it",
    }
    for path, message in cases.items():
        with pytest.raises(OutputPathError) as caught:
            check_output_path(path, "model file")
        assert message in str(caught.value)
    check_output_path(a_file, "model file", force=True)  # replacing is allowed with force
    assert a_file.read_text() == "mine"  # a check writes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # and leaves nothing behind


def test_check_output_path_for_folders(tmp_path: Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert check_output_path(tmp_path / "new" / "deeper", "run folder", folder=True) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # not created by the check
    check_output_path(tmp_path, "run folder", force=True, folder=True)
    for path, message in {a_file: f"{a_file} is a file, not a folder",
                          a_file / "run": f"{a_file} is a file, not a folder",
                          full: f"run folder {full} exists and is not empty: pass --force"}.items():
        with pytest.raises(OutputPathError, match=message.replace("(", r"\(")):
            check_output_path(path, "run folder", folder=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    check_output_path(empty, "run folder", folder=True)  # an empty folder is not in the way


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")
def test_check_output_path_tries_to_write(tmp_path: Path) -> None:
    # os.access says yes to root here; creating a file is what counts.
    for folder in (False, True):
        with pytest.raises(OutputPathError, match=r"folder /proc is not writable \(it takes no new files\)$"):
            check_output_path("/proc/out", "output", folder=folder)


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root ignores permissions")
def test_check_output_path_read_only_folder(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match="locked is not writable"):
            check_output_path(locked / "m", "model file")
    finally:
        locked.chmod(0o700)
