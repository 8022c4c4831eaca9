"""Format 1 (the torch.save envelope of gru4rec 0.1) is still read: a file written by that code
(tests/fixtures/v1_model.pt) loads, recommends what it recommended when it was written, is
described by ``gru4rec info``, and every kind of damage to it is one clear ModelFileError."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.errors import ModelFileError
from gru4rec.formats.checkpoint import file_info, load_file

FIXTURES = Path(__file__).resolve().parent / "fixtures"
V1_MODEL = FIXTURES / "v1_model.pt"
EXPECTED = json.loads((FIXTURES / "v1_model.expected.json").read_text())


def test_fixture_is_format_1() -> None:
    assert V1_MODEL.read_bytes()[:4] == b"PK\x03\x04"  # a zip: torch.save, not safetensors
    info = file_info(V1_MODEL)
    assert info["format_version"] == 1 and info["container"] == "torch.save zip"


def test_recommendations_as_when_written() -> None:
    model = GRU4Rec.load(V1_MODEL, device="cpu")
    assert len(model.item_map) == EXPECTED["n_items"]
    for case in EXPECTED["recommendations"]:
        got = model.recommend(case["session"], k=EXPECTED["k"])
        assert [int(i) for i in got.item_ids] == case["item_ids"]
        np.testing.assert_allclose(got.scores, case["scores"], rtol=0, atol=1e-6)
    sessions = [case["session"] for case in EXPECTED["recommendations"]]
    np.testing.assert_allclose(model.score_sessions(sessions).astype(np.float64).sum(1), EXPECTED["score_sums"], atol=1e-4)


def test_detected_by_content_not_by_name(tmp_path: Path) -> None:
    renamed = tmp_path / "model.safetensors"  # a format-1 file under the new format's name
    shutil.copy(V1_MODEL, renamed)
    assert file_info(renamed)["format_version"] == 1
    renamed.write_bytes(V1_MODEL.read_bytes()[:500])
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        load_file(renamed)


def test_resaved_in_format_2_recommends_the_same(tmp_path: Path) -> None:
    model = GRU4Rec.load(V1_MODEL, device="cpu")
    model.save(tmp_path / "m.safetensors")
    assert file_info(tmp_path / "m.safetensors")["format_version"] == 2
    again = GRU4Rec.load(tmp_path / "m.safetensors", device="cpu")
    sessions = [case["session"] for case in EXPECTED["recommendations"]]
    np.testing.assert_array_equal(again.score_sessions(sessions), model.score_sessions(sessions))
    assert again.config == model.config and again.item_map.to_list() == model.item_map.to_list()


def test_info_command_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["info", str(V1_MODEL), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 1 and info["n_items"] == EXPECTED["n_items"]
    assert info["config"]["layers"] == [8, 6] and info["config"]["embedding"] == 5
    assert main(["info", str(V1_MODEL)]) == 0
    out = capsys.readouterr().out
    assert "format version: 1 (torch.save zip, written by gru4rec 0.1.0)" in out


# ---------------------------------------------------------------------------------- damage


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    p = tmp_path / "model.pt"
    shutil.copy(V1_MODEL, p)
    return p


def _rewrite_envelope(p: Path, **changes: Any) -> None:
    env = torch.load(p, weights_only=True)
    env.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del env[key]
    torch.save(env, p)


@pytest.mark.parametrize("keep", [0.02, 0.1, 0.5, 0.9, 0.99])
def test_truncated(copy: Path, keep: float) -> None:
    data = copy.read_bytes()
    copy.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFileError, match=r"truncated or corrupt"):
        load_file(copy)


def test_flipped_tensor_byte(copy: Path) -> None:
    wy = torch.load(copy, weights_only=True)["tensors"]["Wy"]
    data = bytearray(copy.read_bytes())
    pos = bytes(data).find(wy[3].numpy().tobytes())
    assert pos > 0
    data[pos + 1] ^= 0x10
    copy.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"checksum mismatch in tensor 'Wy'"):
        load_file(copy)


def test_flipped_metadata_byte(copy: Path) -> None:
    data = copy.read_bytes()
    assert data.count(b'"layers": [8, 6]') == 1
    copy.write_bytes(data.replace(b'"layers": [8, 6]', b'"layers": [9, 6]'))  # same length: the zip stays valid
    with pytest.raises(ModelFileError, match="corrupt"):
        load_file(copy)


def test_newer_version(copy: Path) -> None:
    _rewrite_envelope(copy, version=3, writer="9.9.9")
    with pytest.raises(ModelFileError, match=r"format version 3 \(written by gru4rec 9\.9\.9\), newer .* upgrade"):
        load_file(copy)


def test_older_version(copy: Path) -> None:
    _rewrite_envelope(copy, version=0)
    with pytest.raises(ModelFileError, match=r"format version 0 .*older.*format version 1, 2"):
        load_file(copy)


def test_version_2_in_a_zip_is_corrupt(copy: Path) -> None:
    _rewrite_envelope(copy, version=2)
    with pytest.raises(ModelFileError, match=r"corrupt: format version 2 in a torch.save zip"):
        load_file(copy)


def test_missing_envelope_key(copy: Path) -> None:
    _rewrite_envelope(copy, crc32=None)
    with pytest.raises(ModelFileError, match="corrupt: missing crc32"):
        load_file(copy)


class _Payload:
    """Stands in for a pickled object that would run code on an unsafe load."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_pickled_object_is_refused_without_running_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "evil"
    torch.save({"format": "gru4rec", "version": 1, "x": _Payload()}, p)
    capsys.readouterr()
    with pytest.raises(ModelFileError, match="contains Python objects"):
        load_file(p)
    assert "this must never run" not in capsys.readouterr().out


def test_not_a_model_after_all(copy: Path) -> None:
    torch.save(torch.zeros(3), copy)
    with pytest.raises(ModelFileError, match="PyTorch file but not a gru4rec model file"):
        load_file(copy)
