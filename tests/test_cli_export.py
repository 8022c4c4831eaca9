"""``gru4rec export``: the three exports from the command line give the library's results, and
every bad model, path or flag is one line on stderr with the right exit code, before any work."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export_helpers import known_sessions, synthetic
from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.export import item_embeddings, session_embeddings

FIXTURE_MODEL = Path(__file__).resolve().parent / "fixtures" / "v1_model.pt"


def run(argv: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("gru4rec: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return synthetic(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The format-1 fixture re-saved in today's format: the CLI reads both alike."""
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    GRU4Rec.load(FIXTURE_MODEL, device="cpu").save(path)
    return path


def test_all_three_exports(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from gru4rec.datasets.synthetic import write_synthetic

    model = GRU4Rec.load(model_file, device="cpu")
    # Test sessions over the fixture's own items: the synthetic generator with its seed.
    test = write_synthetic(tmp_path / "d", n_sessions=120, n_items=30, seed=11, test_days=5)["test"]
    step, items, sessions = tmp_path / "step.onnx", tmp_path / "items.npy", tmp_path / "sessions.parquet"
    code, out, err = run(["export", model_file, "--onnx", step, "--top-k", 4, "--item-embeddings", items,
                          "--session-embeddings", test, sessions, "-d", "cpu"], capsys)
    assert code == 0, err
    assert out == ""  # the exports are files; the messages go to stderr
    assert "Wrote 30 items (item_id, output, bias, input)" in err and "session embeddings (6 wide)" in err
    meta = json.loads((tmp_path / "step.onnx.json").read_text())
    assert meta["top_k"] == 4 and meta["item_ids"] == model.item_map.to_list()
    graph = ort.InferenceSession(str(step), providers=["CPUExecutionProvider"])
    prefix = known_sessions(model, {"test": test}, min_length=2)[0][:2]
    hidden = [np.zeros((1, n), np.float32) for n in meta["layers"]]
    for item in prefix:
        top_indices, top_scores, *hidden = graph.run(None, {"items": model.item_map.index_of([item]),
                                                             **dict(zip(meta["hidden_inputs"], hidden))})
    want = model.recommend(prefix, k=4)
    assert list(model.item_map.ids[top_indices[0]]) == list(want.item_ids)
    np.testing.assert_allclose(top_scores[0], want.scores, atol=1e-5)
    library_items, _ = item_embeddings(model)
    written = np.load(items)
    for name, column in library_items.items():
        np.testing.assert_array_equal(written[name], column)
    import pyarrow.parquet as pq

    library_sessions, _ = session_embeddings(model, test)
    table = pq.read_table(sessions)
    assert table["session_id"].to_pylist() == list(library_sessions["session_id"])
    np.testing.assert_array_equal(np.stack(table["embedding"].to_numpy(zero_copy_only=False)), library_sessions["embedding"])

    # Again without --force: refused, files as they were.
    before = {p: p.read_bytes() for p in (step, items, sessions)}
    code, _, err = run(["export", model_file, "--item-embeddings", items], capsys)
    assert code == 1 and "items.npy already exists; pass --force to replace it" in one_error(err)
    assert "overwrite=True" not in err
    assert {p: p.read_bytes() for p in before} == before
    code, _, err = run(["export", model_file, "--item-embeddings", items, "--force"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("argv, code, fragment", [
    ([], 2, "nothing to export"),
    (["--item-embeddings", "i.npy", "--top-k", "5"], 2, "--top-k applies to --onnx only"),
    (["--item-embeddings", "items.csv"], 2, "items.csv: unknown extension ('.csv'); use .parquet or .npy"),
    (["--item-embeddings", "items"], 2, "unknown extension (no extension)"),
    (["--onnx", "step.bin"], 2, "ONNX file step.bin: unknown extension; use .onnx"),
    (["--item-embeddings", "x.npy", "--session-embeddings", "TEST", "x.npy"], 2, "two exports would write the same file"),
    (["--onnx", "s.onnx", "--top-k", "0"], 2, "expected a positive integer"),
    (["--item-embeddings", "nope/items.npy"], 1, "cannot write item embeddings file nope/items.npy: folder nope does not exist"),
    (["--item-embeddings", "adir.npy"], 1, "cannot write item embeddings file adir.npy: adir.npy is a folder, not a file"),
    (["--session-embeddings", "missing.tsv", "s.npy"], 1, "test file not found: missing.tsv"),
])
def test_usage_and_path_errors(model_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str], argv: list[str], code: int, fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir.npy").mkdir()
    (tmp_path / "TEST").write_text("SessionId\tItemId\tTime\n")
    got, _, err = run(["export", model_file, *argv], capsys)
    assert got == code, err
    if code == 2 and "positive integer" in fragment:
        assert fragment in err
        return
    assert fragment in one_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["TEST", "adir.npy"]  # nothing written


def test_sidecar_target_is_checked_too(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "step.onnx.json").write_text("mine")
    code, _, err = run(["export", model_file, "--onnx", tmp_path / "step.onnx", "--item-embeddings",
                        tmp_path / "i.npy"], capsys)
    assert code == 1 and "ONNX sidecar" in one_error(err) and "already exists" in one_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.onnx.json"]  # not even the items were written


def test_bad_model_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Path]) -> None:
    out = tmp_path / "i.npy"
    code, _, err = run(["export", tmp_path / "none.safetensors", "--item-embeddings", out], capsys)
    assert code == 1 and "model file not found: " in one_error(err)
    code, _, err = run(["export", data["test"], "--item-embeddings", out], capsys)
    assert code == 1 and "is not a gru4rec model file (it is a text file)" in one_error(err)
    truncated = tmp_path / "t.safetensors"
    truncated.write_bytes(FIXTURE_MODEL.read_bytes()[:500])
    code, _, err = run(["export", truncated, "--item-embeddings", out], capsys)
    assert code == 1 and "truncated or corrupt" in one_error(err)
    assert not out.exists()


def test_session_embeddings_with_other_column_names(model_file: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.datasets.synthetic import write_synthetic

    test = write_synthetic(tmp_path / "d", n_sessions=120, n_items=30, seed=11, test_days=5)["test"]
    renamed = tmp_path / "renamed.csv"
    import pandas as pd

    pd.read_csv(test, sep="\t").rename(columns={"SessionId": "sid", "ItemId": "iid", "Time": "ts"}).to_csv(renamed, index=False)
    code, _, err = run(["export", model_file, "--session-embeddings", renamed, tmp_path / "a.npy",
                        "-sk", "sid", "-ik", "iid", "-tk", "ts"], capsys)
    assert code == 0, err
    code, _, err = run(["export", model_file, "--session-embeddings", test, tmp_path / "b.npy"], capsys)
    assert code == 0, err
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    np.testing.assert_array_equal(a, b)
    code, _, err = run(["export", model_file, "--session-embeddings", renamed, tmp_path / "c.npy"], capsys)
    assert code == 1 and "SessionId" in one_error(err)
