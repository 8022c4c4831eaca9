"""The one-click ONNX graph: ONNX Runtime, fed one click at a time, gives the model's own scores,
top-k and states (to 1e-5) at two batch sizes, in every embedding mode, with and without
top-k; the sidecar describes the graph; docs/exports.md's ONNX example runs as printed; every bad
target or argument is one clear error and leaves no file behind."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("onnxscript", reason="the ONNX exporter needs onnxscript (pip install 'gru4rec[export]')")
ort = pytest.importorskip("onnxruntime", reason="running the graph needs onnxruntime (pip install 'gru4rec[export]')")
onnx = pytest.importorskip("onnx")

from export_helpers import known_sessions, synthetic, train  # noqa: E402
from gru4rec import GRU4Rec, files  # noqa: E402
from gru4rec.errors import Gru4RecError  # noqa: E402
from gru4rec.export import export_onnx, sidecar_path  # noqa: E402

README = Path(__file__).resolve().parents[1] / "docs" / "exports.md"  # the export examples live there
TOL = 1e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return synthetic(tmp_path_factory.mktemp("data"))


#: One export per embedding mode; the first two cover the graph with and without top-k.
CASES = {"separate": None, "shared": 5, "none": None}


@pytest.fixture(scope="module")
def exported(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = {}
    for mode, top_k in CASES.items():
        model = train(data, mode)
        folder = tmp_path_factory.mktemp(mode)
        result = export_onnx(model, folder / "step.onnx", top_k=top_k)
        out[mode] = {"model": model, "result": result, "folder": folder,
                     "session": ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])}
    return out


def _run_clicks(session: Any, meta: dict[str, Any], sessions: list[list[int]], model: GRU4Rec) -> list[list[np.ndarray]]:
    """Feed ``sessions`` side by side (one batch row each), one click per run; the outputs of
    every run."""
    index = {item: i for i, item in enumerate(meta["item_ids"])}
    hidden = [np.zeros((len(sessions), size), np.float32) for size in meta["layers"]]
    runs = []
    for t in range(len(sessions[0])):
        items = np.array([index[s[t]] for s in sessions], np.int64)
        outputs = session.run(None, {"items": items, **dict(zip(meta["hidden_inputs"], hidden))})
        hidden = outputs[len(outputs) - len(hidden):]
        runs.append(outputs)
    return runs


def _reference_states(model: GRU4Rec, sessions: list[list[int]], t: int) -> list[np.ndarray]:
    """Each layer's state after click t, by PyTorch's own step (the model's network)."""
    net = model.net
    assert net is not None and model.item_map is not None
    hidden = net.init_hidden(len(sessions))
    with torch.no_grad():
        for step in range(t + 1):
            items = torch.from_numpy(model.item_map.index_of([s[step] for s in sessions]))
            net.step(items, hidden)
    return [h.numpy() for h in hidden]


@pytest.mark.parametrize("mode", list(CASES))
@pytest.mark.parametrize("batch", [1, 4])
def test_one_click_at_a_time_matches_pytorch(exported: dict[str, dict[str, Any]], data: dict[str, Path],
                                             mode: str, batch: int) -> None:
    case = exported[mode]
    model, meta, top_k = case["model"], case["result"].description, CASES[mode]
    candidates = [s[:4] for s in known_sessions(model, data, min_length=4)]
    assert len(candidates) >= 8
    groups = [candidates[i:i + batch] for i in range(0, 8, batch)]  # 8 sessions, in batches of `batch`
    for sessions in groups:
        runs = _run_clicks(case["session"], meta, sessions, model)
        for t, outputs in enumerate(runs):
            prefixes = [s[: t + 1] for s in sessions]
            want_scores = model.score_sessions(prefixes)  # the model's own scores after the prefix
            if top_k is None:
                np.testing.assert_allclose(outputs[0], want_scores, rtol=0, atol=TOL)
                states = outputs[1:]
            else:
                top_indices, top_scores, *states = outputs
                want = model.recommend_batch(prefixes, k=top_k)
                assert [list(np.asarray(meta["item_ids"])[row]) for row in top_indices] == [list(r.item_ids) for r in want]
                np.testing.assert_allclose(top_scores, np.stack([r.scores for r in want]), rtol=0, atol=TOL)
                np.testing.assert_allclose(top_scores, -np.sort(-want_scores, axis=1)[:, :top_k], rtol=0, atol=TOL)
            for got, ref in zip(states, _reference_states(model, sessions, t)):
                np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)


def test_sidecar_describes_the_graph(exported: dict[str, dict[str, Any]]) -> None:
    for mode, case in exported.items():
        model, result = case["model"], case["result"]
        meta = json.loads(result.sidecar.read_text())
        assert result.sidecar == sidecar_path(result.path) == result.path.with_name("step.onnx.json")
        assert meta == result.description
        assert meta["item_ids"] == model.item_map.to_list()
        assert meta["layers"] == model.net.sizes and meta["n_items"] == len(model.item_map)
        assert meta["embedding_mode"] == mode and meta["top_k"] == CASES[mode]
        session = case["session"]
        assert [i.name for i in session.get_inputs()] == [i["name"] for i in meta["inputs"]]
        assert [o.name for o in session.get_outputs()] == [o["name"] for o in meta["outputs"]]
        assert meta["hidden_inputs"] == [f"hidden_{i}" for i in range(len(meta["layers"]))]
        # The batch axis is symbolic, the others fixed, as the sidecar says.
        for spec, arg in zip(meta["inputs"] + meta["outputs"], list(session.get_inputs()) + list(session.get_outputs())):
            assert isinstance(arg.shape[0], str) and arg.shape[1:] == spec["shape"][1:], (spec, arg.shape)
        proto = onnx.load(str(result.path))
        assert {o.domain: o.version for o in proto.opset_import}[""] == meta["opset"] == 18


def _readme_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"docs/exports.md must hold one python example with {marker!r}"
    return found[0]


def test_readme_serving_example_runs(exported: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], data: dict[str, Path]) -> None:
    code = _readme_block("import onnxruntime")
    assert len([line for line in code.splitlines() if line.strip()]) <= 16  # the "15-line example"
    imports = {m for line in code.splitlines() if line.startswith("import ") for m in [line.split()[1]]}
    assert imports <= {"json", "numpy", "onnxruntime"}
    case = exported["separate"]
    monkeypatch.chdir(case["folder"])  # where step.onnx and step.onnx.json are
    namespace: dict[str, Any] = {}
    capsys.readouterr()
    exec(compile(code, "docs/exports.md", "exec"), namespace)
    model = case["model"]
    printed = capsys.readouterr().out
    assert printed.strip() == str([int(i) for i in model.recommend(model.item_map.to_list()[:3], k=20).item_ids])
    for session in known_sessions(model, data, min_length=2)[:5]:
        assert namespace["recommend"](session) == [int(i) for i in model.recommend(session, k=20).item_ids]


# ------------------------------------------------------------------------------------ errors


@pytest.fixture(scope="module")
def model(exported: dict[str, dict[str, Any]]) -> GRU4Rec:
    return exported["separate"]["model"]


def test_refuses_to_overwrite_either_file(model: GRU4Rec, tmp_path: Path) -> None:
    target = tmp_path / "step.onnx"
    target.write_text("mine")
    with pytest.raises(Gru4RecError, match=r"ONNX file .*step\.onnx already exists; pass overwrite=True to replace it"):
        export_onnx(model, target)
    assert target.read_text() == "mine"
    target.unlink()
    sidecar_path(target).write_text("mine too")
    with pytest.raises(Gru4RecError, match=r"ONNX sidecar .*step\.onnx\.json already exists"):
        export_onnx(model, target)
    assert not target.exists() and sidecar_path(target).read_text() == "mine too"


@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 0}, "top_k must be between 1 and the number of items"),
    ({"top_k": 10_000}, r"top_k must be between 1 and the number of items \(\d+\), got 10000"),
    ({"opset": 17}, "opset must be an integer >= 18"),
])
def test_bad_arguments(model: GRU4Rec, tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(Gru4RecError, match=message):
        export_onnx(model, tmp_path / "step.onnx", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_bad_targets(model: GRU4Rec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Gru4RecError, match=r"ONNX file .* is a folder, not a file"):
        export_onnx(model, tmp_path)
    with pytest.raises(Gru4RecError, match=r"cannot write ONNX file .*: folder .*nope does not exist"):
        export_onnx(model, tmp_path / "nope" / "step.onnx")
    with pytest.raises(Gru4RecError, match="not trained yet"):
        export_onnx(GRU4Rec(device="cpu"), tmp_path / "step.onnx")


def test_unwritable_folder_leaves_nothing(exported: dict[str, dict[str, Any]], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Root ignores folder permissions, so the failure is simulated where the file is created.
    from gru4rec.export import onnx as onnx_export

    case = exported["separate"]
    model = case["model"]
    proto = onnx.load(str(case["result"].path))
    monkeypatch.setattr(onnx_export, "_trace", lambda *args: proto)  # the graph as traced before
    calls = {"n": 0}
    real = files.tempfile.mkstemp

    def deny_second(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the graph was written; the sidecar fails
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(files.tempfile, "mkstemp", deny_second)
    with pytest.raises(Gru4RecError, match=r"cannot write ONNX sidecar .*step\.onnx\.json: .*Permission denied"):
        export_onnx(model, tmp_path / "step.onnx")
    assert calls["n"] == 2 and list(tmp_path.iterdir()) == []  # the graph taken back, no temporary file
    calls["n"] = 1  # the first mkstemp fails now: nothing is written at all
    with pytest.raises(Gru4RecError, match=r"cannot write ONNX file .*step\.onnx: .*Permission denied"):
        export_onnx(model, tmp_path / "step.onnx")
    assert list(tmp_path.iterdir()) == []


def test_missing_exporter_says_how_to_install(model: GRU4Rec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'gru4rec\[export\]'"):
        export_onnx(model, tmp_path / "step.onnx")
    assert list(tmp_path.iterdir()) == []


def test_too_large_for_one_onnx_file(model: GRU4Rec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gru4rec.export import onnx as onnx_export

    monkeypatch.setattr(onnx_export, "_MAX_ONNX_BYTES", 1000)
    with pytest.raises(Gru4RecError, match=r"weights are 0\.0 GiB; one ONNX file holds at most 2 GiB"):
        export_onnx(model, tmp_path / "step.onnx")
    assert list(tmp_path.iterdir()) == []
