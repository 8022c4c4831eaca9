"""The exports of a model with item attributes (issue 49): the item embeddings file and the ONNX
step hold the whole catalogue — the training items, then the cold items — with the rows the model
scores with (id row and bias plus the attributes' parts; a cold item's attributes on the mean id bias).

References: every composed row built by hand in NumPy (``rows_by_hand`` of
tests/test_attributes_cold.py), and the model's own ``score_all``/``recommend``/step, on sessions
that click cold items and whose best next item is a cold one. ONNX Runtime must agree with them.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.export import export_onnx, item_embeddings, session_embeddings
from gru4rec.export.common import as_plain_network, catalogue_tables
from gru4rec.export.tables import write_table
from test_attributes_cold import CATALOGUE, COLD_IDS, ITEM_IDS, C, N, favour_cold, input_rows_by_hand, model_with_attributes, rows_by_hand

torch.set_num_threads(1)

MODES = ["shared", "separate", "none"]
#: Sessions (item ids, oldest first) that click cold items (97, 98) beside warm ones.
SESSIONS = [[10, 97, 12], [97, 98, 99], [13, 11, 98], [12, 12, 97]]
TOL = 1e-5


def crafted(mode: str) -> GRU4Rec:
    """A model with attributes whose warm items score far below the cold ones
    (test_attributes_cold.favour_cold): the top of every ranking is a cold item."""
    model = model_with_attributes(mode, seed=3)
    assert model.net is not None
    favour_cold(model.net)
    return model


def step_by_hand(model: GRU4Rec, sessions: list[list[Any]]) -> list[torch.Tensor]:
    """The last layer's output after each click, by the network's own step (catalogue indices)."""
    net, catalogue = model.net, model.catalogue
    assert net is not None and catalogue is not None
    hidden = net.init_hidden(len(sessions))
    outs = []
    with torch.no_grad():
        for t in range(len(sessions[0])):
            outs.append(net.step(torch.from_numpy(catalogue.index_of([s[t] for s in sessions])), hidden).clone())
    return outs


@pytest.mark.parametrize("mode", MODES)
def test_item_embeddings_are_the_catalogues_composed_rows(mode: str) -> None:
    model = crafted(mode)
    rows, bias = rows_by_hand(model)
    columns, description = item_embeddings(model)
    assert columns["item_id"].tolist() == CATALOGUE
    np.testing.assert_allclose(columns["output"], rows, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(columns["bias"], bias, rtol=TOL, atol=TOL)  # a cold item's: its attributes' part
    assert description["n_items"] == N + C and description["n_cold_items"] == C
    assert description["item_attributes"] == ["cat", "tags", "price"]
    net = model.net
    assert net is not None
    if mode == "shared":
        assert "input" not in columns
    else:
        np.testing.assert_allclose(columns["input"], input_rows_by_hand(model), rtol=TOL, atol=TOL)
        assert "a cold item's from its attributes alone" in description["columns"]["input"]
    # an inner-product index over [output, bias] queried with [h, 1] gives the model's scores and top-k
    with torch.no_grad():
        h = model.step(torch.tensor([CATALOGUE.index(97)]), model.init_state(1))
        want = model.scores(h)[0].numpy()
    got = h[0].numpy() @ columns["output"].T + columns["bias"]
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    top = model.recommend([97], k=3)
    assert sorted(columns["item_id"][np.argsort(-got, kind="stable")[:3]].tolist()) == sorted(top.item_ids.tolist())
    assert set(top.item_ids.tolist()) <= set(COLD_IDS)


def test_the_embeddings_file_round_trips_the_cold_items(tmp_path: Path) -> None:
    model = crafted("shared")
    columns, description = item_embeddings(model)
    write_table(tmp_path / "items.npy", columns, description)
    back = np.load(tmp_path / "items.npy")
    assert back["item_id"].tolist() == CATALOGUE
    np.testing.assert_array_equal(back["output"], columns["output"])


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_session_embeddings_keep_clicks_on_cold_items(mode: str) -> None:
    """A cold item is a known click: the session vector is the state after it (no warning)."""
    model = crafted(mode)
    events = pd.DataFrame({"SessionId": np.repeat(np.arange(len(SESSIONS)), 3),
                           "ItemId": [i for s in SESSIONS for i in s], "Time": np.arange(3 * len(SESSIONS))})
    columns, _ = session_embeddings(model, events)
    assert columns["n_events"].tolist() == [3] * len(SESSIONS)
    np.testing.assert_allclose(columns["embedding"], step_by_hand(model, SESSIONS)[-1].numpy(), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("mode", MODES)
def test_the_plain_network_of_the_catalogue_steps_and_scores_alike(mode: str) -> None:
    """``as_plain_network`` (what the ONNX export traces): the same input rows for every
    catalogue item, warm or cold, and the same scores as the network with attributes."""
    model = crafted(mode)
    net = model.net
    assert net is not None
    plain = as_plain_network(copy.deepcopy(net))
    assert plain.attributes is None and plain.n_items == N + C and net.attributes is not None  # net unchanged
    every = torch.arange(N + C)
    with torch.no_grad():
        torch.testing.assert_close(plain.input_rows(every), net.input_rows(every), rtol=TOL, atol=TOL)
        out = torch.randn(2, net.sizes[-1], generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(plain.score_all(out), net.score_all(out), rtol=TOL, atol=TOL)
    tables = catalogue_tables(net)
    assert tables.output.shape == (N + C, net.sizes[-1])
    np.testing.assert_allclose(tables.bias.numpy(), rows_by_hand(model)[1], rtol=TOL, atol=TOL)


def _onnxruntime() -> Any:
    pytest.importorskip("onnxscript", reason="the ONNX exporter needs onnxscript (pip install 'gru4rec[export]')")
    return pytest.importorskip("onnxruntime", reason="running the graph needs onnxruntime (pip install 'gru4rec[export]')")


@pytest.mark.parametrize("mode,top_k", [("shared", None), ("separate", 3), ("none", None), ("shared", 4)])
def test_onnx_runtime_ranks_cold_items_as_the_model_does(mode: str, top_k: int | None, tmp_path: Path) -> None:
    runtime = _onnxruntime()
    model = crafted(mode)
    result = export_onnx(model, tmp_path / "step.onnx", top_k=top_k)
    meta = result.description
    assert meta["item_ids"] == CATALOGUE and meta["n_items"] == N + C and meta["n_cold_items"] == C
    session = runtime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    index = {item: i for i, item in enumerate(meta["item_ids"])}
    hidden = [np.zeros((len(SESSIONS), size), np.float32) for size in meta["layers"]]
    rows, bias = rows_by_hand(model)
    for t, out in enumerate(step_by_hand(model, SESSIONS)):
        items = np.array([index[s[t]] for s in SESSIONS], np.int64)
        outputs = session.run(None, {"items": items, **dict(zip(meta["hidden_inputs"], hidden))})
        hidden = outputs[len(outputs) - len(hidden):]
        np.testing.assert_allclose(hidden[-1], out.numpy(), rtol=0, atol=TOL)  # the same step, cold clicks too
        prefixes = [s[: t + 1] for s in SESSIONS]
        want = model.score_sessions(prefixes)  # the model's own scores (score_all over N + C)
        np.testing.assert_allclose(want, out.double().numpy() @ rows.T + bias, rtol=TOL, atol=TOL)  # NumPy reference
        if top_k is None:
            np.testing.assert_allclose(outputs[0], want, rtol=0, atol=TOL)
            best = np.asarray(meta["item_ids"])[outputs[0].argmax(axis=1)]
        else:
            recs = model.recommend_batch(prefixes, k=top_k)
            got_ids = np.asarray(meta["item_ids"])[outputs[0]]
            np.testing.assert_allclose(outputs[1], np.stack([r.scores for r in recs]), rtol=0, atol=TOL)
            # the same items, up to the order of exact ties (98 and 99 have the same attributes)
            np.testing.assert_allclose(np.take_along_axis(want, outputs[0], axis=1), outputs[1], rtol=0, atol=TOL)
            assert [sorted(r) for r in got_ids.tolist()] == [sorted(r.item_ids.tolist()) for r in recs]
            best = got_ids[:, 0]
        assert set(best.tolist()) <= set(COLD_IDS)  # the warm items' -100 bias puts a cold item first
    assert all(i in ITEM_IDS or i in COLD_IDS for i in meta["item_ids"])


# ------------------------------------------------------------------ a trained model, through the command line


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``gru4rec synth --kind intents-attributes`` at its smallest, and a model trained on it with
    ``gru4rec train --item-features`` per embedding mode (one short epoch)."""
    folder = tmp_path_factory.mktemp("attributes_export")
    data = folder / "d"
    assert main(["-q", "synth", str(data), "--kind", "intents-attributes", "--n-sessions", "300", "--n-items", "60",
                 "--n-intents", "4", "--seed", "1"]) == 0
    out: dict[str, Any] = {"data": data}
    for mode, params in (("shared", "layers=8,constrained_embedding=True"),
                         ("separate", "layers=8,embedding=6,constrained_embedding=False")):
        path = folder / f"{mode}.safetensors"
        with pytest.warns():  # the table's small categories: the high-cardinality warning
            assert main(["-q", "train", str(data / "train_full.tsv"), "-ps",
                         f"{params},n_epochs=1,loss=cross-entropy,n_sample=16,batch_size=16", "--item-features",
                         str(data / "items.tsv"), "--item-types", "category=categorical", "--save", str(path),
                         "-d", "cpu", "--threads", "1", "--seed", "1"]) == 0
        out[mode] = path
    return out


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_gru4rec_export_of_a_trained_model_ranks_test_sessions_cold_items_as_the_model(
    trained: dict[str, Any], mode: str, tmp_path: Path
) -> None:
    """Test sessions that click and target items no training event has: ONNX Runtime's scores
    and the embeddings file's rows give the model's own scores (``score_sessions``)."""
    runtime = _onnxruntime()
    assert main(["-q", "export", str(trained[mode]), "--onnx", str(tmp_path / "s.onnx"), "--item-embeddings",
                 str(tmp_path / "items.npy"), "-d", "cpu"]) == 0
    model = GRU4Rec.load(trained[mode], device="cpu")
    assert model.catalogue is not None and model.item_map is not None
    warm = set(model.item_map.to_list())
    test = pd.read_csv(trained["data"] / "test.tsv", sep="\t").sort_values(["SessionId", "Time"], kind="stable")
    sessions = [s[:3] for s in test.groupby("SessionId", sort=False)["ItemId"].agg(list) if len(s) >= 3]
    with_cold = [s for s in sessions if any(i not in warm for i in s)][:4]
    assert len(with_cold) == 4  # the generator's new items: clicked (and targeted) in test sessions only
    meta = json.loads((tmp_path / "s.onnx.json").read_text())
    assert meta["item_ids"] == model.catalogue.to_list() and meta["n_cold_items"] == len(model.catalogue) - len(warm)
    session = runtime.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"])
    index = {item: i for i, item in enumerate(meta["item_ids"])}
    hidden = [np.zeros((len(with_cold), size), np.float32) for size in meta["layers"]]
    items = np.load(tmp_path / "items.npy")
    for t in range(3):
        outputs = session.run(None, {"items": np.array([index[s[t]] for s in with_cold], np.int64),
                                     **dict(zip(meta["hidden_inputs"], hidden))})
        hidden = outputs[1:]
        want = model.score_sessions([s[: t + 1] for s in with_cold])
        np.testing.assert_allclose(outputs[0], want, rtol=0, atol=TOL)
        np.testing.assert_allclose(hidden[-1] @ items["output"].T + items["bias"], want, rtol=0, atol=1e-4)
    assert items["item_id"].tolist() == meta["item_ids"]
