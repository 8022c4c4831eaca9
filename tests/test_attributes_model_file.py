"""Model files of models with item attributes (issue 49): ``save`` writes the attribute tables,
the projection and the encoding, ``load`` gives a model that scores bit for bit as before; a
plain model's file is what it was; an older reader refuses such a file instead of misreading it;
a damaged attribute part is one ModelFileError; a warm start from such a model is refused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.errors import Gru4RecError, ModelFileError
from gru4rec.formats import checkpoint
from gru4rec.formats.model_file import read_model
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.warm_start import warm_net

torch.set_num_threads(1)

ITEM_IDS = [10, 11, 12, 13, 14, 15, 16, 17]
# Item 14 has no row (unknown values), 99 and 98 are cold items (in the table, in no event).
TABLE = pd.DataFrame({
    "ItemId": [10, 11, 12, 13, 15, 16, 17, 99, 98],
    "cat": ["a", "b", "a", "c", "b", "c", "a", "b", "d"],
    "tags": ["x|y", "y", "z", "x|z|y", "y", "x", "z|x", "y", "w|x"],
    "price": [1.0, 2.5, 0.5, 4.0, 3.0, 1.5, 2.0, 9.0, 0.25],
})


def model_with_attributes(mode: str, *, attributes: bool = True) -> GRU4Rec:
    """A model whose every table (id rows, attribute tables, projection, biases) holds distinct
    random numbers: a part the file lost or swapped would change the scores."""
    item_map = ItemMap.from_ids(pd.Series(ITEM_IDS))
    attrs = ItemAttributes.build(item_table_from_frame(TABLE, types={"tags": "multi"}), item_map) if attributes else None
    kw: dict[str, object] = dict(layers=(6,), constrained_embedding=mode == "shared")
    if mode == "separate":
        kw["embedding"] = 4
    config = Config(**kw)
    model = GRU4Rec(config, device="cpu", threads=1)
    net = GRU4RecNet(len(ITEM_IDS), config, generator=torch.Generator().manual_seed(5), attributes=attrs)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in net.parameters():  # biases too (zero after the draw)
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    model.net = net.eval()
    model.item_map = item_map
    model.item_support = np.array([5, 3, 8, 1, 4, 2, 6, 7], dtype=np.int64)
    model.epochs_trained = 2
    return model


def outputs(model: GRU4Rec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The last GRU outputs after two steps, every item's score after them, every composed row."""
    net = model.net
    assert net is not None
    with torch.no_grad():
        state = model.init_state(3)
        model.step(torch.tensor([0, 4, 7]), state)
        out = model.step(torch.tensor([2, 2, 5]), state).clone()
        rows = net.attributes
        assert rows is not None
        composed = rows.compose_all(net.Wy)
        return out, model.scores(out).clone(), composed.clone()


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_save_load_scores_bit_for_bit(mode: str, tmp_path: Path) -> None:
    model = model_with_attributes(mode)
    before = outputs(model)
    recs = [model.recommend(s, k=5) for s in ([10, 11], [14], [17, 13, 12])]
    model.save(tmp_path / "m.safetensors")
    loaded = GRU4Rec.load(tmp_path / "m.safetensors", device="cpu")
    after = outputs(loaded)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)  # bit for bit: GRU outputs, scores, every composed row (cold items too)
    for s, want in zip(([10, 11], [14], [17, 13, 12]), recs, strict=True):
        got = loaded.recommend(s, k=5)
        assert list(got.item_ids) == list(want.item_ids)
        assert np.array_equal(got.scores, want.scores)
    # the encoding travels whole: vocabularies, kinds, statistics, cold ids, codes
    assert model.net is not None and loaded.net is not None
    assert model.net.attributes is not None and loaded.net.attributes is not None
    src, back = model.net.attributes.source, loaded.net.attributes.source
    assert back.encoding.to_json() == src.encoding.to_json()
    assert back.item_map.to_list() == src.item_map.to_list() == ITEM_IDS + [99, 98]
    assert back.n_warm == src.n_warm == len(ITEM_IDS)
    for a, b in zip(src.codes + src.offsets, back.codes + back.offsets, strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(src.numeric, back.numeric) and np.array_equal(src.has_row, back.has_row)
    # ... so tomorrow's items are encoded as the saved model would encode them
    new = item_table_from_frame(pd.DataFrame({"ItemId": [50, 51], "cat": ["c", "zz"], "tags": ["y|q", "x"],
                                              "price": [2.0, 7.0]}), types={"tags": "multi"})
    grown_src, grown_back = src.add_items(new), back.add_items(new)
    assert all(np.array_equal(a, b) for a, b in zip(grown_src.codes, grown_back.codes, strict=True))
    assert np.array_equal(grown_src.numeric, grown_back.numeric)
    assert loaded.epochs_trained == 2 and np.array_equal(loaded.item_support, model.item_support)
    # saving the loaded model writes the same tensors and metadata
    loaded.save(tmp_path / "again.safetensors")
    t1, m1 = checkpoint.load_file(tmp_path / "m.safetensors")
    t2, m2 = checkpoint.load_file(tmp_path / "again.safetensors")
    assert m1 == m2 and sorted(t1) == sorted(t2) and all(torch.equal(t1[k], t2[k]) for k in t1)


def test_the_file_names_the_attribute_parts(tmp_path: Path) -> None:
    """What the file holds beyond a plain model's: the parameters, the encoded attributes, one
    metadata entry; the composition's buffers are not written twice."""
    model = model_with_attributes("shared")
    model.save(tmp_path / "m.safetensors")
    tensors, meta = checkpoint.load_file(tmp_path / "m.safetensors")
    plain = {"Wy", "By", "layers.0.Wx", "layers.0.Wh", "layers.0.Wrz", "layers.0.Bh", "item_support"}
    assert set(tensors) - plain == {
        "attributes.tables.0", "attributes.tables.1", "attributes.projection",
        "item_attributes.cat0.codes", "item_attributes.cat1.codes", "item_attributes.cat1.offsets",
        "item_attributes.numeric", "item_attributes.has_row"}
    assert set(meta) == {"kind", "config", "item_ids", "epochs_trained", "item_attributes"}
    assert meta["item_attributes"]["cold_item_ids"] == [99, 98]
    assert meta["item_attributes"]["encoding"]["categorical"][0]["vocabulary"] == ["a", "b", "c"]  # 'd': cold only


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_a_plain_model_file_is_unchanged(mode: str, tmp_path: Path) -> None:
    """The tensor names and metadata keys a plain model wrote before attributes could be saved."""
    model = model_with_attributes(mode, attributes=False)
    model.save(tmp_path / "m.safetensors")
    tensors, meta = checkpoint.load_file(tmp_path / "m.safetensors")
    want = {"Wy", "By", "layers.0.Wx", "layers.0.Wh", "layers.0.Wrz", "layers.0.Bh", "item_support"}
    assert set(tensors) == (want | {"E"} if mode == "separate" else want)
    assert set(meta) == {"kind", "config", "item_ids", "epochs_trained"}
    assert read_model(tmp_path / "m.safetensors").net.attributes is None


def test_an_older_reader_refuses_a_file_with_attributes(tmp_path: Path) -> None:
    """A reader without the extension builds a plain network and loads the tensors strictly, as
    read_model did before: the attribute tensors are unexpected keys, not silently dropped."""
    model = model_with_attributes("shared")
    model.save(tmp_path / "m.safetensors")
    tensors, meta = checkpoint.load_file(tmp_path / "m.safetensors")
    tensors.pop("item_support")
    old = GRU4RecNet(len(meta["item_ids"]), Config.from_dict(meta["config"]))
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*attributes\.tables\.0"):
        old.load_state_dict(tensors)


@pytest.mark.parametrize("damage", ["tensor", "meta", "vocabulary"])
def test_a_damaged_attribute_part_is_one_model_file_error(damage: str, tmp_path: Path) -> None:
    """A file written consistently (valid checksums) whose attribute parts do not fit together."""
    model_with_attributes("shared").save(tmp_path / "m.safetensors")
    tensors, meta = checkpoint.load_file(tmp_path / "m.safetensors")
    if damage == "tensor":
        del tensors["item_attributes.numeric"]
        match = "item_attributes.numeric"
    elif damage == "meta":
        del meta["item_attributes"]["n_warm"]
        match = "n_warm"
    else:  # one value fewer than the saved table has rows
        meta["item_attributes"]["encoding"]["categorical"][0]["vocabulary"].pop()
        match = "attributes.tables.0"
    checkpoint.save_file(tmp_path / "bad.safetensors", tensors, meta)
    with pytest.raises(ModelFileError, match=f"(?s)does not hold a consistent gru4rec model.*{match}"):
        GRU4Rec.load(tmp_path / "bad.safetensors", device="cpu")


def test_a_warm_start_from_a_model_with_attributes_is_refused() -> None:
    """Not built yet: carrying the id rows alone would change every item's row silently."""
    model = model_with_attributes("shared")
    assert model.net is not None
    with pytest.raises(Gru4RecError, match="init_from: the model was trained with item attributes"):
        warm_net(model.net, len(ITEM_IDS) + 1, model.config)
