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
from gru4rec.errors import DataError, Gru4RecError, ModelFileError
from gru4rec.formats import checkpoint
from gru4rec.formats.model_file import EXTENSION_DEFAULTS, read_model
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
        composed = rows.compose_all(net.Wy, net.By)[0]
        return out, model.scores(out).clone(), composed.clone()


@pytest.mark.parametrize("mode", ["shared", "separate", "none"])
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
    # the cold items stay recommendable: the loaded catalogue is the saved one, ranked alike
    assert loaded.catalogue is not None and model.catalogue is not None
    assert loaded.catalogue.to_list() == model.catalogue.to_list() == ITEM_IDS + [99, 98]
    every, every_loaded = model.recommend([12], k=10), loaded.recommend([12], k=10)
    assert {99, 98} <= set(every_loaded.item_ids.tolist())
    assert list(every_loaded.item_ids) == list(every.item_ids) and np.array_equal(every_loaded.scores, every.scores)
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
    # separate mode: E, and the input rows' own attribute tables and projection (not their buffers)
    model = model_with_attributes("separate")
    model.save(tmp_path / "s.safetensors")
    tensors = checkpoint.load_file(tmp_path / "s.safetensors")[0]
    assert {name for name in tensors if name.startswith("input_attributes.")} == {
        "input_attributes.tables.0", "input_attributes.tables.1", "input_attributes.projection"}
    assert tensors["input_attributes.tables.0"].shape == (4, 4)  # codes × E's width: no bias column


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_a_plain_model_file_is_unchanged(mode: str, tmp_path: Path) -> None:
    """The tensor names and metadata keys a plain model wrote before attributes could be saved."""
    model = model_with_attributes(mode, attributes=False)
    model.save(tmp_path / "m.safetensors")
    tensors, meta = checkpoint.load_file(tmp_path / "m.safetensors")
    want = {"Wy", "By", "layers.0.Wx", "layers.0.Wh", "layers.0.Wrz", "layers.0.Bh", "item_support"}
    assert set(tensors) == (want | {"E"} if mode == "separate" else want)
    assert set(meta) == {"kind", "config", "item_ids", "epochs_trained"}
    # its config names only the parameters a release before attributes and click context knew
    assert set(meta["config"]) == set(Config.field_names()) - set(EXTENSION_DEFAULTS)
    parts = read_model(tmp_path / "m.safetensors")
    assert parts.net.attributes is None and parts.config == model.config
    # a model that uses them names them (and reads back equal)
    used = model.config.replace(click_context=True, dropout_p_id=0.25)
    model.config, model.net = used, GRU4RecNet(len(ITEM_IDS), used)
    model.save(tmp_path / "c.safetensors")
    assert checkpoint.read_meta(tmp_path / "c.safetensors")["config"]["click_context"] is True
    assert read_model(tmp_path / "c.safetensors").config == used


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


def test_a_warm_start_from_a_model_with_attributes_needs_todays_table() -> None:
    """Carrying the id rows alone would change every item's row silently."""
    model = model_with_attributes("shared")
    assert model.net is not None
    with pytest.raises(Gru4RecError, match="init_from: the model was trained with item attributes; .* needs item_features"):
        warm_net(model.net, len(ITEM_IDS) + 1, model.config)


# ------------------------------------------------------------------ warm start: the pieces


TODAY = pd.DataFrame({  # the trained items' rows as yesterday; 18 is new, with a new category 'e' and tag 'q'
    "ItemId": [10, 11, 12, 13, 15, 16, 17, 18, 97],
    "cat": ["a", "b", "a", "c", "b", "c", "a", "e", "e"],
    "tags": ["x|y", "y", "z", "x|z|y", "y", "x", "z|x", "q|x", "q"],
    "price": [1.0, 2.5, 0.5, 4.0, 3.0, 1.5, 2.0, 6.0, 1.0],
})


def todays_attributes(old: GRU4Rec) -> tuple[ItemAttributes, ItemMap]:
    assert old.net is not None and old.net.attributes is not None
    grown = ItemMap.from_list(ITEM_IDS + [18])
    table = item_table_from_frame(TODAY, types={"tags": "multi"})
    return old.net.attributes.source.warm_start(table, grown), grown


def test_the_vocabulary_grows_and_old_codes_keep_their_values() -> None:
    old = model_with_attributes("shared")
    assert old.net is not None and old.net.attributes is not None
    before = old.net.attributes.source.encoding
    attrs, grown = todays_attributes(old)
    cat, tags = attrs.encoding.categorical
    assert cat.vocabulary.tolist() == ["a", "b", "c", "e"]  # 'e' on training item 18: the next code
    assert tags.vocabulary.tolist() == before.categorical[1].vocabulary.tolist() + ["q"]
    assert attrs.encoding.numeric == before.numeric  # the projection reads yesterday's standardisation
    assert attrs.n_warm == len(grown) == 9 and attrs.item_map.to_list()[9:] == [97]  # 99, 98 gone from the table
    # item 18: category 'e' = code 4, tags q|x = codes of q and x; 14 still has no row
    i18 = grown.to_list().index(18)
    assert attrs.codes[0][i18] == 4
    assert sorted(attrs.codes[1][attrs.offsets[1][i18]:attrs.offsets[1][i18 + 1]].tolist()) == sorted(
        [tags.vocabulary.get_loc("q") + 1, tags.vocabulary.get_loc("x") + 1])
    assert not attrs.has_row[ITEM_IDS.index(14)]


@pytest.mark.parametrize("mode", ["shared", "separate", "none"])
def test_warm_net_keeps_trained_rows_and_draws_new_ones_as_a_fresh_network(mode: str) -> None:
    old = model_with_attributes(mode)
    assert old.net is not None and old.net.attributes is not None
    attrs, grown = todays_attributes(old)
    net = warm_net(old.net, len(grown), old.config, generator=torch.Generator().manual_seed(7), attributes=attrs)
    fresh = GRU4RecNet(len(grown), old.config, generator=torch.Generator().manual_seed(7), attributes=attrs)
    n = len(ITEM_IDS)
    assert torch.equal(net.Wy[:n], old.net.Wy) and torch.equal(net.Wy[n:], fresh.Wy[n:])
    assert torch.equal(net.input_table[:n], old.net.input_table)
    compositions = old.net.compositions()
    assert list(compositions) == (["attributes"] if mode == "shared" else ["attributes", "input_attributes"])
    for name, rows in compositions.items():
        ours, new = getattr(net, name), getattr(fresh, name)
        for c, table in enumerate(rows.tables):
            k = table.shape[0]
            assert torch.equal(ours.tables[c][:k], table)  # old codes keep their rows
            assert torch.equal(ours.tables[c][k:], new.tables[c][k:])  # new values: fresh rows
            assert ours.tables[c].shape[0] > k
        assert rows.projection is not None and torch.equal(ours.projection, rows.projection)
    # the trained items, whose attributes did not change, keep their composed rows bit for bit
    with torch.no_grad():
        assert torch.equal(net.scored_rows(torch.arange(n))[0], old.net.scored_rows(torch.arange(n))[0])
        assert torch.equal(net.input_rows(torch.arange(n)), old.net.input_rows(torch.arange(n)))


def test_warm_net_refuses_mismatched_attributes() -> None:
    old = model_with_attributes("shared")
    plain = model_with_attributes("shared", attributes=False)
    assert old.net is not None and plain.net is not None
    attrs, grown = todays_attributes(old)
    with pytest.raises(Gru4RecError, match="item_features: the init_from model was trained without item attributes"):
        warm_net(plain.net, len(grown), plain.config, attributes=attrs)
    other = ItemAttributes.build(item_table_from_frame(TODAY[["ItemId", "cat"]]), grown)
    with pytest.raises(Gru4RecError, match="item_features: the attribute columns differ"):
        warm_net(old.net, len(grown), old.config, attributes=other)
    assert old.net.attributes is not None
    source = old.net.attributes.source
    with pytest.raises(DataError, match="missing attribute column 'price'"):
        source.warm_start(item_table_from_frame(TODAY.drop(columns="price"), types={"tags": "multi"}), grown)
    with pytest.raises(DataError, match="must start with the model's 8 training items"):
        source.warm_start(item_table_from_frame(TODAY, types={"tags": "multi"}), ItemMap.from_list([18] + ITEM_IDS))


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_the_optimiser_state_of_attribute_tables_is_carried_at_the_old_codes(mode: str) -> None:
    from gru4rec.training.trainer import Trainer
    from gru4rec.training.warm_start import carry_optimizer_state

    old = model_with_attributes(mode)
    assert old.net is not None
    config = old.config.replace(adapt="adagrad")
    before = Trainer(old.net, config, old.item_support).optimizer.state_dict()
    saved = {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(len(k))) if v.dim() else v.clone()
             for k, v in before.items()}
    attrs, grown = todays_attributes(old)
    net = warm_net(old.net, len(grown), config, attributes=attrs)
    optimizer = Trainer(net, config, np.ones(len(grown), dtype=np.int64)).optimizer
    assert carry_optimizer_state(optimizer, saved, config, len(ITEM_IDS), "yesterday")
    state = optimizer.state_dict()
    assert {"attributes.cat0.acc", "attributes.cat1.acc"} <= set(saved)  # the attribute tables' rows are there
    if mode == "separate":
        assert {"input_attributes.cat0.acc", "input_attributes.cat1.acc"} <= set(saved)
    for key, value in saved.items():
        if key.startswith(("attributes.cat", "input_attributes.cat")):
            assert torch.equal(state[key][: value.shape[0]], value) and not state[key][value.shape[0]:].any()
        elif key.rsplit(".", 1)[0] in ("Wy", "By", "E"):
            assert torch.equal(state[key][: len(ITEM_IDS)], value) and not state[key][len(ITEM_IDS):].any()
        else:
            assert torch.equal(state[key], value)


# ------------------------------------------------------------------ training checkpoints


def test_a_checkpoint_restores_the_attribute_tables_and_checks_the_attributes(tmp_path: Path) -> None:
    """The checkpoint's side of resuming a run with attributes (fit refuses checkpoint_dir with
    item_features until it is wired): the restored network is the written one, bit for bit, and
    a run with other attributes, or none, is refused before any tensor is loaded."""
    from gru4rec.training.resume import EpochPosition, TrainingCheckpoint
    from gru4rec.training.trainer import Trainer

    written = model_with_attributes("shared")
    assert written.net is not None
    config = written.config.replace(adapt="adagrad")
    fingerprint = {"n_items": len(ITEM_IDS), "n_events": 10, "n_sessions": 3}
    ckpt = TrainingCheckpoint(tmp_path / "ck")
    ckpt.attach(Trainer(written.net, config, written.item_support), config, fingerprint)
    ckpt.write(EpochPosition(2, 0, 0, 0.0, None, {}))
    assert "item_attributes" in checkpoint.read_meta(ckpt.path)

    attrs = written.net.attributes.source if written.net.attributes is not None else None
    fresh = GRU4RecNet(len(ITEM_IDS), config, generator=torch.Generator().manual_seed(99), attributes=attrs)
    TrainingCheckpoint(tmp_path / "ck", resume=True).attach(Trainer(fresh, config, written.item_support), config, fingerprint)
    want = written.net.state_dict()
    got = fresh.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    other = ItemAttributes.build(item_table_from_frame(TODAY, types={"tags": "multi"}), ItemMap.from_ids(pd.Series(ITEM_IDS)))
    for net, match in [(GRU4RecNet(len(ITEM_IDS), config, attributes=other), "with item attributes and this run is with other"),
                       (GRU4RecNet(len(ITEM_IDS), config), "with item attributes and this run is without")]:
        with pytest.raises(ModelFileError, match=match):
            TrainingCheckpoint(tmp_path / "ck", resume=True).attach(Trainer(net, config, written.item_support), config,
                                                                    fingerprint)
