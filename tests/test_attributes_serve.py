"""Cold items served end to end (issue 49): a real ``gru4rec serve`` process recommends the cold
items of a model with item attributes and takes clicks on them; ``gru4rec items add`` writes a
new item into the served file, the server swaps it in (``--watch``) and recommends it — no
retraining; ``gru4rec recommend`` returns cold items too.

The model is crafted (test_attributes_cold.favour_cold) so that every cold item (whose bias is its
attributes' part on the mean id bias) outranks the warm items.
Every expected score is the session's state (the network's own step) times the item's row built by
hand in NumPy (``rows_by_hand``; the new item's row from its attribute values and the model's
tables), plus its bias.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.serve.reload import file_sha256
from serve_helpers import httpx
from test_attributes_cold import CATALOGUE, COLD_IDS, ITEM_IDS, C, N, favour_cold, model_with_attributes, rows_by_hand
from test_serve_cli import processes_fixture, stop  # noqa: F401  # the fixture
from test_serve_reload import serve, wait_for_model

torch.set_num_threads(1)

#: The new item added to the served model: values every item of the table has, in a new combination.
NEW_ID, NEW_CAT, NEW_TAGS, NEW_PRICE = 500, "a", ["x"], 5.0
TOL = 1e-5


def crafted() -> GRU4Rec:
    """A model with attributes (shared embedding; cold items 97, 98 and 99; 98 and 99 with the
    same attributes) whose warm items score far below the cold ones."""
    model = model_with_attributes("shared", seed=4)
    assert model.net is not None
    favour_cold(model.net)
    return model


def new_row_by_hand(model: GRU4Rec) -> tuple[np.ndarray, float]:
    """The composed row and bias of the new item from its values: its category's row, the mean of
    its tags' rows, its standardised price times the projection, over the row's columns and the
    bias column (the tables' last); no id row or id bias: a cold item."""
    net = model.net
    assert net is not None and net.attributes is not None and net.attributes.projection is not None
    cat, tags = net.attributes.source.encoding.categorical
    price = net.attributes.source.encoding.numeric[0]
    t_cat, t_tags = (t.detach().numpy().astype(np.float64) for t in net.attributes.tables)
    proj = net.attributes.projection.detach().numpy().astype(np.float64)[0]
    full = (t_cat[int(cat.codes_of(np.array([NEW_CAT]))[0])] + t_tags[tags.codes_of(np.array(NEW_TAGS))].mean(0)
            + (NEW_PRICE - price.mean) / price.std * proj)
    return full[:-1], float(full[-1])


def state_after(model: GRU4Rec, clicks: list[Any]) -> np.ndarray:
    """The last layer's output after ``clicks`` (catalogue ids), by the network's own step."""
    assert model.net is not None and model.catalogue is not None
    hidden = model.net.init_hidden(1)
    with torch.no_grad():
        for index in model.catalogue.index_of(clicks):
            out = model.net.step(torch.tensor([int(index)]), hidden)
    return out[0].double().numpy()


def check_answer(body: dict[str, Any], ids: list[Any], scores: np.ndarray, k: int) -> None:
    """The server's top ``k`` are the reference's: the same scores, each item with its own score
    (exact ties, as 98 and 99, may come in either order)."""
    assert body["unknown"] == [] and body["fallback"] is False
    order = np.argsort(-scores, kind="stable")[:k]
    np.testing.assert_allclose(body["scores"], scores[order], rtol=TOL, atol=TOL)
    np.testing.assert_allclose([scores[ids.index(i)] for i in body["items"]], body["scores"], rtol=TOL, atol=TOL)


def test_a_running_server_recommends_cold_items_and_a_new_item_after_items_add(
    tmp_path: Path, processes: list
) -> None:
    model = crafted()
    rows, bias = rows_by_hand(model)
    path = tmp_path / "model.safetensors"
    model.save(path)
    proc, url = serve(path, processes, "--watch", "0.2")
    info = httpx.get(url + "/v1/model").json()
    assert info["n_items"] == N + C

    # a session of warm clicks: the cold items come first, with the scores of their NumPy rows
    scores = rows @ state_after(model, [12]) + bias
    body = httpx.post(url + "/v1/recommend", json={"items": [12], "k": C + 1}).json()
    check_answer(body, CATALOGUE, scores, C + 1)
    assert set(body["items"][:C]) == set(COLD_IDS) and body["items"][C] in ITEM_IDS
    assert CATALOGUE[int(np.argmax(scores))] in COLD_IDS

    # a session that clicks a cold item (a known click: its composed row is layer 0's input)
    httpx.post(url + "/v1/sessions/s1/events", json={"item": 12, "k": 3})
    body = httpx.post(url + "/v1/sessions/s1/events", json={"item": 97, "k": 3}).json()
    assert body["new_session"] is False
    check_answer(body, CATALOGUE, rows @ state_after(model, [12, 97]) + bias, 3)
    as_id_string = httpx.post(url + "/v1/recommend", json={"items": ["12", "97"], "k": 3}).json()
    assert as_id_string["items"] == body["items"]  # a cold id sent as a string is read as the catalogue's

    # a new item: `gru4rec items add` over the served file, then the hot swap; no retraining
    new_items = tmp_path / "new.tsv"
    pd.DataFrame({"ItemId": [NEW_ID], "cat": [NEW_CAT], "tags": ["|".join(NEW_TAGS)], "price": [NEW_PRICE]}).to_csv(
        new_items, sep="\t", index=False)
    assert main(["-q", "items", "add", str(path), str(new_items), "-o", str(path), "--force"]) == 0
    info = wait_for_model(url, file_sha256(path))
    assert info["n_items"] == N + C + 1
    ids = [*CATALOGUE, NEW_ID]
    new_row, new_bias = new_row_by_hand(model)
    rows2 = np.vstack([rows, new_row])  # the old rows are unchanged (the tables are)
    bias2 = np.append(bias, new_bias)
    scores = rows2 @ state_after(model, [12]) + bias2
    body = httpx.post(url + "/v1/recommend", json={"items": [12], "k": C + 1}).json()
    check_answer(body, ids, scores, C + 1)
    assert NEW_ID in body["items"]
    # the live session continues across the swap (same items at the same indices) and clicks the new item
    body = httpx.post(url + "/v1/sessions/s1/events", json={"item": NEW_ID, "k": C + 1}).json()
    assert body["new_session"] is False
    new = GRU4Rec.load(path, device="cpu")
    check_answer(body, ids, rows2 @ state_after(new, [12, 97, NEW_ID]) + bias2, C + 1)
    code, _, err = stop(proc, signal.SIGTERM)
    assert code == 0 and "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_the_recommend_command_returns_cold_items(tmp_path: Path, exclude_seen: bool) -> None:
    model = crafted()
    rows, bias = rows_by_hand(model)
    model.save(tmp_path / "m.safetensors")
    pd.DataFrame({"SessionId": [1, 1, 2, 3], "ItemId": [12, 97, 11, 555], "Time": [0, 1, 0, 0]}).to_csv(
        tmp_path / "s.tsv", sep="\t", index=False)
    argv = ["-q", "recommend", str(tmp_path / "m.safetensors"), "-i", str(tmp_path / "s.tsv"),
            "-o", str(tmp_path / "r.tsv"), "-k", "3", "--device", "cpu", "--threads", "1"]
    assert main(argv + (["--exclude-seen"] if exclude_seen else [])) == 0
    recs = pd.read_csv(tmp_path / "r.tsv", sep="\t")
    for session, clicks in ((1, [12, 97]), (2, [11])):
        got = recs[recs["SessionId"] == session]
        scores = rows @ state_after(model, clicks) + bias
        if exclude_seen:
            scores[[CATALOGUE.index(c) for c in clicks]] = -np.inf
        order = np.argsort(-scores, kind="stable")[:3]
        np.testing.assert_allclose(got["Score"], scores[order], rtol=TOL, atol=TOL)
        assert not got["Fallback"].any()
        unseen_cold = [i for i in COLD_IDS if not (exclude_seen and i in clicks)]
        assert set(got["ItemId"][: len(unseen_cold)]) == set(unseen_cold)  # every cold item first (warm: -100)
        assert (97 in set(got["ItemId"])) != (exclude_seen and session == 1)
    # a session of unknown items only (555 is in no table) gets the popular items; cold ones have no support
    assert recs[recs["SessionId"] == 3]["Fallback"].all()
