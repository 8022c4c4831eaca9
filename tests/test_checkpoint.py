"""Model file format 2 (safetensors): round trip, readable by safetensors alone with its
checksums recomputed independently, atomic/no-overwrite writes, and one clear error for every
bad file — every single flipped bit of a small file included. Format 1: tests/test_model_file_v1.py."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as numpy_load_file
from safetensors.numpy import save_file as numpy_save_file

from gru4rec import files
from gru4rec.errors import ModelFileError, OutputExistsError, OutputPathError
from gru4rec.formats import checkpoint
from gru4rec.formats.checkpoint import FORMAT_VERSION, file_info, load_file, save_file


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
    "big": 2**70,  # numpy's PCG64 state in a training checkpoint holds 128-bit integers
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
    assert meta["np_int"] == 7 and meta["np_arr"] == [0, 1, 2] and meta["big"] == 2**70


def test_file_is_plain_safetensors_with_verifiable_checksums(tmp_path: Path) -> None:
    """Another tool needs only safetensors, json and hashlib: read the file that way and check
    every entry and checksum from scratch."""
    p = tmp_path / "m.safetensors"
    ts = {"Wy": torch.randn(5, 3), "ids": torch.arange(4)}
    save_file(p, ts, {"kind": "gru4rec-model", "item_ids": [10, 20, 30, 40, 50]})
    arrays = numpy_load_file(str(p))
    from safetensors import safe_open

    with safe_open(str(p), framework="np") as fh:
        raw = fh.metadata()
    decoded = {k: json.loads(v) for k, v in raw.items()}
    assert decoded["format"] == "gru4rec" and decoded["format_version"] == FORMAT_VERSION == 2
    assert decoded["kind"] == "gru4rec-model" and decoded["item_ids"] == [10, 20, 30, 40, 50]
    for name, t in ts.items():
        np.testing.assert_array_equal(arrays[name], t.numpy())
        assert decoded["checksums"]["tensors"][name] == hashlib.sha256(t.numpy().tobytes()).hexdigest()
    assert decoded["checksums"]["algorithm"] == "sha256"
    # The header digest: every tensor's dtype and shape and every other entry, canonical JSON.
    described = {"tensors": {"Wy": ["float32", [5, 3]], "ids": ["int64", [4]]},
                 "metadata": {k: v for k, v in raw.items() if k != "checksums"}}
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    assert decoded["checksums"]["header"] == hashlib.sha256(text.encode()).hexdigest()
    # Detected by content: the name does not matter.
    os.rename(p, tmp_path / "model.pt")
    assert torch.equal(load_file(tmp_path / "model.pt")[0]["Wy"], ts["Wy"])


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
    assert info["format_version"] == FORMAT_VERSION and info["container"] == "safetensors"
    assert info["tensors"] == {"Wy": {"shape": [5, 3], "dtype": "float32"}}
    assert info["meta"] == {"k": 1}
    assert info["size_bytes"] == (tmp_path / "m").stat().st_size


# ------------------------------------------------------------------------------------ writing


def test_refuses_overwrite_and_keeps_old_content(tmp_path: Path) -> None:
    p = tmp_path / "m"
    p.write_text("precious user data")
    with pytest.raises(OutputExistsError, match=r"model file .*m already exists; pass overwrite=True to replace it"):
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
    with pytest.raises(OutputPathError, match=r"cannot write model file .*: folder .*nope does not exist"):
        save_file(tmp_path / "nope" / "m", {"a": torch.zeros(1)}, {})


def test_path_is_directory(tmp_path: Path) -> None:
    with pytest.raises(OutputPathError, match="is a folder, not a file"):
        save_file(tmp_path, {"a": torch.zeros(1)}, {}, overwrite=True)
    with pytest.raises(ModelFileError, match="is a directory"):
        load_file(tmp_path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores permissions")
def test_unwritable_directory(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match=r"folder .*ro is not writable"):
            save_file(d / "m", {"a": torch.zeros(1)}, {})
    finally:
        d.chmod(0o700)


def test_unwritable_directory_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root ignores directory permissions, so also check the message via a failing mkstemp.
    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", deny)
    with pytest.raises(OutputPathError, match=rf"folder {tmp_path} is not writable"):
        save_file(tmp_path / "m", {"a": torch.zeros(1)}, {})


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), "safetensors"])
def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: object) -> None:
    from safetensors import SafetensorError

    p = tmp_path / "m"
    p.write_bytes(b"old")

    def boom(*args: object, **kwargs: object) -> None:
        raise error if isinstance(error, OSError) else SafetensorError("No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "write_safetensors", boom)
    with pytest.raises(ModelFileError, match="cannot write model file .*No space left"):
        save_file(p, {"a": torch.zeros(1)}, {}, overwrite=True)
    assert p.read_bytes() == b"old"
    assert [f.name for f in tmp_path.iterdir()] == ["m"]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        save_file(tmp_path / "x", {"a": np.zeros(3)}, {})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="JSON"):
        save_file(tmp_path / "x", {}, {"obj": object()})
    with pytest.raises(TypeError, match="'nan' is not valid JSON"):
        save_file(tmp_path / "x", {}, {"nan": float("nan")})
    with pytest.raises(TypeError, match="dense"):
        save_file(tmp_path / "x", {"s": torch.eye(2).to_sparse()}, {})
    with pytest.raises(TypeError, match="'checksums' is reserved"):
        save_file(tmp_path / "x", {}, {"checksums": 1})
    with pytest.raises(TypeError, match="keys must be strings"):
        save_file(tmp_path / "x", {}, {1: "a"})  # type: ignore[dict-item]
    assert not (tmp_path / "x").exists()


def test_metadata_too_large_for_a_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "_MAX_HEADER_BYTES", 1000)
    with pytest.raises(ModelFileError, match=r"metadata is .* MB \(mostly 'item_ids'\)"):
        save_file(tmp_path / "x", {}, {"item_ids": list(range(1000)), "kind": "m"})
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------ reading


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=rf"model file not found: {tmp_path / 'nothing'}"):
        load_file(tmp_path / "nothing")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "m").write_bytes(b"")
    with pytest.raises(ModelFileError, match="is empty"):
        load_file(tmp_path / "m")


@pytest.fixture()
def small_file(tmp_path: Path) -> Path:
    p = tmp_path / "m.safetensors"
    save_file(p, {"ids": torch.arange(40, dtype=torch.int64), "Wy": torch.randn(4, 3)},
              {"kind": "gru4rec-model", "config": {"layers": [100]}, "item_ids": ["a", "b", "c", "d"]})
    return p


def test_truncated_file_at_many_lengths(small_file: Path) -> None:
    data = small_file.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    for keep in sorted({*range(1, len(data), 3), 7, 8, 9, header_end - 1, header_end, header_end + 1, len(data) - 1}):
        small_file.write_bytes(data[:keep])
        with pytest.raises(ModelFileError, match=r"truncated|not a gru4rec model file \(only \d bytes"):
            load_file(small_file)


def test_every_flipped_byte_is_an_error(small_file: Path) -> None:
    """Flip one bit of each byte of the file in turn (length prefix, header, metadata, tensor
    data; the bit rotates with the position): each read must end in a ModelFileError, never in
    a loaded model or another exception."""
    data = small_file.read_bytes()
    undetected = []
    for pos in range(len(data)):
        damaged = bytearray(data)
        damaged[pos] ^= 1 << (pos % 8)
        small_file.write_bytes(bytes(damaged))
        try:
            load_file(small_file)
        except ModelFileError:
            continue
        undetected.append(pos)
    assert undetected == []


def test_flipped_tensor_byte_names_the_tensor(small_file: Path) -> None:
    data = bytearray(small_file.read_bytes())
    pos = bytes(data).find(torch.arange(40)[20:22].numpy().tobytes())
    assert pos > 0
    data[pos] ^= 0x01
    small_file.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"corrupt: checksum mismatch in tensor 'ids'"):
        load_file(small_file)


def test_changed_metadata_value_is_detected(small_file: Path) -> None:
    data = small_file.read_bytes()
    assert data.count(b"[100]") == 1
    # Same length, so the safetensors structure itself stays valid.
    small_file.write_bytes(data.replace(b"[100]", b"[900]"))
    with pytest.raises(ModelFileError, match="corrupt: header checksum mismatch"):
        load_file(small_file)


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "sessions.tsv"
    p.write_text("SessionId\tItemId\tTime\n1\t2\t3\n")
    with pytest.raises(ModelFileError, match=r"not a gru4rec model file \(it is a text file\)"):
        load_file(p)
    p.write_text('12345678{"a": 1}')  # '{' where a safetensors header starts; the length bytes are text
    with pytest.raises(ModelFileError, match=r"not a gru4rec model file \(it is a text file\)"):
        load_file(p)


def test_random_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "m"
    p.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ModelFileError, match="unknown binary format"):
        load_file(p)
    rng = np.random.default_rng(0)
    for _ in range(50):
        p.write_bytes(rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
        with pytest.raises(ModelFileError):
            load_file(p)


def test_foreign_safetensors_file(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    numpy_save_file({"weight": np.zeros(3, np.float32)}, str(p), metadata={"format": "pt"})
    with pytest.raises(ModelFileError, match="a safetensors file but not a gru4rec model file"):
        load_file(p)
    numpy_save_file({"weight": np.zeros(3, np.float32)}, str(p))
    with pytest.raises(ModelFileError, match="a safetensors file but not a gru4rec model file"):
        load_file(p)


def test_foreign_torch_file(tmp_path: Path) -> None:
    p = tmp_path / "state.pt"
    torch.save({"weight": torch.zeros(3)}, p)
    with pytest.raises(ModelFileError, match="PyTorch file but not a gru4rec model file"):
        load_file(p)


def test_foreign_zip_file(tmp_path: Path) -> None:
    p = tmp_path / "m.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(ModelFileError, match=r"m\.zip is not a gru4rec model file \(it is a zip archive"):
        load_file(p)


def test_newer_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "m"
    monkeypatch.setattr(checkpoint, "FORMAT_VERSION", FORMAT_VERSION + 1)
    monkeypatch.setattr(checkpoint, "_package_version", lambda: "9.9.9")
    save_file(p, {"a": torch.zeros(1)}, {})  # a consistent file (checksums match) of version 3
    monkeypatch.undo()
    with pytest.raises(ModelFileError) as info:
        load_file(p)
    msg = str(info.value)
    assert f"format version {FORMAT_VERSION + 1}" in msg and "9.9.9" in msg
    assert "(format version 1, 2)" in msg and "newer" in msg and "upgrade" in msg


def test_missing_checksums(tmp_path: Path) -> None:
    p = tmp_path / "m"
    numpy_save_file({"a": np.zeros(1, np.float32)}, str(p),
                    metadata={"format": '"gru4rec"', "format_version": "2", "writer": '"x"'})
    with pytest.raises(ModelFileError, match="corrupt: the checksums are missing"):
        load_file(p)
