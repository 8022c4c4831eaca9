"""The ONNX step of a model with click context (docs/attributes.md, "Click context"): the graph
takes the clicks' context as the input ``context`` (batch × 5) between ``items`` and the states.

References: ONNX Runtime, fed one click at a time with context values from real unix times through
the package's ``context_of``, against ``GRU4RecNet.step(items, hidden, context)`` + ``score_all``
(and the model's own ``score_sessions(..., times=...)``), in three embedding modes with and
without top-k, and with item attributes (cold items clicked and ranked); the context values
themselves against the calendar (``datetime``, test_context_model.by_hand) and against the
sidecar's formulas, evaluated as written.
"""
from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("onnxscript", reason="the ONNX exporter needs onnxscript (pip install 'gru4rec[export]')")
ort = pytest.importorskip("onnxruntime", reason="running the graph needs onnxruntime (pip install 'gru4rec[export]')")

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.config import Config  # noqa: E402
from gru4rec.data import ItemMap  # noqa: E402
from gru4rec.export import export_onnx  # noqa: E402
from gru4rec.items import CONTEXT_FEATURES, ItemAttributes, context_of, item_table_from_frame  # noqa: E402
from gru4rec.network.gru import GRU4RecNet  # noqa: E402
from test_attributes_cold import CATALOGUE, ITEM_IDS, SUPPORT, TABLE, C, N, favour_cold  # noqa: E402
from test_context_model import by_hand, events  # noqa: E402

torch.set_num_threads(1)
TOL = 1e-5
TINY = "n_sample=4,n_epochs=2,batch_size=8,sample_store_size=200"
#: One configuration per embedding mode (two layers where it matters) and its top_k.
CASES = {
    "shared": ("layers=8", None),
    "separate": ("layers=8/6,embedding=5,constrained_embedding=False,hidden_act=elu-0.5", 4),
    "none": ("layers=7,embedding=0,constrained_embedding=False", None),
}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """Sessions of 2-6 clicks over a week of unix times (float seconds), gaps of 1 s to 3 h."""
    return events(n_sessions=80, seed=4)


def sessions_with_times(frame: pd.DataFrame, model: GRU4Rec, n: int, length: int) -> tuple[list[list[Any]], list[list[float]]]:
    """The first ``n`` sessions of ``frame`` with at least ``length`` known clicks, cut to ``length``."""
    assert model.item_map is not None
    known = frame[frame["ItemId"].isin(model.item_map.to_list())]
    groups = [(g["ItemId"].tolist()[:length], g["Time"].tolist()[:length])
              for _, g in known.groupby("SessionId", sort=False) if len(g) >= length][:n]
    assert len(groups) == n
    return [g[0] for g in groups], [g[1] for g in groups]


def context_of_clicks(times: list[list[float]], t: int) -> np.ndarray:
    """Click t's context in every session (batch × 5) by the package's serving-time function."""
    now = np.array([ts[t] for ts in times])
    previous = np.array([ts[t - 1] for ts in times]) if t > 0 else None  # None: the first click
    return context_of(now, previous)


def run_onnx(session: Any, meta: dict[str, Any], rows: list[list[int]], times: list[list[float]]) -> list[list[np.ndarray]]:
    """Feed sessions side by side (catalogue indices, one batch row each), one click per run."""
    hidden = [np.zeros((len(rows), size), np.float32) for size in meta["layers"]]
    runs = []
    for t in range(len(rows[0])):
        feed = {"items": np.array([r[t] for r in rows], np.int64), "context": context_of_clicks(times, t),
                **dict(zip(meta["hidden_inputs"], hidden))}
        outputs = session.run(None, feed)
        hidden = outputs[len(outputs) - len(hidden):]
        runs.append(outputs)
    return runs


def run_torch(net: GRU4RecNet, rows: list[list[int]], times: list[list[float]]) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """The scores of every item and each layer's state after each click, by the network's own step."""
    hidden = net.init_hidden(len(rows))
    out = []
    with torch.no_grad():
        for t in range(len(rows[0])):
            last = net.step(torch.tensor([r[t] for r in rows]), hidden, torch.from_numpy(context_of_clicks(times, t)))
            out.append((net.score_all(last).numpy(), [h.numpy().copy() for h in hidden]))
    return out


def check_clicks(runs: list[list[np.ndarray]], want: list[tuple[np.ndarray, list[np.ndarray]]], top_k: int | None) -> None:
    for outputs, (scores, states) in zip(runs, want, strict=True):
        if top_k is None:
            np.testing.assert_allclose(outputs[0], scores, rtol=0, atol=TOL)
            got_states = outputs[1:]
        else:
            top_indices, top_scores, *got_states = outputs
            # each returned index carries its own score, and they are the k best scores
            np.testing.assert_allclose(np.take_along_axis(scores, top_indices, axis=1), top_scores, rtol=0, atol=TOL)
            np.testing.assert_allclose(top_scores, -np.sort(-scores, axis=1)[:, :top_k], rtol=0, atol=TOL)
        assert len(got_states) == len(states)
        for got, ref in zip(got_states, states):
            np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)


@pytest.fixture(scope="module")
def exported(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = {}
    for mode, (params, top_k) in CASES.items():
        model = GRU4Rec(f"{params},{TINY},click_context=True", device="cpu", seed=5, threads=1).fit(frame, progress=False)
        assert model.net is not None and model.net.mode == mode and model.click_context
        folder = tmp_path_factory.mktemp(mode)
        result = export_onnx(model, folder / "step.onnx", top_k=top_k)
        out[mode] = {"model": model, "result": result,
                     "session": ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])}
    return out


@pytest.mark.parametrize("mode", list(CASES))
def test_one_click_at_a_time_with_context_matches_the_step(exported: dict[str, dict[str, Any]], frame: pd.DataFrame,
                                                          mode: str) -> None:
    case = exported[mode]
    model, meta, top_k = case["model"], case["result"].description, CASES[mode][1]
    sessions, times = sessions_with_times(frame, model, n=5, length=3)
    index = {item: i for i, item in enumerate(meta["item_ids"])}
    rows = [[index[i] for i in s] for s in sessions]
    runs = run_onnx(case["session"], meta, rows, times)
    want = run_torch(model.net, rows, times)
    check_clicks(runs, want, top_k)
    # The model's own scoring path (times in, context computed by the engine) gives the same scores.
    for t, (scores, _) in enumerate(want):
        prefixes, prefix_times = [s[: t + 1] for s in sessions], [ts[: t + 1] for ts in times]
        np.testing.assert_allclose(model.score_sessions(prefixes, times=prefix_times), scores, rtol=0, atol=TOL)
    # The context matters: the same clicks at other times give other scores (the test can fail).
    shifted = [[x + 5 * 3600.0 for x in ts] for ts in times]
    other = run_onnx(case["session"], meta, rows, shifted)
    assert np.abs(other[-1][-1] - runs[-1][-1]).max() > 1e-3


def test_the_context_values_are_the_calendars(frame: pd.DataFrame) -> None:
    """What the test feeds the graph is what a click's calendar says (an independent formula)."""
    times = [g["Time"].tolist()[:3] for _, g in frame.groupby("SessionId", sort=False)][:6]
    for t in range(3):
        want = np.stack([by_hand(ts[t], ts[t - 1] if t else None) for ts in times])
        np.testing.assert_allclose(context_of_clicks(times, t), want, rtol=0, atol=1e-5)


def test_sidecar_names_the_context_input_and_how_to_compute_it(exported: dict[str, dict[str, Any]], frame: pd.DataFrame) -> None:
    for case in exported.values():
        result, session = case["result"], case["session"]
        meta = json.loads(result.sidecar.read_text())
        assert meta == result.description
        n_layers = len(meta["layers"])
        names = ["items", "context"] + [f"hidden_{i}" for i in range(n_layers)]
        assert [i.name for i in session.get_inputs()] == [i["name"] for i in meta["inputs"]] == names
        assert meta["hidden_inputs"] == names[2:]
        assert meta["inputs"][1] == {"name": "context", "dtype": "float32", "shape": ["batch", 5],
                                     "features": list(CONTEXT_FEATURES)}
        context_arg = session.get_inputs()[1]
        assert context_arg.type == "tensor(float)" and isinstance(context_arg.shape[0], str) and context_arg.shape[1:] == [5]
        assert "click context" in meta["what"]
        spec = meta["click_context"]
        assert spec["input"] == "context" and spec["features"] == list(CONTEXT_FEATURES)
    # The named function is the package's, importable as written.
    module, name = spec["function"].split("(")[0].rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is context_of
    # The formulas, evaluated as written ("mod" as Python's %, non-negative for a positive modulus),
    # give the calendar's values: a client transcribing them computes what the model was trained on.
    env: dict[str, Any] = {"sin": math.sin, "cos": math.cos, "log": math.log, "floor": math.floor, "pi": math.pi}

    def evaluate(expr: str, names: dict[str, float]) -> float:
        return float(eval(expr.replace(" mod ", " % "), {"__builtins__": {}}, {**env, **names}))

    assert set(spec["formulas"]) == set(CONTEXT_FEATURES)
    for ts in [g["Time"].tolist()[:2] for _, g in frame.groupby("SessionId", sort=False)][:5]:
        t, t_previous = ts[1], ts[0]
        names = {"t": t, "t_previous": t_previous}
        names.update({k: evaluate(v, names) for k, v in spec["definitions"].items()})
        got = [evaluate(spec["formulas"][f], names) for f in CONTEXT_FEATURES]
        np.testing.assert_allclose(got, by_hand(t, t_previous), rtol=0, atol=1e-9)
    assert "log_gap = 0" in spec["first_click"] and context_of(ts[0])[0, 4] == 0.0
    assert "t >= t_previous" in spec["order"]  # and what a click stamped earlier gets


def test_gru4rec_export_of_a_saved_context_model(exported: dict[str, dict[str, Any]], frame: pd.DataFrame,
                                                 tmp_path: Path) -> None:
    """The model file keeps Wc and the option: ``gru4rec export --onnx`` of it gives the graph
    with the context input and the model's own scores."""
    from gru4rec.cli import main

    model = exported["shared"]["model"]
    model.save(tmp_path / "ctx.safetensors")
    assert main(["-q", "export", str(tmp_path / "ctx.safetensors"), "--onnx", str(tmp_path / "s.onnx"), "-d", "cpu"]) == 0
    meta = json.loads((tmp_path / "s.onnx.json").read_text())
    assert meta["click_context"] == exported["shared"]["result"].description["click_context"]
    session = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"])
    sessions, times = sessions_with_times(frame, model, n=3, length=3)
    index = {item: i for i, item in enumerate(meta["item_ids"])}
    runs = run_onnx(session, meta, [[index[i] for i in s] for s in sessions], times)
    np.testing.assert_allclose(runs[-1][0], model.score_sessions(sessions, times=times), rtol=0, atol=TOL)


def test_a_plain_models_graph_has_no_context_input(tmp_path: Path, frame: pd.DataFrame) -> None:
    model = GRU4Rec(f"layers=8,{TINY}", device="cpu", seed=5, threads=1).fit(frame, progress=False)
    result = export_onnx(model, tmp_path / "step.onnx")
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["items", "hidden_0"]
    assert "click_context" not in result.description and "context" not in result.description["what"]


# ---------------------------------------------------------- click context and item attributes

#: Sessions (item ids, oldest first) that click cold items (97, 98, 99) beside warm ones, and their times.
SESSIONS = [[10, 97, 12], [97, 98, 99], [13, 11, 98], [12, 12, 97]]
TIMES = [[1.70e9, 1.70e9 + 40, 1.70e9 + 4000], [1.7002e9, 1.7002e9 + 1.5, 1.7002e9 + 9e4],
         [1.7004e9 + 0.25, 1.7004e9 + 600, 1.7004e9 + 601], [1.7006e9, 1.7006e9 + 86_400, 1.7006e9 + 86_460]]


def context_model_with_attributes(mode: str, seed: int = 3) -> GRU4Rec:
    """test_attributes_cold.model_with_attributes with click context: random tables and Wc, the
    cold items favoured (every ranking's top is a cold item)."""
    attrs = ItemAttributes.build(item_table_from_frame(TABLE, types={"tags": "multi"}), ItemMap.from_ids(pd.Series(ITEM_IDS)))
    config = Config.from_string("layers=5,click_context=True," + {"shared": "constrained_embedding=True",
                                                                   "separate": "constrained_embedding=False,embedding=4",
                                                                   "none": "constrained_embedding=False,embedding=0"}[mode])
    model = GRU4Rec(config, device="cpu", threads=1)
    g = torch.Generator().manual_seed(seed)
    net = GRU4RecNet(N, config, generator=g, attributes=attrs)
    with torch.no_grad():
        assert net.attributes is not None and net.Wc is not None
        for table in net.attributes.tables:
            table.copy_(torch.randn(table.shape, generator=g))
        net.Wc.mul_(50.0)  # the context moves the states well beyond the tolerance
    with torch.no_grad():
        favour_cold(net)
    model.net, model.item_map, model.item_support = net.eval(), ItemMap.from_ids(pd.Series(ITEM_IDS)), SUPPORT
    return model


@pytest.mark.parametrize("mode,top_k", [("shared", None), ("separate", 3), ("none", None)])
def test_context_and_attributes_rank_cold_items_as_the_step(mode: str, top_k: int | None, tmp_path: Path) -> None:
    model = context_model_with_attributes(mode)
    result = export_onnx(model, tmp_path / "step.onnx", top_k=top_k)
    meta = result.description
    assert meta["item_ids"] == CATALOGUE and meta["n_cold_items"] == C and meta["click_context"]["input"] == "context"
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["items", "context", "hidden_0"]
    rows = [[CATALOGUE.index(i) for i in s] for s in SESSIONS]
    assert model.net is not None
    want = run_torch(model.net, rows, TIMES)
    check_clicks(run_onnx(session, meta, rows, TIMES), want, top_k)
    assert want[-1][0].shape == (len(SESSIONS), N + C)
    assert np.all(np.argmax(want[-1][0], axis=1) >= N)  # a cold item on top: the catalogue's rows are in the graph
    np.testing.assert_allclose(model.score_sessions(SESSIONS, times=TIMES), want[-1][0], rtol=0, atol=TOL)
