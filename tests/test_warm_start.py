"""Warm start (``fit(init_from=...)``, ``gru4rec train --init-from``): continuing a trained model
on new data. Checked against the old model's own answers, a fresh network's draws, counts of
the new data, and a warm start written out by hand (weights copied, optimiser tables filled
row by row) trained by the same epoch loop."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.config import Config
from gru4rec.data import ItemMap, item_support, sessions_from_events
from gru4rec.datasets.synthetic import generate
from gru4rec.errors import ConfigError, Gru4RecError
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import select_backend
from gru4rec.training.loop import train_epochs
from gru4rec.training.trainer import Trainer
from gru4rec.training.warm_start import carry_optimizer_state, grow_item_map, inherit_config, warm_net

SMALL = "layers=16,batch_size=8,n_sample=24,n_epochs=1,sample_store_size=1000,learning_rate=0.1,momentum=0.3"
MODES = {"shared": "", "separate": ",constrained_embedding=False,embedding=12", "none": ",constrained_embedding=False,embedding=0"}


def days() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Yesterday's events, and today's: yesterday's later sessions again plus sessions with
    items never seen before (ids shifted by 10,000), so that some old items are absent today."""
    old = generate(n_sessions=200, n_items=120, seed=3)
    fresh = generate(n_sessions=120, n_items=60, seed=4)
    fresh["ItemId"] += 10_000
    fresh["SessionId"] += 1_000_000
    fresh["Time"] += old["Time"].max() + 1
    later = old[old["SessionId"] >= old["SessionId"].quantile(0.6)]
    return old, pd.concat([later, fresh], ignore_index=True)


@pytest.fixture(scope="module")
def yesterday() -> GRU4Rec:
    old, _ = days()
    return GRU4Rec(SMALL, device="cpu", threads=1).fit(old, progress=False)


def test_grow_item_map_keeps_every_index_and_appends_new_ids_in_order_of_first_appearance() -> None:
    old = ItemMap.from_ids([5, 3, 9])
    grown = grow_item_map(old, pd.Series([9, 7, 3, 1, 7, 5, 8]))
    assert grown.to_list() == [5, 3, 9, 7, 1, 8]
    assert grow_item_map(old, pd.Series([3, 3, 5])) is old


@pytest.mark.parametrize("mode", MODES)
def test_new_rows_are_drawn_as_a_fresh_network_draws_them_and_old_rows_are_kept(mode: str) -> None:
    cfg = Config.from_string(SMALL + MODES[mode])
    old = GRU4RecNet(40, cfg, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        old.By.normal_()  # biases are zero at initialisation: give the old ones values to carry
    net = warm_net(old, 55, cfg, generator=torch.Generator().manual_seed(2))
    fresh = GRU4RecNet(55, cfg, generator=torch.Generator().manual_seed(2))
    tables = set(old.sparse_parameters())
    assert tables == set(net.sparse_parameters())
    fresh_params, old_params = dict(fresh.named_parameters()), dict(old.named_parameters())
    for name, p in net.named_parameters():
        if name in tables:
            assert torch.equal(p[:40], old_params[name]), name
            assert torch.equal(p[40:], fresh_params[name][40:]), name
        else:
            assert torch.equal(p, old_params[name]), name


def test_zero_epochs_of_warm_start_answer_as_the_old_model(yesterday: GRU4Rec) -> None:
    """The warm network before its first step: the old items' scores are the old model's, and
    the new items are scored from their fresh rows."""
    _, today = days()
    grown = grow_item_map(yesterday.item_map, today["ItemId"])
    n_old = len(yesterday.item_map)
    assert len(grown) > n_old
    warm = GRU4Rec(yesterday.config, device="cpu")
    warm.item_map, warm.item_support = grown, np.ones(len(grown), dtype=np.int64)
    warm.net = warm_net(yesterday.net, len(grown), yesterday.config).eval()
    sessions = [list(yesterday.item_map.ids[[1, 4, 2]]), list(yesterday.item_map.ids[[7]]), list(yesterday.item_map.ids[[0, 9, 9, 3]])]
    old_scores = yesterday.score_sessions(sessions)
    new_scores = warm.score_sessions(sessions)
    states = yesterday.session_embeddings(sessions)
    np.testing.assert_array_equal(warm.session_embeddings(sessions), states)  # the same network: bit for bit
    # The product over a wider table may round differently in the last bit (another GEMM blocking).
    np.testing.assert_allclose(new_scores[:, :n_old], old_scores, rtol=1e-6, atol=1e-7)
    want_new = states @ warm.net.Wy[n_old:].detach().numpy().T  # By of a new row is 0
    np.testing.assert_allclose(new_scores[:, n_old:], want_new, rtol=1e-5, atol=1e-6)


def test_fit_init_from_grows_the_map_and_takes_todays_popularity(yesterday: GRU4Rec) -> None:
    _, today = days()
    model = GRU4Rec(SMALL, device="cpu", threads=1).fit(today, progress=False, init_from=yesterday)
    old_ids = yesterday.item_map.to_list()
    assert model.item_map.to_list()[: len(old_ids)] == old_ids
    new_ids = [i for i in pd.unique(today.sort_values(["Time"], kind="stable")["ItemId"]) if i not in set(old_ids)]
    assert sorted(model.item_map.to_list()[len(old_ids):]) == sorted(new_ids)
    counts = today["ItemId"].value_counts()
    want = np.array([counts.get(i, 0) for i in model.item_map.to_list()])
    np.testing.assert_array_equal(model.item_support, want)
    absent = np.flatnonzero(want[: len(old_ids)] == 0)
    assert len(absent), "some old item must be absent today for this test to mean anything"
    # An absent item is never an input, a target or a sample (support 0): its rows stay as they were.
    for name, table in model.net.sparse_parameters().items():
        old_table = yesterday.net.sparse_parameters()[name]
        torch.testing.assert_close(table[absent], old_table[absent], rtol=0, atol=0, msg=name)
        assert not torch.equal(table[: len(old_ids)], old_table), f"{name}: the present items' rows must have moved"
    with pytest.warns(UserWarning, match="unknown item"):
        popular = model.recommend([-1], k=5)  # no known item: the fallback, by today's counts
    assert popular.fallback and list(popular.item_ids) == list(model.item_map.ids[np.argsort(-want, kind="stable")[:5]])


@pytest.mark.parametrize(("change", "field"), [
    ("layers=16/8", "layers"),
    ("hidden_act=relu", "hidden_act"),
    ("constrained_embedding=False,embedding=12", "constrained_embedding"),
])
def test_a_network_mismatch_is_one_error_naming_the_field(yesterday: GRU4Rec, change: str, field: str) -> None:
    _, today = days()
    with pytest.raises(ConfigError, match=rf"the network differs \({field}: "):
        GRU4Rec(Config.from_string(SMALL).replace_from_string(change), device="cpu").fit(today, progress=False, init_from=yesterday)


def test_separate_embeddings_of_another_width_are_a_mismatch() -> None:
    old, today = days()
    model = GRU4Rec(SMALL + MODES["separate"], device="cpu", threads=1).fit(old, progress=False)
    with pytest.raises(ConfigError, match=r"embedding: 12 in the model, 10 now"):
        GRU4Rec(SMALL + ",constrained_embedding=False,embedding=10", device="cpu").fit(today, progress=False, init_from=model)


def _by_hand(base: GRU4Rec, today: pd.DataFrame, config: Config, *, with_state: bool) -> GRU4RecNet:
    """The warm start written out: the grown map, the old rows copied into a fresh network, the
    old optimiser tables copied row by row into a fresh trainer, then ``fit``'s epoch loop."""
    grown = grow_item_map(base.item_map, today["ItemId"])
    sessions, _ = sessions_from_events(today, grown)
    support = item_support(sessions.items, len(grown))
    torch.manual_seed(config.seed)
    net = GRU4RecNet(len(grown), config, generator=torch.Generator().manual_seed(config.seed))
    n_old = len(base.item_map)
    with torch.no_grad():
        old = dict(base.net.named_parameters())
        tables = set(net.sparse_parameters())
        for name, p in net.named_parameters():
            (p[:n_old] if name in tables else p).copy_(old[name])
    trainer = Trainer(net, config, support)
    if with_state:
        assert base.optimizer_state is not None
        with torch.no_grad():
            for key, value in trainer.optimizer.state_dict().items():
                (value[:n_old] if key.rsplit(".", 1)[0] in tables else value).copy_(
                    base.optimizer_state[key][:n_old] if key.rsplit(".", 1)[0] in tables else base.optimizer_state[key])
    for _ in train_epochs(trainer, sessions.items, sessions.offsets, rng=np.random.default_rng(config.seed + 3), progress=False):
        pass
    return net


@pytest.mark.parametrize("adapt", ["adagrad", "adam"])
def test_a_saved_optimizer_state_is_carried_and_a_file_without_one_starts_fresh(
    tmp_path: Path, adapt: str, caplog: pytest.LogCaptureFixture
) -> None:
    old, today = days()
    config = Config.from_string(SMALL + f",adapt={adapt}")
    base = GRU4Rec(config, device="cpu", threads=1).fit(old, progress=False)
    with_state, without = tmp_path / "with.safetensors", tmp_path / "without.safetensors"
    base.save(with_state, optimizer=True)
    base.save(without)
    loaded = GRU4Rec.load(with_state)
    assert loaded.optimizer_state is not None and GRU4Rec.load(without).optimizer_state is None
    for key, value in base.optimizer_state.items():
        assert torch.equal(loaded.optimizer_state[key], value), key
    if adapt == "adam":
        assert float(loaded.optimizer_state["t"]) > 0
    with caplog.at_level(logging.INFO, logger="gru4rec"):
        carried = GRU4Rec(config, device="cpu", threads=1).fit(today, progress=False, init_from=with_state)
        fresh = GRU4Rec(config, device="cpu", threads=1).fit(today, progress=False, init_from=str(without))
    assert "optimiser state carried" in caplog.text and "holds no optimiser state" in caplog.text
    want_carried = _by_hand(base, today, config, with_state=True)
    want_fresh = _by_hand(base, today, config, with_state=False)
    for name, p in carried.net.named_parameters():
        torch.testing.assert_close(p, dict(want_carried.named_parameters())[name], rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(dict(fresh.net.named_parameters())[name], dict(want_fresh.named_parameters())[name],
                                   rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.allclose(carried.net.Wy, fresh.net.Wy, atol=1e-4), "the carried state must change the result"


def test_saving_a_state_the_model_does_not_have_is_an_error(tmp_path: Path, yesterday: GRU4Rec) -> None:
    yesterday.save(tmp_path / "m.safetensors")
    loaded = GRU4Rec.load(tmp_path / "m.safetensors")
    with pytest.raises(Gru4RecError, match="no optimiser state"):
        loaded.save(tmp_path / "again.safetensors", optimizer=True)


def test_another_optimiser_starts_fresh(yesterday: GRU4Rec, caplog: pytest.LogCaptureFixture) -> None:
    _, today = days()
    with caplog.at_level(logging.INFO, logger="gru4rec"):
        GRU4Rec(SMALL + ",adapt=rmsprop", device="cpu", threads=1).fit(today, progress=False, init_from=yesterday)
    assert "the optimiser changed (adagrad -> rmsprop)" in caplog.text


def _backends() -> dict[str, dict]:
    found = {"torch-unique": dict(cpu_kernels=False), "torch-scratch": dict(cpu_kernels=False, unique_rows=False)}
    try:
        select_backend("cpu", cpu_kernels=True)
        found["cpu-kernels"] = dict(cpu_kernels=True)
    except ValueError:
        pass
    try:
        import triton  # noqa: F401

        select_backend("cpu", unique_rows=False, fused_gpu=True)
        found["triton"] = dict(unique_rows=False, fused_gpu=True)
    except (ImportError, ValueError):
        pass
    return found


@pytest.mark.parametrize("backend", _backends())
def test_the_carried_state_is_the_old_rows_and_zeros_on_every_backend(yesterday: GRU4Rec, backend: str) -> None:
    """The state lands in each backend's own tables (old rows, zero new rows, dense state and
    step count whole), and the next steps use it: equal to the PyTorch backend's steps."""
    n_old, n_new = len(yesterday.item_map), len(yesterday.item_map) + 17
    support = np.arange(1, n_new + 1)
    config = yesterday.config
    rng = np.random.default_rng(0)
    batches = [(torch.from_numpy(rng.integers(0, n_new, 8)), torch.from_numpy(rng.integers(0, n_new, 8))) for _ in range(3)]
    samples = [torch.from_numpy(rng.integers(0, n_new, config.n_sample)) for _ in range(3)]

    def run(switches: dict) -> Trainer:
        net = warm_net(yesterday.net, n_new, config, generator=torch.Generator().manual_seed(5))
        trainer = Trainer(net, config, support, backend=select_backend("cpu", **switches))
        assert carry_optimizer_state(trainer.optimizer, yesterday.optimizer_state, config, n_old, "the test model")
        state = trainer.optimizer.state_dict()
        tables = set(net.sparse_parameters())
        for key, value in state.items():
            old = yesterday.optimizer_state[key]
            if key.rsplit(".", 1)[0] in tables:
                assert torch.equal(value[:n_old], old) and not value[n_old:].any(), key
            else:
                assert torch.equal(value, old), key
        ones, keep = torch.ones(8), torch.ones(8, 1)
        for (inputs, targets), s in zip(batches, samples):
            trainer.train_step(inputs, targets, ones, keep, s)
        return trainer

    got, want = run(_backends()[backend]), run(dict(cpu_kernels=False))
    for (name, p), q in zip(got.net.named_parameters(), want.net.parameters()):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6, msg=name)


def test_the_train_command_warm_starts_from_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.cli import main

    old, today = days()
    old.to_csv(tmp_path / "old.tsv", sep="\t", index=False)
    today.to_csv(tmp_path / "today.tsv", sep="\t", index=False)
    first, second = tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    assert main(["train", str(tmp_path / "old.tsv"), "-ps", SMALL, "-s", str(first), "--save-optimizer", "--threads", "1"]) == 0
    assert GRU4Rec.load(first).optimizer_state is not None
    assert main(["train", str(tmp_path / "today.tsv"), "-ps", SMALL, "--init-from", str(first), "-s", str(second), "--threads", "1"]) == 0
    got = GRU4Rec.load(second)
    assert got.optimizer_state is None  # not asked for
    want = GRU4Rec(SMALL, device="cpu", threads=1).fit(today, progress=False, init_from=first)
    assert got.item_map == want.item_map and len(got.item_map) > len(GRU4Rec.load(first).item_map)
    for name, p in got.net.named_parameters():
        torch.testing.assert_close(p, dict(want.net.named_parameters())[name], rtol=1e-6, atol=1e-7, msg=name)
    capsys.readouterr()
    other = Config.from_string(SMALL).replace_from_string("layers=16/8").to_param_string()
    code = main(["train", str(tmp_path / "today.tsv"), "-ps", other, "--init-from", str(first)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gru4rec: error: ")]
    assert code != 0 and len(err) == 1 and "the network differs (layers: 16 in the model, 16/8 now)" in err[0], err
    assert main(["train", str(tmp_path / "today.tsv"), "--save-optimizer"]) != 0
    assert "--save-optimizer needs --save" in capsys.readouterr().err


def test_a_model_can_warm_start_from_itself() -> None:
    """``model.fit(today, init_from=model)``: what it starts from is taken before fit replaces it."""
    old, today = days()
    model = GRU4Rec(SMALL, device="cpu", threads=1).fit(old, progress=False)
    twin = GRU4Rec(SMALL, device="cpu", threads=1).fit(old, progress=False)
    n_old = len(model.item_map)
    model.fit(today, progress=False, init_from=model)
    want = GRU4Rec(SMALL, device="cpu", threads=1).fit(today, progress=False, init_from=twin)
    assert len(model.item_map) > n_old and model.item_map == want.item_map
    for name, p in model.net.named_parameters():
        torch.testing.assert_close(p, dict(want.net.named_parameters())[name], rtol=1e-6, atol=1e-7, msg=name)


# ------------------------------------------------------------------ the model's config as the defaults


def test_a_warm_start_without_network_fields_trains_the_models_network(yesterday: GRU4Rec) -> None:
    """``GRU4Rec("n_epochs=2").fit(today, init_from=yesterday)``: every field not given is the
    model's (layers=16, learning_rate=0.1, momentum=0.3, ... of SMALL, not the defaults), and
    the result is the warm start written out by hand with that config."""
    _, today = days()
    model = GRU4Rec("n_epochs=2", device="cpu", threads=1).fit(today, progress=False, init_from=yesterday)
    want_config = Config.from_string(SMALL).replace(n_epochs=2)
    assert model.config == want_config
    assert (model.config.layers, model.config.learning_rate, model.config.batch_size) == ((16,), 0.1, 8)
    want = _by_hand(yesterday, today, want_config, with_state=True)
    for name, p in model.net.named_parameters():
        torch.testing.assert_close(p, dict(want.named_parameters())[name], rtol=1e-5, atol=1e-6, msg=name)
    assert model.epochs_trained == 2


def test_given_training_fields_win_over_the_models() -> None:
    old = Config.from_dict(Config.from_string(SMALL + ",loss=bpr-max,final_act=elu-1").to_dict())  # as read from a file
    assert inherit_config(old, Config(n_epochs=3, learning_rate=0.2), "m") == old.replace(n_epochs=3, learning_rate=0.2)
    assert inherit_config(old, Config(), "m") == old
    assert inherit_config(old, Config(layers=16, hidden_act="tanh"), "m") == old  # equal network fields may be given
    # A new loss without a final_act gets the new loss's default, as in a fresh config.
    assert inherit_config(old, Config(loss="cross-entropy"), "m").final_act == "softmax"
    assert inherit_config(old, Config(loss="top1"), "m").final_act == "elu-0.5"
    assert inherit_config(old, Config(loss="top1", final_act="linear"), "m").final_act == "linear"
    assert inherit_config(old, Config.from_string("n_sample=0").replace(seed=7), "m") == old.replace(n_sample=0, seed=7)


@pytest.mark.parametrize(("given", "message"), [
    ("layers=100", "layers: 16 in the model, 100 now"),
    ("n_epochs=1,hidden_act=relu", "hidden_act: tanh in the model, relu now"),
    ("constrained_embedding=False,embedding=12", "constrained_embedding: True in the model, False now"),
])
def test_a_given_network_field_that_differs_is_the_error_naming_it(yesterday: GRU4Rec, given: str, message: str) -> None:
    _, today = days()
    with pytest.raises(ConfigError, match=rf"cannot warm-start from the given model: the network differs \({message}\)"):
        GRU4Rec(given, device="cpu").fit(today, progress=False, init_from=yesterday)


def test_the_train_command_takes_the_models_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gru4rec train today.tsv -ps n_epochs=2 --init-from day1``: the daily command names no
    network field; its model is the Python API's with the model's config and n_epochs=2."""
    from gru4rec.cli import main

    old, today = days()
    old.to_csv(tmp_path / "old.tsv", sep="\t", index=False)
    today.to_csv(tmp_path / "today.tsv", sep="\t", index=False)
    first, second = tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    assert main(["train", str(tmp_path / "old.tsv"), "-ps", SMALL, "-s", str(first), "--threads", "1"]) == 0
    assert main(["train", str(tmp_path / "today.tsv"), "-ps", "n_epochs=2", "--init-from", str(first),
                 "-s", str(second), "--threads", "1"]) == 0
    got = GRU4Rec.load(second)
    assert got.config == Config.from_string(SMALL).replace(n_epochs=2)
    want = GRU4Rec(Config.from_string(SMALL).replace(n_epochs=2), device="cpu", threads=1).fit(today, progress=False, init_from=first)
    assert got.item_map == want.item_map
    for name, p in got.net.named_parameters():
        torch.testing.assert_close(p, dict(want.net.named_parameters())[name], rtol=1e-6, atol=1e-7, msg=name)
    capsys.readouterr()
    code = main(["train", str(tmp_path / "today.tsv"), "-ps", "n_epochs=2,layers=32", "--init-from", str(first)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gru4rec: error: ")]
    assert code != 0 and len(err) == 1, err
    assert f"cannot warm-start from {first}: the network differs (layers: 16 in the model, 32 now)" in err[0]


def test_the_config_of_a_model_file_is_read_from_its_header(tmp_path: Path, yesterday: GRU4Rec) -> None:
    from gru4rec.errors import ModelFileError
    from gru4rec.formats.model_file import read_model_config

    yesterday.save(tmp_path / "m.safetensors")
    assert read_model_config(tmp_path / "m.safetensors") == yesterday.config == GRU4Rec.load(tmp_path / "m.safetensors").config
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(ModelFileError, match="not a gru4rec model file"):
        read_model_config(tmp_path / "notes.txt")
