"""Item and session embeddings: the columns are the network's own tensors and final states, both
file formats read back to the same numbers, and a FAISS-style inner-product top-k computed by
brute force in NumPy from the exported files alone is the model's own top-k. The FAISS
example runs against a NumPy stand-in for faiss (and against faiss itself where installed)."""
from __future__ import annotations

import json
import logging
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from export_helpers import MODES, known_sessions, synthetic, train
from gru4rec import GRU4Rec, files
from gru4rec.errors import DataError, Gru4RecError
from gru4rec.export import item_embeddings, session_embeddings, write_table

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

README = Path(__file__).resolve().parents[1] / "docs" / "exports.md"  # the export examples live there
K = 10


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return synthetic(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def models(data: dict[str, Path]) -> dict[str, GRU4Rec]:
    return {mode: train(data, mode) for mode in MODES}


def _read(path: Path) -> dict[str, np.ndarray]:
    """An exported file back as columns: vectors as 2-D float32 arrays."""
    if path.suffix == ".npy":
        array = np.load(path)  # allow_pickle=False by default: no objects inside
        return {name: np.asarray(array[name]) for name in array.dtype.names}
    table = pq.read_table(path)
    out = {}
    for name in table.column_names:
        column = table[name].combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            out[name] = column.flatten().to_numpy().reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_item_columns_are_the_networks_tensors(models: dict[str, GRU4Rec], mode: str) -> None:
    model = models[mode]
    net = model.net
    columns, description = item_embeddings(model)
    assert list(columns["item_id"]) == model.item_map.to_list()
    np.testing.assert_array_equal(columns["output"], net.Wy.detach().numpy())
    np.testing.assert_array_equal(columns["bias"], net.By.detach().numpy())
    expected_input = {"shared": None, "separate": net.E, "none": net.layers[0].Wx}[mode]
    if expected_input is None:
        assert "input" not in columns and "input" not in description["columns"]
    else:
        np.testing.assert_array_equal(columns["input"], expected_input.detach().numpy())
        assert columns["input"].shape == ((len(model.item_map), 5) if mode == "separate" else (len(model.item_map), 3 * 7))
    assert description["embedding_mode"] == mode and set(description["columns"]) == set(columns)


@pytest.mark.parametrize("suffix", [".parquet", ".npy"])
@pytest.mark.parametrize("mode", list(MODES))
def test_brute_force_inner_product_top_k_is_the_models(models: dict[str, GRU4Rec], data: dict[str, Path],
                                                       tmp_path: Path, mode: str, suffix: str) -> None:
    model = models[mode]
    columns, description = item_embeddings(model)
    write_table(tmp_path / f"items{suffix}", columns, description)
    columns, description = session_embeddings(model, data["test"])
    write_table(tmp_path / f"sessions{suffix}", columns, description)
    items, sessions = _read(tmp_path / f"items{suffix}"), _read(tmp_path / f"sessions{suffix}")
    # FAISS-style maximum inner product: index rows [output, bias], queries [embedding, 1].
    index = np.hstack([items["output"], items["bias"][:, None]]).astype(np.float64)
    queries = np.hstack([sessions["embedding"], np.ones((len(sessions["embedding"]), 1))]).astype(np.float64)
    scores = queries @ index.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    expected_sessions = known_sessions(model, data)
    assert len(sessions["session_id"]) == len(expected_sessions) > 10
    test = pd.read_csv(data["test"], sep="\t")
    order = test.sort_values(["SessionId", "Time"], kind="stable").drop_duplicates("SessionId")["SessionId"]
    assert list(sessions["session_id"]) == list(order)  # one row per session, by session id
    want = model.recommend_batch(expected_sessions, k=K)
    for row, rec in enumerate(want):
        assert list(items["item_id"][top[row]]) == list(rec.item_ids), row
        np.testing.assert_allclose(scores[row, top[row]], rec.scores, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(sessions["n_events"], [len(s) for s in expected_sessions])
    # The embedding is the model's own final state: its scores are score_sessions'.
    np.testing.assert_allclose(scores, model.score_sessions(expected_sessions), rtol=0, atol=1e-5)


def test_session_states_are_the_networks_last_layer_output(models: dict[str, GRU4Rec], data: dict[str, Path]) -> None:
    model = models["separate"]
    sessions = known_sessions(model, data)[:6]
    got = model.session_embeddings(sessions)
    net = model.net
    for row, session in enumerate(sessions):
        hidden = net.init_hidden(1)
        with torch.no_grad():
            for item in model.item_map.index_of(session):
                out = net.step(torch.tensor([item]), hidden)
        np.testing.assert_allclose(got[row], out[0].numpy(), rtol=0, atol=1e-6)
    with pytest.warns(UserWarning, match="1 unknown item id"), \
            pytest.raises(Gru4RecError, match="at least one known item for its embedding"):
        model.session_embeddings([[-12345]])


def test_unknown_items_and_sessions_are_skipped_with_warnings(models: dict[str, GRU4Rec], caplog: pytest.LogCaptureFixture) -> None:
    model = models["shared"]
    ids = model.item_map.to_list()
    events = pd.DataFrame({"SessionId": [1, 1, 1, 2, 2, 3], "ItemId": [ids[0], -5, ids[1], -6, -7, ids[2]],
                           "Time": [1, 2, 3, 1, 2, 5]})
    with caplog.at_level(logging.WARNING, logger="gru4rec"):
        columns, _ = session_embeddings(model, events)
    assert list(columns["session_id"]) == [1, 3] and list(columns["n_events"]) == [2, 1]
    np.testing.assert_allclose(columns["embedding"], model.session_embeddings([[ids[0], ids[1]], [ids[2]]]), atol=1e-6)
    text = caplog.text
    assert "3 event(s) with items the model does not know" in text and "1 session(s) with no item" in text
    with pytest.raises(DataError, match="no session has an item the model knows"):
        session_embeddings(model, events[events["SessionId"] == 2])


def test_string_ids_survive_both_formats(data: dict[str, Path], tmp_path: Path) -> None:
    events = pd.read_csv(data["train_full"], sep="\t")
    events["ItemId"] = "sku-" + events["ItemId"].astype(str)
    model = GRU4Rec("layers=4,n_sample=4,n_epochs=1,batch_size=8,sample_store_size=100", device="cpu").fit(events, progress=False)
    columns, description = item_embeddings(model)
    for suffix in (".parquet", ".npy"):
        write_table(tmp_path / f"items{suffix}", columns, description)
        back = _read(tmp_path / f"items{suffix}")
        assert [str(i) for i in back["item_id"]] == model.item_map.to_list()
        np.testing.assert_array_equal(back["output"], columns["output"])
    schema = pq.read_schema(tmp_path / "items.parquet")
    assert json.loads(schema.metadata[b"gru4rec"])["columns"]["output"].startswith("the item's output vector")
    vector = schema.field("output").type
    assert pa.types.is_fixed_size_list(vector) and vector.list_size == 4 and vector.value_type == pa.float32()
    assert schema.field("item_id").type == pa.string() and np.load(tmp_path / "items.npy").dtype["item_id"].kind == "U"


def test_readme_faiss_example(models: dict[str, GRU4Rec], data: dict[str, Path], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (code,) = [b for b in blocks if "import faiss" in b]
    model = models["separate"]
    write_table(tmp_path / "items.npy", *item_embeddings(model))
    write_table(tmp_path / "sessions.npy", *session_embeddings(model, data["test"]))
    monkeypatch.chdir(tmp_path)

    class IndexFlatIP:
        """faiss.IndexFlatIP's contract, by brute force: exact inner-product search."""

        def __init__(self, d: int) -> None:
            self.rows = np.zeros((0, d), np.float32)

        def add(self, x: np.ndarray) -> None:
            assert x.dtype == np.float32 and x.shape[1] == self.rows.shape[1]
            self.rows = np.vstack([self.rows, x])

        def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            scores = q.astype(np.float64) @ self.rows.T.astype(np.float64)
            rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            return np.take_along_axis(scores, rows, axis=1).astype(np.float32), rows

    want = [list(r.item_ids) for r in model.recommend_batch(known_sessions(model, data), k=20)]
    engines = [types.SimpleNamespace(IndexFlatIP=IndexFlatIP)]
    if "faiss" in sys.modules or _importable("faiss"):
        import faiss

        engines.append(faiss)
    for engine in engines:
        monkeypatch.setitem(sys.modules, "faiss", engine)
        namespace: dict[str, Any] = {}
        exec(compile(code, "docs/exports.md", "exec"), namespace)
        assert [list(row) for row in namespace["top20"]] == want


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------------------------------------ errors


def _columns() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    return {"item_id": np.arange(3), "output": np.ones((3, 2), np.float32)}, {"what": "test"}


def test_unknown_extension(tmp_path: Path) -> None:
    for name in ("items.csv", "items.npz", "items"):
        with pytest.raises(Gru4RecError, match=rf"item embeddings file .*{name}: unknown extension"):
            write_table(tmp_path / name, *_columns(), what="item embeddings file")
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "items.npy"
    target.write_text("mine")
    with pytest.raises(Gru4RecError, match=r"items\.npy already exists; pass overwrite=True to replace it"):
        write_table(target, *_columns())
    assert target.read_text() == "mine"
    write_table(target, *_columns(), overwrite=True)
    assert list(np.load(target)["item_id"]) == [0, 1, 2]


def test_bad_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(Gru4RecError, match=r"dir\.npy is a folder, not a file"):
        write_table(tmp_path / "dir.npy", *_columns())
    with pytest.raises(Gru4RecError, match=r"folder .*nope does not exist"):
        write_table(tmp_path / "nope" / "items.parquet", *_columns())

    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", deny)
    with pytest.raises(Gru4RecError, match=r"cannot write output file .*items\.parquet: .*Permission denied"):
        write_table(tmp_path / "items.parquet", *_columns())
    assert [p.name for p in tmp_path.iterdir()] == ["dir.npy"]


def test_parquet_without_pyarrow_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pip install 'gru4rec\[parquet\]'"):
        write_table(tmp_path / "items.parquet", *_columns())
    write_table(tmp_path / "items.npy", *_columns())  # .npy needs only numpy
    assert [p.name for p in tmp_path.iterdir()] == ["items.npy"]


def test_unfitted_model() -> None:
    with pytest.raises(Gru4RecError, match="not trained yet"):
        item_embeddings(GRU4Rec(device="cpu"))
