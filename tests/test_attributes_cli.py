"""The command line of item attributes (issue 49): ``gru4rec items add MODEL NEW_ITEMS -o MODEL2``."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.network.gru import GRU4RecNet

torch.set_num_threads(1)

ITEM_IDS = [10, 11, 12, 13, 14, 15]
TABLE = pd.DataFrame({
    "ItemId": [10, 11, 12, 13, 14, 15, 99],
    "cat": ["a", "b", "a", "c", "b", "c", "b"],
    "tags": ["x|y", "y", "z", "x|z|y", "y", "x", "z|x"],
    "price": [1.0, 2.5, 0.5, 4.0, 3.0, 1.5, 2.0],
})


def save_model(path: Path, *, attributes: bool = True) -> GRU4Rec:
    """A saved model whose every table holds distinct random numbers (item 99 cold)."""
    item_map = ItemMap.from_ids(pd.Series(ITEM_IDS))
    attrs = ItemAttributes.build(item_table_from_frame(TABLE, types={"tags": "multi"}), item_map) if attributes else None
    config = Config(layers=(6,), constrained_embedding=True)
    model = GRU4Rec(config, device="cpu", threads=1)
    net = GRU4RecNet(len(ITEM_IDS), config, generator=torch.Generator().manual_seed(5), attributes=attrs)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    model.net = net.eval()
    model.item_map = item_map
    model.item_support = np.array([5, 3, 8, 1, 4, 2], dtype=np.int64)
    model.save(path)
    return GRU4Rec.load(path, device="cpu")


def last_output(model: GRU4Rec) -> torch.Tensor:
    """The GRU output after two steps of three sessions (the same inputs for every model here)."""
    with torch.no_grad():
        state = model.init_state(3)
        model.step(torch.tensor([0, 4, 5]), state)
        return model.step(torch.tensor([2, 2, 1]), state).clone()


def write_table(path: Path, rows: dict[str, list[object]]) -> Path:
    pd.DataFrame(rows).to_csv(path, sep="\t", index=False)
    return path


def test_items_add_scores_a_new_item_from_its_attributes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Item 500 has item 13's attributes, so its row is 13's composed row minus 13's id row
    (bias 0); 501 has 11's. Item 12 is known: skipped with a counted warning. Every old score
    is unchanged bit for bit."""
    old = save_model(tmp_path / "m.gru4rec")
    new_items = write_table(tmp_path / "new.tsv", {"ItemId": [500, 12, 501], "cat": ["c", "a", "b"],
                                                   "tags": ["x|z|y", "z", "y"], "price": [4.0, 0.5, 2.5]})
    with caplog.at_level(logging.WARNING):
        code = main(["items", "add", str(tmp_path / "m.gru4rec"), str(new_items), "-o", str(tmp_path / "m2.gru4rec")])
    assert code == 0
    assert "1 item id(s) the model already has skipped" in caplog.text
    new = GRU4Rec.load(tmp_path / "m2.gru4rec", device="cpu")
    assert new.catalogue is not None and old.catalogue is not None
    assert new.catalogue.to_list() == [*ITEM_IDS, 99, 500, 501]
    out_old, out_new = last_output(old), last_output(new)
    assert torch.equal(out_old, out_new)
    with torch.no_grad():
        s_old, s_new = old.scores(out_old), new.scores(out_new)
        net = old.net
        assert net is not None and net.attributes is not None
        composed = net.attributes.compose_all(net.Wy)
    assert torch.equal(s_new[:, :7], s_old)
    for new_col, twin in ((7, 3), (8, 1)):  # 500 ~ item 13 (index 3), 501 ~ item 11 (index 1)
        by_hand = out_old @ (composed[twin] - net.Wy[twin])
        torch.testing.assert_close(s_new[:, new_col], by_hand, rtol=1e-5, atol=1e-6)


def test_items_add_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_model(tmp_path / "plain.gru4rec", attributes=False)
    save_model(tmp_path / "m.gru4rec")
    good = write_table(tmp_path / "new.tsv", {"ItemId": [500], "cat": ["c"], "tags": ["x"], "price": [1.0]})
    no_price = write_table(tmp_path / "bad.tsv", {"ItemId": [500], "cat": ["c"], "tags": ["x"]})
    known = write_table(tmp_path / "known.tsv", {"ItemId": [12], "cat": ["c"], "tags": ["x"], "price": [1.0]})
    out = str(tmp_path / "m2.gru4rec")

    assert main(["items", "add", str(tmp_path / "plain.gru4rec"), str(good), "-o", out]) == 1
    assert "this model has no item attributes: train it with --item-features" in capsys.readouterr().err
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(no_price), "-o", out]) == 1
    assert "missing the model's attribute column(s) ['price']" in capsys.readouterr().err
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(known), "-o", out]) == 1
    assert "nothing to add" in capsys.readouterr().err
    assert not Path(out).exists()
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(good), "-o", out]) == 0
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(good), "-o", out]) == 2  # exists, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(good), "-o", out, "--force"]) == 0
