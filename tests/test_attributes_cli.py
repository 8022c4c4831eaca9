"""The command line of item attributes (issue 49): ``gru4rec items add MODEL NEW_ITEMS -o MODEL2``."""
from __future__ import annotations

import io
import json
import logging
import sys
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


def save_model(path: Path, *, attributes: bool = True, mode: str = "shared", table: pd.DataFrame = TABLE) -> GRU4Rec:
    """A saved model whose every table holds distinct random numbers (item 99 cold), in the
    embedding ``mode`` (shared, or none: one-hot input rows), with the attributes of ``table``."""
    item_map = ItemMap.from_ids(pd.Series(ITEM_IDS))
    types = {"tags": "multi", "cat": "categorical"}
    attrs = ItemAttributes.build(item_table_from_frame(table, types=types), item_map) if attributes else None
    config = Config(layers=(6,), constrained_embedding=mode == "shared")
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


@pytest.mark.parametrize("mode", ["shared", "none"])
def test_items_add_scores_a_new_item_from_its_attributes(mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Item 500 has item 13's attributes, so its row is 13's composed row minus 13's id row
    (bias 0), and so is its input row (one-hot mode: the input rows' own composition); 501 has
    11's. Item 12 is known: skipped with a counted warning. Every old score is unchanged bit for bit."""
    old = save_model(tmp_path / "m.gru4rec", mode=mode)
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
        composed, bias = net.attributes.compose_all(net.Wy, net.By)
    assert torch.equal(s_new[:, :7], s_old)
    for new_col, twin in ((7, 3), (8, 1)):  # 500 ~ item 13 (index 3), 501 ~ item 11 (index 1)
        by_hand = out_old @ (composed[twin] - net.Wy[twin]) + (bias[twin] - net.By[twin] + net.By.mean())  # the mean id bias
        torch.testing.assert_close(s_new[:, new_col], by_hand, rtol=1e-5, atol=1e-6)
        assert new.net is not None
        with torch.no_grad():  # clicked, it feeds layer 0 its twin's input row less the twin's id row
            want = net.input_rows(torch.tensor([twin]))[0] - net.input_table[twin]
            torch.testing.assert_close(new.net.input_rows(torch.tensor([new_col]))[0], want, rtol=1e-5, atol=1e-6)


def test_items_add_reads_codes_as_the_model_and_says_what_it_cannot_encode(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, recwarn: pytest.WarningsRecorder) -> None:
    """A model whose category codes are integers, and new items whose category column reads as
    text because one value is not a number: "28" is the model's 28 (not silently unknown),
    "shoes" is unknown and said so (the column, how many items, the value), a column the model
    has not is said to be ignored, and a small table's cardinality is no warning."""
    codes = TABLE.assign(cat=TABLE["cat"].map({"a": 28, "b": 5, "c": 7}))
    old = save_model(tmp_path / "m.gru4rec", table=codes)
    assert old.net is not None and old.net.attributes is not None
    vocabulary = old.net.attributes.source.encoding.categorical[0].vocabulary
    assert sorted(vocabulary.tolist()) == [5, 7, 28]
    new_items = write_table(tmp_path / "new.tsv", {"ItemId": [700, 701, 702], "cat": ["28", "shoes", "7"],
                                                   "tags": ["x", "y", "z"], "price": [1.0, 2.0, 3.0],
                                                   "color": ["red", "blue", "green"]})
    with caplog.at_level(logging.WARNING):
        assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(new_items), "-o", str(tmp_path / "m2.gru4rec")]) == 0
    new = GRU4Rec.load(tmp_path / "m2.gru4rec", device="cpu")
    assert new.net is not None and new.net.attributes is not None
    got = new.net.attributes.cat0_codes[-3:].tolist()
    assert got == [vocabulary.get_loc(28) + 1, 0, vocabulary.get_loc(7) + 1]
    assert "column 'cat': 1 new item(s) list a value the model does not know (e.g. 'shoes')" in caplog.text
    assert "column(s) ['color'] ignored: the model has no such attribute" in caplog.text
    assert not [w for w in recwarn if "distinct" in str(w.message)]  # no cardinality or integer-code warning


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
    assert "missing the required attribute column(s) ['price']" in capsys.readouterr().err
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(known), "-o", out]) == 1
    assert "nothing to add" in capsys.readouterr().err
    assert not Path(out).exists()
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(good), "-o", out]) == 0
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(good), "-o", out]) == 2  # exists, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["items", "add", str(tmp_path / "m.gru4rec"), str(good), "-o", out, "--force"]) == 0


# ------------------------------------------------------------- train/run.py --item-features, evaluate

TINY = "layers=16,n_epochs=2,batch_size=16,n_sample=0,loss=cross-entropy,constrained_embedding=True"


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    assert main(["synth", str(out), "--kind", "intents-attributes", "--n-sessions", "300", "--seed", "1", "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def trained(synth: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("trained")
    buf = io.StringIO()
    capture = pytest.MonkeyPatch()
    capture.setattr(sys, "stdout", buf)
    try:
        code = main(["train", str(synth / "train_full.tsv"), "-ps", TINY, "--seed", "3", "-d", "cpu",
                     "--item-features", str(synth / "items.tsv"), "-t", str(synth / "test.tsv"), "-m", "5", "20",
                     "--save", str(out / "m.gru4rec"), "--metrics-json", str(out / "m.json")])
    finally:
        capture.undo()
    assert code == 0
    return {"model": out / "m.gru4rec", "metrics": out / "m.json", "stdout": buf.getvalue()}


def group_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("all (n=", "warm (n=", "cold (n="))]


def test_train_with_item_features_prints_and_writes_all_warm_cold(trained: dict[str, object]) -> None:
    """The all line repeats the plain Recall/MRR lines; warm and cold partition the targets and
    their figures average to the all figures by their counts (an independent check of the split)."""
    lines = group_lines(str(trained["stdout"]))
    assert [line.split(" ")[0] for line in lines] == ["all", "warm", "cold"]
    report = json.loads(Path(str(trained["metrics"])).read_text())
    (entry,) = report.values()
    groups = entry["targets"]
    assert entry["n_cold_items"] > 0
    assert groups["warm"]["n_predictions"] + groups["cold"]["n_predictions"] == groups["all"]["n_predictions"] \
        == entry["n_predictions"]
    assert groups["cold"]["n_predictions"] > 0
    n = {g: groups[g]["n_predictions"] for g in ("warm", "cold")}
    for metric in ("recall", "mrr"):
        for c in ("5", "20"):
            assert groups["all"][metric][c] == pytest.approx(entry[metric][c])
            mix = (groups["warm"][metric][c] * n["warm"] + groups["cold"][metric][c] * n["cold"]) / sum(n.values())
            assert mix == pytest.approx(groups["all"][metric][c])
    plain = [line for line in str(trained["stdout"]).splitlines() if line.startswith("Recall@20")]
    assert plain[0].split(" ")[:4] == lines[0].split(" ")[6:10]  # Recall@20: x MRR@20: y


def test_evaluate_prints_the_same_group_lines(trained: dict[str, object], synth: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(trained["model"]), "-t", str(synth / "test.tsv"), "-m", "5", "20", "-d", "cpu"]) == 0
    lines = group_lines(capsys.readouterr().out)
    assert len(lines) == 3 and lines == group_lines(str(trained["stdout"]))


def test_a_plain_evaluation_prints_no_group_lines(synth: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(synth / "train_full.tsv"), "-ps", TINY, "-d", "cpu", "-t", str(synth / "test.tsv")]) == 0
    assert group_lines(capsys.readouterr().out) == []


def test_run_py_takes_item_features(synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.cli import run_py_main

    assert run_py_main([str(synth / "train_full.tsv"), "-ps", TINY, "-d", "cpu", "-t", str(synth / "test.tsv"),
                        "--item-features", str(synth / "items.tsv")]) == 0
    assert [line.split(" ")[0] for line in group_lines(capsys.readouterr().out)] == ["all", "warm", "cold"]


def test_a_bad_item_table_fails_before_the_first_epoch(synth: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    table = pd.read_csv(synth / "items.tsv", sep="\t")
    bad = tmp_path / "dup.tsv"
    pd.concat([table, table.iloc[:1]]).to_csv(bad, sep="\t", index=False)
    model = tmp_path / "m.gru4rec"
    args = ["train", str(synth / "train_full.tsv"), "-ps", TINY, "-d", "cpu", "--save", str(model)]
    assert main([*args, "--item-features", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "duplicate item id" in captured.err and str(bad) in captured.err
    assert "Epoch1" not in captured.out + captured.err and not model.exists()
    assert main([*args, "--item-features", str(synth / "items.tsv"), "--item-types", "price=number"]) == 2
    assert "--item-types: 'price=number'" in capsys.readouterr().err
    assert main([*args, "--item-min-count", "3"]) == 2
    assert "--item-min-count needs --item-features" in capsys.readouterr().err
    from gru4rec.cli import run_py_main

    assert run_py_main([str(model), "-l", "--item-features", str(synth / "items.tsv")]) == 2
    assert "--item-features trains a model; it does not go with -l" in capsys.readouterr().err


def test_items_add_on_a_trained_model(trained: dict[str, object], synth: Path, tmp_path: Path) -> None:
    """A new item with an existing cold item's attributes joins the catalogue and scores as
    that item (a cold item's row is its attributes' alone, bias 0): the same score column."""
    source = GRU4Rec.load(Path(str(trained["model"])), device="cpu")
    assert source.catalogue is not None and source.item_map is not None
    twin_id = source.catalogue.ids[len(source.item_map)]  # the first cold item
    table = pd.read_csv(synth / "items.tsv", sep="\t")
    row = table[table["ItemId"] == twin_id].copy()
    row["ItemId"] = 1
    row.to_csv(tmp_path / "new.tsv", sep="\t", index=False)
    assert main(["items", "add", str(trained["model"]), str(tmp_path / "new.tsv"), "-o", str(tmp_path / "m2.gru4rec")]) == 0
    new = GRU4Rec.load(tmp_path / "m2.gru4rec", device="cpu")
    assert new.catalogue is not None
    assert new.catalogue.ids[-1] == 1 and len(new.catalogue) == len(source.catalogue) + 1
    with torch.no_grad():
        state = new.init_state(2)
        out = new.step(torch.tensor([0, 5]), state)
        scores = new.scores(out)
    twin = int(source.catalogue.index_of(pd.Index([twin_id]))[0])
    assert torch.equal(scores[:, -1], scores[:, twin])


def test_info_describes_the_attributes(trained: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    """Columns, kinds and vocabulary sizes as the model holds them (its encoding), cold items counted."""
    model = GRU4Rec.load(Path(str(trained["model"])), device="cpu")
    assert model.net is not None and model.net.attributes is not None
    encoding = model.net.attributes.source.encoding
    assert main(["info", str(trained["model"]), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["item_attributes"]
    assert summary["cold_items"] == model.net.attributes.source.n_cold > 0
    assert {name: c.get("codes") for name, c in summary["columns"].items()} == {
        **{e.name: e.n_codes for e in encoding.categorical}, **{e.name: None for e in encoding.numeric}}
    assert main(["info", str(trained["model"])]) == 0
    assert f"{model.net.attributes.source.n_cold:,} cold items" in capsys.readouterr().out
