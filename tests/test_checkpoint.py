"""Model file format: round trip, atomic/no-overwrite writes, and a clear error for every bad file."""
from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gru4rec import checkpoint, files
from gru4rec.checkpoint import FORMAT_VERSION, file_info, load_file, save_file
from gru4rec.errors import ModelFileError


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 4, generator=g)
    return {
        "Wy": torch.randn(5, 3, generator=g),
        "By": torch.zeros(5),
        "view": base[::2, 1:],  # non-contiguous view into a larger storage
        "ids": torch.arange(7, dtype=torch.int64),
        "rng": torch.get_rng_state(),  # uint8, as the resume checkpoint stores it
        "half": torch.randn(3, generator=g).to(torch.bfloat16),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
    }


META = {
    "config": {"layers": [8, 8], "loss": "bpr-max", "final_act": None, "lr": 0.05},
    "item_map": ["a", "b", 3, "ünïcode"],
    "item_support": [1, 2, 3, 4],
    "np_int": np.int64(7),
    "np_arr": np.arange(3),
}


def test_round_trip_exact(tmp_path: Path) -> None:
    ts = _tensors()
    out = save_file(tmp_path / "m.safetensors", ts, META)
    assert out == tmp_path / "m.safetensors"
    loaded, meta = load_file(out)
    assert set(loaded) == set(ts)
    for name, t in ts.items():
        assert loaded[name].dtype == t.dtype
        assert loaded[name].shape == t.shape
        assert torch.equal(loaded[name], t), name
        assert loaded[name].device.type == "cpu"
    assert meta["config"] == META["config"]
    assert meta["item_map"] == ["a", "b", 3, "ünïcode"]
    assert meta["np_int"] == 7 and meta["np_arr"] == [0, 1, 2]


def test_view_is_stored_compactly(tmp_path: Path) -> None:
    # A 1-element view of a 1M-element tensor must not drag the whole storage into the file.
    big = torch.zeros(1_000_000)
    save_file(tmp_path / "v", {"x": big[:1]}, {})
    assert (tmp_path / "v").stat().st_size < 50_000
    loaded, _ = load_file(tmp_path / "v")
    assert loaded["x"].shape == (1,)


def test_loaded_tensors_do_not_alias_saved(tmp_path: Path) -> None:
    a = torch.ones(3)
    save_file(tmp_path / "m", {"a": a, "b": a}, {})
    loaded, _ = load_file(tmp_path / "m")
    loaded["a"][0] = 5.0
    assert loaded["b"][0].item() == 1.0


def test_file_info(tmp_path: Path) -> None:
    save_file(tmp_path / "m", {"Wy": torch.zeros(5, 3)}, {"k": 1})
    info = file_info(tmp_path / "m")
    assert info["format_version"] == FORMAT_VERSION
    assert info["tensors"] == {"Wy": {"shape": [5, 3], "dtype": "float32"}}
    assert info["meta"] == {"k": 1}
    assert info["size_bytes"] == (tmp_path / "m").stat().st_size


def test_refuses_overwrite_and_keeps_old_content(tmp_path: Path) -> None:
    p = tmp_path / "m"
    p.write_text("precious user data")
    with pytest.raises(ModelFileError, match=r"refusing to overwrite.*m"):
        save_file(p, {"a": torch.zeros(1)}, {})
    assert p.read_text() == "precious user data"
    save_file(p, {"a": torch.ones(1)}, {"v": 2}, overwrite=True)
    loaded, meta = load_file(p)
    assert loaded["a"].item() == 1.0 and meta == {"v": 2}
    assert [f.name for f in tmp_path.iterdir()] == ["m"]  # no temp file left behind


def test_new_file_gets_umask_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        save_file(tmp_path / "m", {"a": torch.zeros(1)}, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o644


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"directory .*nope does not exist"):
        save_file(tmp_path / "nope" / "m", {"a": torch.zeros(1)}, {})


def test_path_is_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="is a directory"):
        save_file(tmp_path, {"a": torch.zeros(1)}, {}, overwrite=True)
    with pytest.raises(ModelFileError, match="is a directory"):
        load_file(tmp_path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores permissions")
def test_unwritable_directory(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(ModelFileError, match=r"directory .*ro is not writable"):
            save_file(d / "m", {"a": torch.zeros(1)}, {})
    finally:
        d.chmod(0o700)


def test_unwritable_directory_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root ignores directory permissions, so also check the message via a failing mkstemp.
    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", deny)
    with pytest.raises(ModelFileError, match=rf"directory {tmp_path} is not writable"):
        save_file(tmp_path / "m", {"a": torch.zeros(1)}, {})


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "m"
    p.write_bytes(b"old")

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", boom)
    with pytest.raises(ModelFileError, match="No space left"):
        save_file(p, {"a": torch.zeros(1)}, {}, overwrite=True)
    assert p.read_bytes() == b"old"
    assert [f.name for f in tmp_path.iterdir()] == ["m"]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        save_file(tmp_path / "x", {"a": np.zeros(3)}, {})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="JSON"):
        save_file(tmp_path / "x", {}, {"obj": object()})
    with pytest.raises(TypeError, match="JSON"):
        save_file(tmp_path / "x", {}, {"nan": float("nan")})
    with pytest.raises(TypeError, match="dense"):
        save_file(tmp_path / "x", {"s": torch.eye(2).to_sparse()}, {})
    assert not (tmp_path / "x").exists()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=rf"model file not found: {tmp_path / 'nothing'}"):
        load_file(tmp_path / "nothing")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "m").write_bytes(b"")
    with pytest.raises(ModelFileError, match="is empty"):
        load_file(tmp_path / "m")


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.99])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    p = tmp_path / "m"
    save_file(p, _tensors(), META)
    data = p.read_bytes()
    p.write_bytes(data[: max(4, int(len(data) * keep))])
    with pytest.raises(ModelFileError, match=r"truncated or corrupt"):
        load_file(p)


def test_flipped_tensor_byte_is_detected(tmp_path: Path) -> None:
    p = tmp_path / "m"
    t = torch.arange(1000, dtype=torch.int64)
    save_file(p, {"ids": t}, {})
    data = bytearray(p.read_bytes())
    pos = bytes(data).find(t[500:502].numpy().tobytes())
    assert pos > 0
    data[pos] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"checksum mismatch in tensor 'ids'"):
        load_file(p)


def test_metadata_tamper_is_detected(tmp_path: Path) -> None:
    p = tmp_path / "m"
    save_file(p, {"a": torch.zeros(1)}, {"layers": [100]})
    data = p.read_bytes()
    assert data.count(b'[100]') == 1
    # Same length, so the zip container itself stays valid.
    p.write_bytes(data.replace(b'[100]', b'[900]'))
    with pytest.raises(ModelFileError, match="corrupt"):
        load_file(p)


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "sessions.tsv"
    p.write_text("SessionId\tItemId\tTime\n1\t2\t3\n")
    with pytest.raises(ModelFileError, match=r"not a gru4rec model file \(it is a text file\)"):
        load_file(p)


def test_random_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "m"
    p.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ModelFileError, match="unknown binary format"):
        load_file(p)


def test_foreign_torch_file(tmp_path: Path) -> None:
    p = tmp_path / "state.pt"
    torch.save({"weight": torch.zeros(3)}, p)
    with pytest.raises(ModelFileError, match="PyTorch file but not a gru4rec model file"):
        load_file(p)
    torch.save(torch.zeros(3), p)
    with pytest.raises(ModelFileError, match="PyTorch file but not a gru4rec model file"):
        load_file(p)


class _Payload:
    """Stands in for a pickled object that would run code on an unsafe load."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_pickled_object_is_refused_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "evil"
    torch.save({"format": "gru4rec", "version": FORMAT_VERSION, "x": _Payload()}, p)
    capsys.readouterr()
    with pytest.raises(ModelFileError, match="contains Python objects"):
        load_file(p)
    assert "this must never run" not in capsys.readouterr().out


def test_foreign_zip_file(tmp_path: Path) -> None:
    p = tmp_path / "m.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(ModelFileError, match=r"m\.zip is not a gru4rec model file \(it is a zip archive"):
        load_file(p)


def _rewrite_envelope(p: Path, **changes: object) -> None:
    env = torch.load(p, weights_only=True)
    env.update(changes)
    torch.save(env, p)


def test_newer_version(tmp_path: Path) -> None:
    p = tmp_path / "m"
    save_file(p, {"a": torch.zeros(1)}, {})
    _rewrite_envelope(p, version=FORMAT_VERSION + 1, writer="9.9.9")
    with pytest.raises(ModelFileError) as info:
        load_file(p)
    msg = str(info.value)
    assert f"format version {FORMAT_VERSION + 1}" in msg and "9.9.9" in msg
    assert f"(format version {FORMAT_VERSION})" in msg and "newer" in msg and "upgrade" in msg


def test_older_version(tmp_path: Path) -> None:
    p = tmp_path / "m"
    save_file(p, {"a": torch.zeros(1)}, {})
    _rewrite_envelope(p, version=0)
    with pytest.raises(ModelFileError, match=rf"format version 0 .*older.*format version {FORMAT_VERSION}"):
        load_file(p)


def test_missing_envelope_key(tmp_path: Path) -> None:
    p = tmp_path / "m"
    save_file(p, {"a": torch.zeros(1)}, {})
    env = torch.load(p, weights_only=True)
    del env["crc32"]
    torch.save(env, p)
    with pytest.raises(ModelFileError, match="corrupt: missing crc32"):
        load_file(p)


def test_meta_file_is_plain_json_inside(tmp_path: Path) -> None:
    # The metadata is readable by any tool that can open the zip: no pickle needed for it.
    p = tmp_path / "m"
    save_file(p, {}, {"config": {"loss": "cross-entropy"}})
    env = torch.load(io.BytesIO(p.read_bytes()), weights_only=True)
    assert json.loads(env["meta_json"]) == {"config": {"loss": "cross-entropy"}}
    assert env["format"] == "gru4rec" and env["version"] == FORMAT_VERSION
