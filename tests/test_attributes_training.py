"""Training with item attributes (issue 49, the model side's first slice): GRU4RecNet's composed
Wy rows, the backend's choice of the reference step, its gradients of the id rows, the attribute
tables and the projection, ``fit(item_features=...)`` and the bit-identity of plain GRU4Rec.

The step is checked against an independent statement of the same step: the loss written out by
hand over the composition differentiated end to end by autograd (every table a leaf), then the
SGD rule p ← p − lr·g (which the lazy row updates equal where a row's gradient is zero)."""
from __future__ import annotations

import copy
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.errors import Gru4RecError, ModelFileError
from gru4rec.items import ItemAttributes, item_table_from_frame, read_item_table
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training import backend as backend_module
from gru4rec.training.trainer import Trainer

torch.set_num_threads(1)

B = 4
ITEM_IDS = [10, 11, 12, 13, 14, 15, 16, 17]
SUPPORT = np.array([5, 3, 8, 1, 4, 2, 6, 7], dtype=np.int64)
# Item 14 has no row (unknown values), 99 is a cold item (in the table, in no event).
TABLE = pd.DataFrame({
    "ItemId": [10, 11, 12, 13, 15, 16, 17, 99],
    "cat": ["a", "b", "a", "c", "b", "c", "a", "b"],
    "tags": ["x|y", "y", "z", "x|z|y", "y", "x", "z|x", "y"],
    "price": [1.0, 2.5, 0.5, 4.0, 3.0, 1.5, 2.0, 9.0],
})


def attributes(table: pd.DataFrame = TABLE) -> ItemAttributes:
    types = {"tags": "multi"} if "tags" in table else None
    return ItemAttributes.build(item_table_from_frame(table, types=types), ItemMap.from_ids(pd.Series(ITEM_IDS)))


def config(**kw: object) -> Config:
    base: dict[str, object] = dict(layers=(5,), batch_size=B, n_sample=0, constrained_embedding=True, loss="xe_logit",
                                   adapt="sgd", learning_rate=0.1, momentum=0.0, dropout_p_embed=0.0, dropout_p_hidden=0.0)
    base.update(kw)
    return Config(**base)


def steps() -> list[dict[str, torch.Tensor]]:
    """Two steps; item 2 is an input twice and a target, so rows and codes repeat."""
    rows = [([2, 2, 5, 0], [1, 2, 4, 7]), ([1, 2, 4, 7], [3, 6, 0, 5])]
    return [dict(inputs=torch.tensor(i), targets=torch.tensor(t), active=torch.ones(B, dtype=torch.float64),
                 keep=torch.ones(B, 1, dtype=torch.float64)) for i, t in rows]


# ------------------------------------------------------------------ the network


def test_composed_row_is_id_row_plus_attribute_rows_by_hand() -> None:
    """net.scored_rows(i) = [Wy[i] | By[i]] + T_cat[code] + mean(T_tags[codes]) + price_std·P over
    the row's columns and the bias column, from the encoding's own codes and statistics, item by
    item; score_all reads those rows and biases."""
    attrs = attributes()
    net = GRU4RecNet(len(ITEM_IDS), config(), generator=torch.Generator().manual_seed(3), attributes=attrs)
    rows = net.attributes
    assert rows is not None and rows.names == ["cat", "tags"] and rows.columns == 6
    assert rows.projection is not None
    cat, tags = attrs.encoding.categorical
    num = attrs.encoding.numeric[0]
    frame = TABLE.set_index("ItemId")
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # biases start at 0: give them values, so that a lost part shows
        net.By.uniform_(-1, 1, generator=gen)
        for block in (*rows.tables, rows.projection):
            block[:, 5].uniform_(-1, 1, generator=gen)
        got, got_bias = net.scored_rows(torch.arange(len(ITEM_IDS)))
        for i, item in enumerate(ITEM_IDS):
            want = torch.cat((net.Wy[i], net.By[i : i + 1]))
            if item in frame.index:
                want += rows.tables[0][int(cat.codes_of(np.array([frame.at[item, "cat"]]))[0])]
                codes = tags.codes_of(np.array(frame.at[item, "tags"].split("|")))
                want += rows.tables[1][torch.as_tensor(codes)].mean(0)
                want += (frame.at[item, "price"] - num.mean) / num.std * rows.projection[0]
            else:  # no row: the unknown codes (0) and a standardised numeric of 0
                want += rows.tables[0][0] + rows.tables[1][0]
            torch.testing.assert_close(got[i], want[:5], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got_bias[i], want[5], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(net.scored_rows(torch.arange(len(ITEM_IDS)))[0], got)
        out = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
        # score_all covers the cold item 99 too (its row and bias: attributes alone;
        # tests/test_attributes_cold.py checks it by hand): the training items' columns come first
        torch.testing.assert_close(net.score_all(out)[:, : len(ITEM_IDS)], out @ got.t() + got_bias)
        buffer = torch.empty(3, len(ITEM_IDS) + 1)
        net.score_all(out, buffer)
        torch.testing.assert_close(buffer[:, : len(ITEM_IDS)], out @ got.t() + got_bias)
        # the shared input rows are the composed rows
        torch.testing.assert_close(net.input_rows(torch.tensor([4, 1])), got[[4, 1]])


def test_no_attribute_columns_is_the_plain_network_bit_for_bit() -> None:
    """An attribute table of ids only composes nothing: the net is the plain one, and training
    (default backend: the C step here where it builds, and the reference step) gives the same
    losses and weights bit for bit."""
    ids_only = attributes(TABLE[["ItemId"]])
    for reference in (False, True):
        results = []
        for attrs in (None, ids_only):
            cfg = config(adapt="adagrad", n_sample=3, loss="cross-entropy")
            net = GRU4RecNet(len(ITEM_IDS), cfg, generator=torch.Generator().manual_seed(5), attributes=attrs)
            assert net.attributes is None
            trainer = Trainer(net, cfg, SUPPORT, reference=reference)
            losses = [trainer.train_step(s["inputs"], s["targets"], s["active"].float(), s["keep"].float()) for s in steps()]
            results.append((torch.stack(losses), [p.detach().clone() for p in net.parameters()]))
        assert torch.equal(results[0][0], results[1][0])
        assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


# ------------------------------------------------------------------ the backend and the step


def test_backend_runs_fast_step_for_attributes_on_unique_rows_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The CPU (unique rows) runs FastStep for attributes — the C step declines them, said once
    with FastStep's cost; scratch rows (the GPU's form) run the reference step, said once."""
    monkeypatch.setattr(backend_module, "_declined", set())
    cfg = config()
    net = GRU4RecNet(len(ITEM_IDS), cfg, attributes=attributes())
    scratch = backend_module.select_backend("cpu", unique_rows=False, cpu_kernels=False, fused_gpu=False)
    with caplog.at_level(logging.INFO, logger="gru4rec.training.backend"):
        trainer = Trainer(net, cfg, SUPPORT)
        Trainer(net, cfg, SUPPORT)  # said once
        slow = Trainer(net, cfg, SUPPORT, backend=scratch)
        Trainer(net, cfg, SUPPORT, backend=scratch)
    assert not trainer.reference and trainer._cpu_step is None
    assert trainer.backend.step_form(cfg, attributes=True) == trainer.backend.name != "reference"
    if trainer.backend.one_call_step:  # the C step could run the plain network here: it declines, once
        lines = [r.getMessage() for r in caplog.records if "not as one C call" in r.getMessage()]
        assert len(lines) == 1 and "attributes" in lines[0] and "plain C step" in lines[0]
    assert slow.reference and scratch.step_form(cfg, attributes=True) == "reference"
    lines = [r.getMessage() for r in caplog.records if "reference step" in r.getMessage()]
    assert len(lines) == 1 and "attributes" in lines[0] and "slower" in lines[0]
    assert trainer.backend.step_form(cfg) != "reference"  # plain: unchanged
    plain = Trainer(GRU4RecNet(len(ITEM_IDS), cfg), cfg, SUPPORT)
    assert not plain.reference


@pytest.mark.parametrize("reference", [True, False], ids=["reference-step", "fast-step"])
@pytest.mark.parametrize("p_id", [0.0, 0.5])
@pytest.mark.parametrize("mode", ["shared", "separate", "none"])
def test_steps_against_autograd_of_the_whole_composition(mode: str, p_id: float, reference: bool) -> None:
    """Two SGD steps of the trainer (float64; the reference step, and FastStep, which the CPU
    runs by default) against the loss written by hand over the composed rows and biases with
    every table a leaf: the same losses, and every parameter — id rows, By, the attribute tables
    with their bias column, the projection, the GRU, E or Wx_0 and, in the separate and one-hot
    modes, the input rows' own attribute tables and projection — at p − lr·g. With id dropout the
    step's dropped items (its masks, read after the step) are composed without their id part, in
    the scores and in the input rows. Both steps' bookkeeping is one helper
    (gru4rec.training.composed): an attribute gradient dropped or doubled there fails here."""
    kw: dict[str, object] = {"shared": {}, "separate": dict(constrained_embedding=False, embedding=3),
                             "none": dict(constrained_embedding=False, embedding=0)}[mode]
    cfg = config(dropout_p_id=p_id, **kw)
    net = GRU4RecNet(len(ITEM_IDS), cfg, generator=torch.Generator().manual_seed(7), attributes=attributes()).double()
    want = copy.deepcopy(net)
    trainer = Trainer(net, cfg, SUPPORT, reference=reference)
    assert trainer.reference == reference
    hidden = [torch.zeros(B, 5, dtype=torch.float64)]
    params = dict(want.named_parameters())
    assert "attributes.projection" in params and "attributes.tables.1" in params
    with torch.no_grad():  # biases start at 0: give them values, so that a lost bias gradient shows
        for p in (want.By, *(t for t in want.attributes.tables), want.attributes.projection):  # type: ignore[union-attr]
            (p if p.dim() == 1 else p[:, 5]).uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(4))
    net.load_state_dict(want.state_dict())
    dropped = 0
    for s in steps():
        got_loss = trainer.train_step(s["inputs"], s["targets"], s["active"], s["keep"])
        keep = trainer.dropout.keep_ids(torch.arange(len(ITEM_IDS)))  # this step's (its salt is drawn)
        assert (keep is None) == (p_id == 0)
        k_in, k_t = (None, None) if keep is None else (keep[s["inputs"]], keep[s["targets"]])
        dropped += 0 if keep is None else int((~keep[s["targets"]]).sum())
        rows = want.attributes
        assert rows is not None
        inputs_rows = want.input_composition
        assert inputs_rows is (rows if mode == "shared" else want.input_attributes) is not None
        x = inputs_rows.compose(want.input_table, s["inputs"], k_in)
        h = want.run_layers(x, hidden)[-1]
        wy, by = rows.compose_scored(want.Wy, want.By, s["targets"], k_t)
        raw = by + h @ wy.t()
        loss = -torch.log_softmax(raw, dim=1).diagonal().sum() / B
        torch.testing.assert_close(got_loss, loss.detach(), rtol=1e-12, atol=1e-12)
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        with torch.no_grad():
            for p, g in zip(params.values(), grads, strict=True):
                if g is not None:
                    p.sub_(0.1 * g)
        hidden = [h.detach()]
    got = dict(net.named_parameters())
    for name, p in params.items():
        torch.testing.assert_close(got[name], p, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    assert (dropped > 0) == (p_id > 0)  # with id dropout some targets were scored without their id part
    # the attribute tables did move (the test can fail), the input rows' own too
    start = dict(GRU4RecNet(len(ITEM_IDS), cfg, generator=torch.Generator().manual_seed(7), attributes=attributes()).double()
                 .named_parameters())
    moved = [name for name in start if "attributes." in name and not torch.equal(got[name], start[name])]
    assert "attributes.tables.0" in moved
    if mode != "shared":
        assert {"input_attributes.tables.0", "input_attributes.tables.1", "input_attributes.projection"} <= set(moved)


def test_attribute_tables_follow_the_optimisers_row_rules() -> None:
    """Adagrad with momentum: an attribute table's state (acc, vel) exists and changes only at
    the codes a step used (lazy rows, as the item tables)."""
    cfg = config(adapt="adagrad", momentum=0.5)
    net = GRU4RecNet(len(ITEM_IDS), cfg, attributes=attributes())
    trainer = Trainer(net, cfg, SUPPORT)
    s = steps()[0]
    trainer.train_step(s["inputs"], s["targets"], s["active"].float(), s["keep"].float())
    state = trainer.optimizer.state_dict()
    assert {"attributes.cat0.acc", "attributes.cat0.vel", "attributes.cat1.acc"} <= state.keys()
    rows = net.attributes
    assert rows is not None
    used = torch.unique(rows.cat0_codes[torch.cat([s["inputs"], s["targets"]])])
    touched = torch.nonzero(state["attributes.cat0.acc"].abs().sum(1)).flatten()
    assert torch.equal(touched, used)


def test_the_scored_catalogue_follows_every_change_of_the_tables() -> None:
    """score_all keeps the composed catalogue between calls (an evaluation's steps score against
    the same one) and composes it again after any change: a training step (the optimiser's fused
    CPU rules write through data pointers, which torch does not count), an in-place torch
    operation, new attribute rows."""
    cfg = config(adapt="adagrad", momentum=0.5)
    net = GRU4RecNet(len(ITEM_IDS), cfg, attributes=attributes())
    out = torch.randn(3, cfg.layers[-1], dtype=net.Wy.dtype)

    def fresh() -> torch.Tensor:  # the scores from rows composed now, item by item
        rows, bias = net.scored_rows(torch.arange(net.n_catalogue))
        return torch.addmm(bias, out, rows.t())

    with torch.no_grad():
        first = net.score_all(out).clone()
        torch.testing.assert_close(first, fresh(), rtol=0, atol=0)
        kept = net._scored.rows
        assert torch.equal(net.score_all(out), first) and net._scored.rows is kept  # nothing changed: reused
    trainer = Trainer(net, cfg, SUPPORT)
    s = steps()[0]
    trainer.train_step(s["inputs"], s["targets"], s["active"].float(), s["keep"].float())
    with torch.no_grad():
        after_step = net.score_all(out).clone()
        assert not torch.equal(after_step, first)
        torch.testing.assert_close(after_step, fresh(), rtol=0, atol=0)
        rows = net.attributes
        assert rows is not None
        rows.tables[0].mul_(2.0)  # a torch in-place change, no call to tables_changed
        torch.testing.assert_close(net.score_all(out), fresh(), rtol=0, atol=0)
        rows.tables[0].numpy()[:] *= 0.5  # a write torch does not see: the caller says so
        net.tables_changed()
        torch.testing.assert_close(net.score_all(out), fresh(), rtol=0, atol=0)


# ------------------------------------------------------------------ fit


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    subprocess.run([sys.executable, "-m", "gru4rec", "synth", "--kind", "intents-attributes", "--n-sessions", "2000",
                    "--seed", "1", "-q", str(out)], check=True)
    return out


def test_fit_with_item_features_trains_and_composes(synth: Path, tmp_path: Path) -> None:
    model = GRU4Rec(layers=[32], batch_size=32, n_sample=64, n_epochs=3, loss="cross-entropy", constrained_embedding=True,
                    threads=1, device="cpu")
    model.fit(synth / "train_tr.tsv", item_features=synth / "items.tsv", attribute_types={"category": "categorical"},
              valid=synth / "train_valid.tsv", progress=False)
    losses = [h.loss for h in model.history]
    assert len(model.valid_history) == 3  # validation scores the composed rows (score_all)
    assert losses[2] < losses[1] < losses[0]
    net = model.net
    assert net is not None and net.attributes is not None
    rows = net.attributes
    assert rows.names == ["category", "brand"] and rows.projection is not None
    assert rows.n_items > rows.n_warm  # the table's items no event has: cold items
    # hand check of one trained item: id row + its category's row + its brand's row + price·P
    items = pd.read_csv(synth / "items.tsv", sep="\t").set_index("ItemId")
    assert model.item_map is not None
    item_id = model.item_map.ids[0]
    i = 0
    # the encoding as fit builds it (the data side, tested in test_item_attributes.py)
    attrs = ItemAttributes.build(read_item_table(synth / "items.tsv", types={"category": "categorical"}), model.item_map)
    cat, brand = attrs.encoding.categorical
    num = attrs.encoding.numeric[0]
    category = read_item_table(synth / "items.tsv", types={"category": "categorical"}).columns[0]
    assert category.offsets is not None
    value = category.values[category.offsets[list(items.index).index(item_id)]]
    with torch.no_grad():
        want = (torch.cat((net.Wy[i], net.By[i : i + 1])) + rows.tables[0][int(cat.codes_of(np.array([value]))[0])]
                + rows.tables[1][int(brand.codes_of(np.array([items.at[item_id, "brand"]]))[0])]
                + (items.at[item_id, "price"] - num.mean) / num.std * rows.projection[0])
        got_row, got_bias = net.scored_rows(torch.tensor([i]))
        torch.testing.assert_close(got_row[0], want[:-1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_bias[0], want[-1], rtol=1e-5, atol=1e-6)
        assert rows.tables[0][:, -1].abs().sum() > 0  # the bias column was trained
    # the model file holds the attributes: the trained model loads and scores bit for bit
    # (tests/test_attributes_model_file.py checks the file's parts)
    model.save(tmp_path / "m.safetensors")
    loaded = GRU4Rec.load(tmp_path / "m.safetensors", device="cpu")
    assert loaded.net is not None and loaded.net.attributes is not None
    with torch.no_grad():
        assert torch.equal(loaded.net.scored_rows(torch.arange(rows.n_items))[0], net.scored_rows(torch.arange(rows.n_items))[0])
    assert list(loaded.recommend([item_id], k=5).item_ids) == list(model.recommend([item_id], k=5).item_ids)
    # recommendations rank the composed rows' scores (never int8 candidates built on the plain Wy)
    assert model.output_layer() is None
    from gru4rec.inference.scoring import make_topk

    with pytest.raises(ValueError, match="scoring='int8' is not available: .* trained with item attributes"):
        make_topk(model, "int8")
    with torch.no_grad():
        state = model.init_state(1)
        out = model.step(torch.tensor([0]), state)
        scores = model.scores(out)
        # the whole catalogue: the training items, then the cold items (their attributes' biases)
        every, bias = net.scored_rows(torch.arange(rows.n_items))
        torch.testing.assert_close(scores, out @ every.t() + bias)
    top = model.recommend([item_id], k=5)
    assert model.catalogue is not None
    assert list(top.item_ids) == list(np.asarray(model.catalogue.ids)[torch.topk(scores[0], 5).indices.numpy()])
    # the item embeddings export gives the composed rows of the whole catalogue (tests/test_attributes_export.py)
    from gru4rec.export import item_embeddings

    columns, _ = item_embeddings(model)
    assert model.catalogue is not None and columns["item_id"].tolist() == model.catalogue.to_list()
    np.testing.assert_allclose(columns["output"], net.scored_rows(torch.arange(rows.n_items))[0].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_fit_warm_starts_a_model_with_attributes_from_its_file(synth: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Yesterday's model file plus today's table: the old items, values and projection keep their
    rows (checked on the network before today's first step, then after training: it trains);
    a column of today's table that yesterday's model has not is said to be ignored."""
    kw: dict[str, object] = dict(layers=[16], batch_size=32, n_sample=32, loss="cross-entropy", constrained_embedding=True,
                                 threads=1, device="cpu", adapt="adagrad")
    types = {"category": "categorical"}
    events = pd.read_csv(synth / "train_tr.tsv", sep="\t")
    sessions = events["SessionId"].unique()
    first, second = events[events["SessionId"].isin(sessions[: len(sessions) // 2])], events
    items = pd.read_csv(synth / "items.tsv", sep="\t")
    # yesterday knew the first half of the brands only: today's table brings the others
    brands = items["brand"].unique()
    old_items = items.assign(brand=items["brand"].where(items["brand"].isin(brands[: len(brands) // 2]), brands[0]))
    yesterday = GRU4Rec(n_epochs=1, **kw).fit(first, item_features=old_items, attribute_types=types, progress=False)
    yesterday.save(tmp_path / "y.safetensors", optimizer=True)
    assert yesterday.net is not None and yesterday.net.attributes is not None
    old_rows = yesterday.net.attributes
    seen: dict[str, torch.Tensor] = {}
    original = backend_module.Backend.runs_reference
    today = GRU4Rec(n_epochs=1, **kw)

    def spy(self: object, net: GRU4RecNet, *args: object, **kwargs: object) -> object:
        if net.attributes is not None and not seen:  # the warm network, before its first step
            seen.update({k: v.detach().clone() for k, v in net.named_parameters()})
        return original(self, net, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend_module.Backend, "runs_reference", spy)
        with caplog.at_level(logging.WARNING, logger="gru4rec.fitting"):
            today.fit(second, item_features=items.assign(color="red"), attribute_types=types,
                      init_from=tmp_path / "y.safetensors", progress=False)
    assert "column(s) ['color'] ignored: the init_from model has no such attribute" in caplog.text
    assert today.item_map is not None and yesterday.item_map is not None
    n_old = len(yesterday.item_map)
    assert today.item_map.to_list()[:n_old] == yesterday.item_map.to_list()
    assert seen and torch.equal(seen["Wy"][:n_old], yesterday.net.Wy)
    for c, table in enumerate(old_rows.tables):
        assert torch.equal(seen[f"attributes.tables.{c}"][: table.shape[0]], table)
    assert old_rows.projection is not None and torch.equal(seen["attributes.projection"], old_rows.projection)
    assert today.net is not None and today.net.attributes is not None
    brand = today.net.attributes.source.encoding.categorical[1]
    assert brand.vocabulary.tolist()[: len(old_rows.source.encoding.categorical[1].vocabulary)] == \
        old_rows.source.encoding.categorical[1].vocabulary.tolist()
    assert len(brand.vocabulary) > len(old_rows.source.encoding.categorical[1].vocabulary)  # today's brands added
    assert not torch.equal(today.net.attributes.tables[1][: old_rows.tables[1].shape[0]], old_rows.tables[1])  # trained


def test_a_run_with_attributes_resumes_to_the_same_model(synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM inside epoch 2, then resume: the model of an uninterrupted run, bit for bit."""
    import signal

    from gru4rec.errors import TrainingInterrupted

    kw: dict[str, object] = dict(layers=[16], batch_size=32, n_sample=32, n_epochs=2, loss="cross-entropy",
                                 constrained_embedding=True, threads=1, device="cpu", adapt="adagrad",
                                 train_random_order=True, dropout_p_hidden=0.2)
    args: dict[str, object] = dict(item_features=synth / "items.tsv", attribute_types={"category": "categorical"},
                                   progress=False)
    reference = GRU4Rec(**kw).fit(synth / "train_tr.tsv", **args)
    stop_at = reference.history[0].n_steps + 3
    original = Trainer.train_step
    calls = [0]

    def train_step(self: Trainer, *a: object, **k: object) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == stop_at:
            signal.raise_signal(signal.SIGTERM)
        return original(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Trainer, "train_step", train_step)
    with pytest.raises(TrainingInterrupted):
        GRU4Rec(**kw).fit(synth / "train_tr.tsv", checkpoint_dir=tmp_path, **args)
    monkeypatch.undo()
    with pytest.raises(ModelFileError, match="other ones"):  # another table: refused by name
        GRU4Rec(**kw).fit(synth / "train_tr.tsv", checkpoint_dir=tmp_path, resume=True, progress=False,
                          item_features=synth / "items.tsv", attribute_types={"category": "categorical"}, attribute_min_count=50)
    resumed = GRU4Rec(**kw).fit(synth / "train_tr.tsv", checkpoint_dir=tmp_path, resume=True, **args)
    assert [s.loss for s in resumed.history] == [s.loss for s in reference.history[1:]]
    assert resumed.net is not None and reference.net is not None
    want, got = reference.net.state_dict(), resumed.net.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_fit_refuses_item_features_in_bfloat16(synth: Path) -> None:
    model = GRU4Rec(layers=[8], n_epochs=1, threads=1, device="cpu", precision="bfloat16")
    with pytest.raises(Gru4RecError, match="precision='bfloat16' cannot be used with it"):
        model.fit(synth / "train_tr.tsv", item_features=synth / "items.tsv", progress=False)


def test_id_dropout_keeps_one_decision_per_item_and_step() -> None:
    """keep_ids: every occurrence of an item in a step gets the same decision, about 1 − p of the
    items are kept (binomial bounds over 20,000 items), the decisions change from step to step
    and are independent of the item's neighbours; p = 0 draws nothing (a plain trainer's masks
    are those it drew before: no salt)."""
    from gru4rec.training.dropout import DropoutMasks, keep_masks

    def uniform(u: torch.Tensor, g: torch.Generator) -> None:
        u.uniform_(generator=g)

    n = 20_000
    net = GRU4RecNet(len(ITEM_IDS), config(dropout_p_id=0.3), attributes=attributes())
    masks = DropoutMasks(net, B, seed=5, threshold=keep_masks, uniform=uniform)
    items = torch.arange(n)
    masks.draw()
    first = masks.keep_ids(items)
    assert first is not None
    twice = masks.keep_ids(torch.cat((items[:50], items[:50])))
    assert twice is not None and torch.equal(twice[:50], twice[50:]) and torch.equal(twice[:50], first[:50])
    share = first.double().mean().item()
    assert abs(share - 0.7) < 4 * (0.7 * 0.3 / n) ** 0.5, share
    masks.draw()
    second = masks.keep_ids(items)
    assert second is not None
    both = (first & second).double().mean().item()  # independent steps: P(kept twice) = 0.49
    assert abs(both - 0.49) < 4 * (0.49 * 0.51 / n) ** 0.5, both
    neighbours = (first[1:] & first[:-1]).double().mean().item()  # consecutive items: independent too
    assert abs(neighbours - 0.49) < 4 * (0.49 * 0.51 / n) ** 0.5, neighbours
    plain_net = GRU4RecNet(len(ITEM_IDS), config(dropout_p_hidden=0.2), attributes=attributes())
    plain = DropoutMasks(plain_net, B, seed=5, threshold=keep_masks, uniform=uniform)
    plain.draw()
    assert plain.keep_ids(items) is None
    g = torch.Generator().manual_seed(5)
    torch.empty(B * 5).uniform_(generator=g)  # exactly the hidden mask's draws, nothing more
    assert torch.equal(plain.generator.get_state(), g.get_state())


def test_validation_during_fit_keeps_the_cold_targets(synth: Path) -> None:
    """fit(valid=...) ranks the validation events as a test does: with attributes, the events of
    cold items are kept (before, the validation sessions were built on the training items and
    dropped them). The test split holds clicks on cold items: the last epoch's validation figures
    equal gru4rec.evaluate's on the final model, which counts its cold targets."""
    from gru4rec import evaluate

    model = GRU4Rec(layers=[16], batch_size=32, n_sample=64, n_epochs=2, loss="cross-entropy", constrained_embedding=True,
                    threads=1, device="cpu", dropout_p_id=0.3)
    model.fit(synth / "train_full.tsv", item_features=synth / "items.tsv", attribute_types={"category": "categorical"},
              valid=synth / "test.tsv", valid_cutoffs=[20], progress=False)
    result = evaluate(model, synth / "test.tsv", cutoffs=[20])
    groups = result.target_groups
    cold = {g.label: g for g in groups or []}["cold"]
    assert cold.n_predictions > 0  # the test has cold targets (the test can fail)
    last = model.valid_history[-1]
    assert last["recall@20"] == pytest.approx(float(result.recall[20]), abs=1e-12)
    assert last["mrr@20"] == pytest.approx(float(result.mrr[20]), abs=1e-12)
