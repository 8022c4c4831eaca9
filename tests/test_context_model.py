"""Click context end to end (issue 49, point 3; docs/attributes.md, "Click context"): layer 0's
projection against NumPy, the draws, Wc's gradient against finite differences (float64), training,
evaluation against a brute-force NumPy evaluator that computes the context by hand, the model
file, recommend, the session state, and the bad inputs. Without the option every result is
main's, bit for bit (a digest of a plain fit computed on main before the option existed)."""
from __future__ import annotations

import copy
import hashlib
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.config import Config
from gru4rec.data import sessions_from_events
from gru4rec.errors import ConfigError, DataError, Gru4RecError
from gru4rec.inference import SessionState
from gru4rec.network.gru import GRU4RecNet
from gru4rec.serve.state import LastClick, cas_prefix, decode_session, encode_session
from gru4rec.training.trainer import Trainer
from numpy_reference import sigmoid

TINY = "layers=8,batch_size=8,n_sample=4,n_epochs=2,sample_store_size=200"


def events(n_sessions: int = 60, n_items: int = 25, seed: int = 0) -> pd.DataFrame:
    """Sessions of 2-6 clicks spread over a week of unix times, gaps of 1 s to 3 h."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 7, n_sessions)
    rows = []
    for s, n in enumerate(lengths):
        t = 1.7e9 + rng.uniform(0, 7 * 86_400)
        for _ in range(n):
            rows.append((s, int(rng.integers(0, n_items)), t))
            t += float(rng.uniform(1, 3 * 3600))
    return pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])


def by_hand(t: float, previous: float | None) -> np.ndarray:
    """A click's five context features from the calendar (the module's formula, written apart)."""
    dt = datetime.fromtimestamp(t, tz=timezone.utc)
    hour = dt.hour + dt.minute / 60 + (dt.second + dt.microsecond / 1e6) / 3600
    day = dt.weekday()
    gap = 0.0 if previous is None else math.log1p(t - previous)
    return np.array([math.sin(2 * math.pi * hour / 24), math.cos(2 * math.pi * hour / 24),
                     math.sin(2 * math.pi * day / 7), math.cos(2 * math.pi * day / 7), gap])


def numpy_params(net: GRU4RecNet) -> dict[str, np.ndarray]:
    return {name: p.detach().double().numpy() for name, p in net.named_parameters()}


# ------------------------------------------------------------------ the network


@pytest.mark.parametrize("mode", ["shared", "none"])
def test_layer0_projection_adds_the_context_through_wc(mode: str) -> None:
    config = Config.from_string(f"layers=6,click_context=True,constrained_embedding={mode == 'shared'}")
    net = GRU4RecNet(11, config, generator=torch.Generator().manual_seed(3)).double()
    rng = np.random.default_rng(1)
    ctx = rng.normal(size=(4, 5))
    items = np.array([0, 3, 3, 10])
    p = numpy_params(net)
    x = net.input_rows(torch.from_numpy(items))
    got = net.layer0_projection(x, torch.from_numpy(ctx)).detach().numpy()
    base = p["layers.0.Wx"][items] if mode == "none" else p["Wy"][items] @ p["layers.0.Wx"]
    np.testing.assert_allclose(got, base + ctx @ p["Wc"] + p["layers.0.Bh"], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="click_context"):
        net.layer0_projection(x)  # a context network never runs without its context
    plain = GRU4RecNet(11, config.replace(click_context=False)).double()
    with pytest.raises(ValueError, match="without click_context"):
        plain.layer0_projection(x, torch.from_numpy(ctx))


def test_wc_is_drawn_after_every_other_draw_by_the_blocks_rule() -> None:
    config = Config.from_string("layers=7/5,click_context=True")
    plain_gen, ctx_gen = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    plain = GRU4RecNet(13, config.replace(click_context=False), generator=plain_gen)
    net = GRU4RecNet(13, config, generator=ctx_gen)
    for name, p in plain.named_parameters():  # the plain draws do not move
        assert torch.equal(p, dict(net.named_parameters())[name]), name
    s = math.sqrt(6.0 / (5 + 7))  # Glorot per block: 5 rows, 7 columns
    want = torch.cat([torch.empty(5, 7).uniform_(-s, s, generator=plain_gen) for _ in range(3)], dim=1)
    assert net.Wc is not None and torch.equal(net.Wc, want)
    assert "Wc" in net.dense_parameters() and "Wc" not in net.sparse_parameters()  # updated whole at every step


def test_wc_gradient_equals_finite_differences_float64() -> None:
    config = Config.from_string("layers=5/4,click_context=True,hidden_act=tanh")
    net = GRU4RecNet(9, config, generator=torch.Generator().manual_seed(2)).double()
    rng = np.random.default_rng(4)
    items = torch.tensor([1, 4, 8])
    ctx = torch.from_numpy(rng.normal(size=(3, 5)))
    hidden = [torch.from_numpy(rng.normal(size=(3, n))) for n in (5, 4)]
    weights = torch.from_numpy(rng.normal(size=(3, 4)))

    def loss(wc: torch.Tensor) -> torch.Tensor:
        net.Wc.data.copy_(wc)  # type: ignore[union-attr]
        return (net.run_layers(net.input_rows(items), hidden, None, ctx)[-1] * weights).sum()

    assert net.Wc is not None
    wc0 = net.Wc.detach().clone()
    (grad,) = torch.autograd.grad(loss(wc0), [net.Wc])
    numeric = torch.zeros_like(wc0)
    eps = 1e-6
    for i in range(wc0.shape[0]):
        for j in range(wc0.shape[1]):
            up, down = wc0.clone(), wc0.clone()
            up[i, j] += eps
            down[i, j] -= eps
            numeric[i, j] = (loss(up).item() - loss(down).item()) / (2 * eps)
    np.testing.assert_allclose(grad.numpy(), numeric.numpy(), rtol=1e-6, atol=1e-8)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("reference", [True, False])
def test_the_training_step_moves_wc_by_its_gradient(reference: bool) -> None:
    """One sgd step in float64 of the reference step and of FastStep: Wc moves by −lr × the
    finite-difference gradient of the step's loss with respect to Wc (the loss of a fresh
    trainer, no samples)."""
    config = Config.from_string("layers=4,batch_size=3,n_sample=0,click_context=True,adapt=sgd,learning_rate=0.1")
    base = GRU4RecNet(6, config, generator=torch.Generator().manual_seed(8)).double()
    support = np.ones(6, dtype=np.int64)
    inputs, targets = torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4])
    active, keep = torch.ones(3, dtype=torch.float64), torch.ones(3, 1, dtype=torch.float64)
    ctx = torch.from_numpy(np.random.default_rng(0).normal(size=(3, 5)))

    def step(wc: torch.Tensor) -> tuple[float, torch.Tensor]:
        net = copy.deepcopy(base)
        assert net.Wc is not None
        net.Wc.data.copy_(wc)
        trainer = Trainer(net, config, support, reference=reference)
        assert trainer.reference == reference
        loss = trainer.train_step(inputs, targets, active, keep, context=ctx)
        return float(loss), net.Wc.detach().clone()

    assert base.Wc is not None
    wc0 = base.Wc.detach().clone()
    _, after = step(wc0)
    eps = 1e-6
    numeric = torch.zeros_like(wc0)
    for i in range(wc0.shape[0]):
        for j in range(wc0.shape[1]):
            up, down = wc0.clone(), wc0.clone()
            up[i, j] += eps
            down[i, j] -= eps
            numeric[i, j] = (step(up)[0] - step(down)[0]) / (2 * eps)
    np.testing.assert_allclose(((wc0 - after) / 0.1).numpy(), numeric.numpy(), rtol=1e-5, atol=1e-9)


# ------------------------------------------------------------------ without the option: main's results


#: sha256 of a plain fit's epoch losses and weights, computed on main before click_context existed
#: (main at 0b044f9, the same fit, one thread: :func:`plain_fit_digest`), with the torch version
#: it was computed with (another version may round differently: the test is skipped there).
PLAIN_FIT_DIGEST = "7c71f990c237dd77c9d2ce1fe84977648aec72e81706dd9df603f8b4e8ab7057"
DIGEST_TORCH = "2.13.0+cpu"


def plain_fit_digest() -> str:
    model = GRU4Rec(TINY, device="cpu", threads=1).fit(events(), progress=False)
    h = hashlib.sha256(repr([s.loss for s in model.history]).encode())
    assert model.net is not None
    for name, t in model.net.state_dict().items():
        h.update(name.encode() + t.detach().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.skipif(torch.__version__ != DIGEST_TORCH, reason=f"the digest was computed with torch {DIGEST_TORCH}")
def test_a_plain_fit_is_mains_bit_for_bit() -> None:
    assert plain_fit_digest() == PLAIN_FIT_DIGEST


def test_a_context_model_with_zero_wc_scores_as_the_plain_model() -> None:
    model = GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events(), progress=False)
    assert model.net is not None and model.net.Wc is not None and model.click_context
    plain = GRU4Rec(model.config.replace(click_context=False), device="cpu")
    plain.item_map, plain.item_support = model.item_map, model.item_support
    plain.net = GRU4RecNet(len(model.item_map), plain.config)  # type: ignore[arg-type]
    plain.net.load_state_dict({k: v for k, v in model.net.state_dict().items() if k != "Wc"})
    plain.net.eval()
    model.net.Wc.data.zero_()
    test = events(seed=9)
    a = evaluate(model, test, cutoffs=(5,), mode="conservative", return_ranks=True)
    b = evaluate(plain, test, cutoffs=(5,), mode="conservative", return_ranks=True)
    assert a.ranks is not None and b.ranks is not None and np.array_equal(a.ranks, b.ranks)


# ------------------------------------------------------------------ evaluation against brute force


def brute_force(model: GRU4Rec, test: pd.DataFrame, k: int) -> tuple[float, float, int]:
    """Recall@k and MRR@k with conservative ties, one session and one click at a time in NumPy,
    the context from the calendar (:func:`by_hand`)."""
    assert model.net is not None and model.item_map is not None
    p = numpy_params(model.net)
    L = model.net.layers[0].size
    hits = rr = 0.0
    n = 0
    for _, session in test.sort_values(["SessionId", "Time"], kind="stable").groupby("SessionId", sort=False):
        idx = model.item_map.index_of(session["ItemId"].to_numpy())
        times = session["Time"].to_numpy()[idx >= 0]
        idx = idx[idx >= 0]
        h = np.zeros(L)
        previous = None
        for pos in range(len(idx) - 1):
            v = p["Wy"][idx[pos]] @ p["layers.0.Wx"] + by_hand(times[pos], previous) @ p["Wc"] + p["layers.0.Bh"]
            previous = times[pos]
            r = sigmoid(v[L:2 * L] + h @ p["layers.0.Wrz"][:, :L])
            z = sigmoid(v[2 * L:] + h @ p["layers.0.Wrz"][:, L:])
            h = (1 - z) * h + z * np.tanh((h * r) @ p["layers.0.Wh"] + v[:L])
            scores = p["Wy"] @ h + p["By"]
            rank = int((scores >= scores[idx[pos + 1]]).sum())  # conservative: every tie ranks above
            n += 1
            if rank <= k:
                hits += 1
                rr += 1 / rank
    return hits / n, rr / n, n


def test_evaluate_feeds_the_test_clicks_context_as_brute_force_does() -> None:
    model = GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events(), progress=False)
    test = events(n_sessions=30, seed=11)
    result = evaluate(model, test, cutoffs=(5,), mode="conservative", batch_size=4)
    recall, mrr, n = brute_force(model, test, 5)
    assert result.n_predictions == n
    assert result.recall[5] == pytest.approx(recall, abs=1e-9)
    assert result.mrr[5] == pytest.approx(mrr, abs=1e-6)
    # The context matters: shifting every test click by 5 hours changes the scores.
    shifted = test.assign(Time=test["Time"] + 5 * 3600)
    moved = evaluate(model, shifted, cutoffs=(5,), mode="conservative", return_ranks=True)
    same = evaluate(model, test, cutoffs=(5,), mode="conservative", return_ranks=True)
    assert moved.ranks is not None and same.ranks is not None and not np.array_equal(moved.ranks, same.ranks)


def test_recommend_with_times_equals_the_evaluators_state() -> None:
    model = GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events(), progress=False)
    assert model.item_map is not None
    ids = model.item_map.ids[[3, 7, 1]].tolist()
    times = [1.7e9 + 100.0, 1.7e9 + 160.0, 1.7e9 + 4000.0]
    got = model.score_sessions([ids], times=[times])[0]
    p = numpy_params(model.net)  # type: ignore[arg-type]
    L = 8
    h, previous = np.zeros(L), None
    for item, t in zip([3, 7, 1], times):
        v = p["Wy"][item] @ p["layers.0.Wx"] + by_hand(t, previous) @ p["Wc"] + p["layers.0.Bh"]
        previous = t
        r, z = sigmoid(v[L:2 * L] + h @ p["layers.0.Wrz"][:, :L]), sigmoid(v[2 * L:] + h @ p["layers.0.Wrz"][:, L:])
        h = (1 - z) * h + z * np.tanh((h * r) @ p["layers.0.Wh"] + v[:L])
    np.testing.assert_allclose(got, p["Wy"] @ h + p["By"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.session_embeddings([ids], times=[times])[0], h, rtol=1e-4, atol=1e-6)
    top = model.recommend_batch([iter(ids)], k=3, times=[times])[0]  # a session given as an iterator is read once
    assert list(top.item_ids) == list(model.item_map.ids[np.argsort(-got, kind="stable")[:3]])


# ------------------------------------------------------------------ the model file, warm starts


def test_save_load_round_trip_keeps_wc_and_the_option(tmp_path: pytest.TempPathFactory) -> None:
    model = GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events(), progress=False)
    path = tmp_path / "ctx.safetensors"  # type: ignore[operator]
    model.save(path)
    loaded = GRU4Rec.load(path, device="cpu")
    assert loaded.click_context and loaded.config.click_context
    assert loaded.net is not None and model.net is not None and torch.equal(loaded.net.Wc, model.net.Wc)  # type: ignore[arg-type]
    test = events(seed=4)
    a = evaluate(model, test, cutoffs=(5,), return_ranks=True)
    b = evaluate(loaded, test, cutoffs=(5,), return_ranks=True)
    assert a.ranks is not None and b.ranks is not None and np.array_equal(a.ranks, b.ranks)
    # A warm start carries the option and Wc; asking to drop it is refused by name.
    warm = GRU4Rec(n_epochs=1, device="cpu").fit(events(seed=5), init_from=path, progress=False)
    assert warm.click_context
    with pytest.raises(ConfigError, match="click_context"):
        GRU4Rec(n_epochs=1, click_context=False, device="cpu").fit(events(seed=5), init_from=path, progress=False)


# ------------------------------------------------------------------ the session state


def test_a_stored_state_keeps_the_last_click_time_and_plain_states_stay_layout_2() -> None:
    last = LastClick(3, np.array([1, 2], dtype=np.int64), np.array([0.5, 0.25], dtype=np.float32), False, True)
    hidden = np.arange(6, dtype=np.float32)
    with_time = encode_session(SessionState(hidden, np.array([3], dtype=np.int32), 1.7e9 + 0.25), 4, last)
    plain = encode_session(SessionState(hidden, np.array([3], dtype=np.int32)), 4, last)
    assert plain[4:6] == b"\x02\x00" and with_time[4:6] == b"\x03\x00" and len(with_time) == len(plain) + 8
    got = decode_session(with_time, 6)
    assert got is not None and got.state.last_time == 1.7e9 + 0.25 and got.position == 4
    assert np.array_equal(got.state.hidden, hidden) and got.last is not None and got.last.item == 3
    back = decode_session(plain, 6)
    assert back is not None and back.state.last_time is None
    assert cas_prefix(with_time) == with_time[:14] and not plain.startswith(cas_prefix(with_time))


# ------------------------------------------------------------------ bad inputs


def test_context_needs_times() -> None:
    model = GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events(), progress=False)
    assert model.item_map is not None
    sessions, _ = sessions_from_events(events(seed=3), model.item_map, drop_unknown=True)
    bare = type(sessions)(sessions.items, sessions.offsets, sessions.session_ids)  # no times
    with pytest.raises(DataError, match="'Time'"):
        evaluate(model, bare)
    with pytest.raises(DataError, match="'Time'"):
        GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events().drop(columns="Time"), progress=False)
    with pytest.raises(Gru4RecError, match="times"):
        model.recommend(model.item_map.ids[:2].tolist(), times=[1.7e9])
    with pytest.raises(Gru4RecError, match="click_context"):
        model.predict_next_batch([1], [model.item_map.ids[0]])


# ------------------------------------------------------------------ the command lines


def test_the_command_lines_train_evaluate_show_and_recommend_with_context(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_helpers import parse_metrics, run

    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    events().to_csv(train, sep="\t", index=False)
    events(n_sessions=30, seed=11).to_csv(test, sep="\t", index=False)
    model_path = tmp_path / "m.safetensors"
    code, out, _ = run(["train", train, "-ps", TINY + ",click_context=True", "-s", model_path, "-t", test,
                        "-m", 5, "-e", "conservative"], capsys)
    assert code == 0
    model = GRU4Rec.load(model_path, device="cpu")
    recall, mrr, _ = brute_force(model, events(n_sessions=30, seed=11), 5)
    got = parse_metrics(out)[0][5]
    assert got == pytest.approx((recall, mrr), abs=1e-4)
    code, out, _ = run(["evaluate", model_path, "-t", test, "-m", 5, "-e", "conservative"], capsys)
    assert code == 0 and parse_metrics(out)[0][5] == got
    code, out, _ = run(["info", model_path], capsys)
    assert code == 0 and "click context: hour_sin, hour_cos, dow_sin, dow_cos, log_gap (Wc)" in out
    assert "click_context = true" in out and "Wc: float32 5x24" in out
    recs = tmp_path / "recs.tsv"
    code, _, _ = run(["recommend", model_path, "-i", test, "-k", 3, "-o", recs], capsys)
    assert code == 0
    first = events(n_sessions=30, seed=11).query("SessionId == 0")
    want = model.recommend(first["ItemId"].tolist(), k=3, times=first["Time"].tolist())
    assert pd.read_csv(recs, sep="\t").query("SessionId == 0")["ItemId"].tolist() == want.item_ids.tolist()


# ------------------------------------------------------------------ the schedule carries each input click's context


def test_the_schedule_carries_each_input_clicks_context_also_in_random_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event's context row holds its own item index (column 0): each step's context must
    then equal its inputs, epoch after epoch of a random session order."""
    import gru4rec.training.loop as loop
    from gru4rec.training.batching import build_schedule

    config = Config.from_string(TINY + ",click_context=True,train_random_order=True").replace(n_epochs=3)
    model_events = events()
    net_items = np.sort(model_events["ItemId"].unique())
    from gru4rec.data import ItemMap

    item_map = ItemMap.from_list(net_items.tolist())
    sessions, _ = sessions_from_events(model_events, item_map)
    context = np.zeros((sessions.n_events, 5), dtype=np.float32)
    context[:, 0] = sessions.items
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def spy(*args: object, **kwargs: object) -> object:
        schedule = build_schedule(*args, **kwargs)  # type: ignore[arg-type]
        assert schedule.context is not None
        seen.append((schedule.inputs, schedule.context[:, :, 0]))
        return schedule

    monkeypatch.setattr(loop, "build_schedule", spy)
    net = GRU4RecNet(len(item_map), config, generator=torch.Generator().manual_seed(1))
    trainer = Trainer(net, config, np.bincount(sessions.items, minlength=len(item_map)))
    list(loop.train_epochs(trainer, sessions.items, sessions.offsets, progress=False, context=context))
    assert len(seen) == 3 and not torch.equal(seen[0][0], seen[1][0])  # three orders
    for inputs, ctx in seen:
        assert torch.equal(ctx.to(torch.int64), inputs)


def test_a_paropt_space_searches_the_option() -> None:
    from gru4rec.tune.space import check_paramspace, parse_paramspace, trial_param_string

    space = parse_paramspace('{"name": "click_context", "dtype": "categorical", "values": [true, false]}')
    check_paramspace(space, Config())
    assert Config.from_string(trial_param_string(space, {"click_context": True})).click_context is True
    assert Config.from_string(trial_param_string(space, {"click_context": False})).click_context is False


def test_the_backend_names_faststep_for_a_context_config() -> None:
    from gru4rec.training.backend import select_backend

    backend = select_backend("cpu")
    assert backend.step_form(Config.from_string("click_context=True")) == backend.name  # FastStep, not the C step
    assert backend.step_form(Config.from_string("click_context=True"), reference=True) == "reference"


def test_validation_during_fit_feeds_the_context() -> None:
    valid = events(n_sessions=20, seed=21)
    model = GRU4Rec(TINY + ",click_context=True", device="cpu").fit(events(), valid=valid, valid_cutoffs=[5], progress=False)
    last = model.valid_history[-1]
    assert last["recall@5"] == pytest.approx(evaluate(model, valid, cutoffs=(5,)).recall[5])


CONTRACT = {
    "xe-shared-logq-dropout-momentum": "layers=12,n_sample=10,logq=1.0,dropout_p_hidden=0.3,dropout_p_embed=0.2,momentum=0.2",
    "bprmax-separate-2layers": "layers=10/6,n_sample=10,loss=bpr-max,final_act=elu-1,bpreg=0.9,constrained_embedding=False,"
                               "embedding=8,dropout_p_hidden=0.2",
    "xe-none-2layers-lmbd": "layers=10/6,n_sample=10,constrained_embedding=False,embedding=0,lmbd=0.01,momentum=0.1",
}


@pytest.mark.parametrize("ops", ["torch", "cpu-kernels"])
@pytest.mark.parametrize("name", list(CONTRACT))
def test_faststep_with_context_gives_the_reference_steps_results(name: str, ops: str) -> None:
    """FastStep (PyTorch ops in float64 — bit-close —, the fused CPU kernels in float32) against
    the autograd reference on a network with click context: the same losses, weights (Wc
    included) and hidden states after several steps of one schedule with its clicks' context."""
    from gru4rec.kernels.cpu import cpu_kernels
    from gru4rec.training.backend import select_backend
    from gru4rec.training.batching import build_schedule

    if ops == "cpu-kernels" and cpu_kernels() is None:
        pytest.skip("the fused CPU kernels cannot be built here")
    dtype = torch.float64 if ops == "torch" else torch.float32
    config = Config.from_string(f"batch_size=6,sample_store_size=60,learning_rate=0.1,click_context=True,{CONTRACT[name]}")
    data = events(n_sessions=40, n_items=20, seed=6)
    from gru4rec.data import ItemMap

    item_map = ItemMap.from_list(sorted(data["ItemId"].unique().tolist()))
    sessions, _ = sessions_from_events(data, item_map)
    from gru4rec.items.context import sessions_context

    schedule = build_schedule(sessions.items, sessions.offsets, config.batch_size, config.n_sample, "cpu", dtype,
                              context=sessions_context(sessions.times, sessions.offsets))
    support = np.bincount(sessions.items, minlength=len(item_map))
    net = GRU4RecNet(len(item_map), config, generator=torch.Generator().manual_seed(3)).to(dtype)
    results = []
    for reference in (True, False):
        backend = select_backend("cpu", dtype, cpu_kernels=ops == "cpu-kernels")
        trainer = Trainer(copy.deepcopy(net), config, support, reference=reference, backend=backend)
        assert trainer.reference == reference and trainer._cpu_step is None  # never the C step with context
        assert schedule.context is not None
        losses = [float(trainer.train_step(schedule.inputs[t], schedule.targets[t], schedule.active[t], schedule.keep[t],
                                           context=schedule.context[t])) for t in range(8)]
        results.append((losses, dict(trainer.net.named_parameters()), [h.clone() for h in trainer.hidden]))
    (ref_loss, ref_p, ref_h), (fast_loss, fast_p, fast_h) = results
    rtol, atol = (1e-10, 1e-12) if dtype == torch.float64 else (1e-4, 2e-6)
    np.testing.assert_allclose(fast_loss, ref_loss, rtol=rtol)
    for key, p in ref_p.items():
        np.testing.assert_allclose(fast_p[key].detach().numpy(), p.detach().numpy(), rtol=rtol, atol=atol, err_msg=key)
    for a, b in zip(fast_h, ref_h):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=atol)
    assert not torch.equal(ref_p["Wc"], net.Wc.to(dtype))  # type: ignore[union-attr]  # Wc was trained
