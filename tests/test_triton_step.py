"""The training step on the fused GPU kernels (the ``triton`` backend) against the same step on
PyTorch ops and against the autograd reference step, on the steps of test_step_reference.py
(duplicate rows everywhere, an inactive tail slot, a shrinking batch) and over whole epochs
with dropout. Without a GPU the kernels run on CPU tensors through Triton's interpreter."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from gru4rec.config import Config  # noqa: E402
from gru4rec.network.gru import GRU4RecNet  # noqa: E402
from gru4rec.training.backend import select_backend  # noqa: E402
from gru4rec.training.trainer import Trainer  # noqa: E402
from test_model import load_params, net_to_params  # noqa: E402
from test_step_reference import N_ITEMS, STEPS, SUPPORT, UPDATE_CASES, engine_step, make_config, start  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def backends() -> dict[str, dict]:
    """The backends compared: Triton, and PyTorch ops with the same scratch rows (the autograd
    reference step runs on the PyTorch backend)."""
    return {"triton": dict(fused_gpu=True), "torch": dict(fused_gpu=False, cpu_kernels=False)}


def trainer_for(cfg: Config, params, hidden, switches: dict, reference: bool = False) -> Trainer:
    net = GRU4RecNet(N_ITEMS, cfg).to(device=DEVICE, dtype=torch.float32)
    load_params(net, params)
    backend = select_backend(DEVICE, unique_rows=False, graph_replay=False if DEVICE == "cuda" else None, **switches)
    trainer = Trainer(net, cfg, SUPPORT, reference=reference, backend=backend)
    for h, hn in zip(trainer.hidden, hidden):
        h.copy_(torch.from_numpy(hn))
    return trainer


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda c: f"{c[0]}-{len(c[1])}L-{c[2]}-{'-'.join(f'{k}{v}' for k, v in c[5].items())}")
def test_three_steps_equal_the_pytorch_and_autograd_steps(case: tuple) -> None:
    """Loss, every parameter and every optimiser state table after each of three steps, for every
    loss, embedding mode, optimiser, momentum, L2 and grad_cap of the reference cases."""
    mode, layers, loss, final_act, loss_kw, opt_kw = case
    params, hidden = start(mode, layers, seed=7)
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, learning_rate=0.1, sample_alpha=0.5, **loss_kw, **opt_kw)
    fused = trainer_for(cfg, params, hidden, backends()["triton"])
    assert fused.backend.name == "triton" and fused.cell.fused
    others = {"torch": trainer_for(cfg, params, hidden, backends()["torch"]),
              "autograd": trainer_for(cfg, params, hidden, backends()["torch"], reference=True)}
    for t, step in enumerate(STEPS):
        got = engine_step(fused, step)
        for name, other in others.items():
            want = engine_step(other, step)
            assert got == pytest.approx(want, rel=2e-5, abs=1e-6), f"loss at step {t + 1} against {name}"
        mine = net_to_params(fused.net)
        for name, other in others.items():
            theirs = net_to_params(other.net)
            for k in mine:
                np.testing.assert_allclose(mine[k], theirs[k], rtol=2e-5, atol=2e-6, err_msg=f"{k} after step {t + 1} against {name}")
        state, want_state = fused.optimizer.state_dict(), others["torch"].optimizer.state_dict()
        for k in want_state:
            torch.testing.assert_close(
                state[k], want_state[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k, t=t: f"{k} after step {t + 1}: {m}"
            )


@pytest.mark.parametrize("params", [
    "loss=bpr-max,final_act=elu-0.5,bpreg=1.95,dropout_p_embed=0.5,dropout_p_hidden=0.05,momentum=0.4",
    "loss=cross-entropy,final_act=softmax,logq=1.0,constrained_embedding=False,embedding=6,layers=8/6,dropout_p_hidden=0.2",
    "loss=top1-max,final_act=tanh,constrained_embedding=False,embedding=0,hidden_act=relu,grad_cap=0.5,adapt=adam",
])
def test_epochs_with_dropout_equal_the_pytorch_epochs(params: str) -> None:
    """Two epochs through the epoch loop (dropout drawn from the same generator): the same epoch
    losses and weights to float32 round-off."""
    from gru4rec.data import ItemMap, item_support, sessions_from_events
    from gru4rec.datasets.synthetic import generate
    from gru4rec.training.loop import train_epochs

    events = generate(n_sessions=40, n_items=30, seed=2)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    cfg = Config(layers=(8,), batch_size=6, n_sample=10, n_epochs=2, learning_rate=0.05).replace_from_string(params)
    runs = []
    for switches in backends().values():
        net = GRU4RecNet(len(support), cfg, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        backend = select_backend(DEVICE, unique_rows=False, graph_replay=False if DEVICE == "cuda" else None, **switches)
        trainer = Trainer(net, cfg, support, seed=3, backend=backend)
        losses = [s.loss for s in train_epochs(trainer, sessions.items, sessions.offsets, progress=False)]
        runs.append((losses, {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-5)
    for k, v in runs[0][1].items():
        torch.testing.assert_close(v, runs[1][1][k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert runs[0][0][1] < runs[0][0][0] or params.startswith("loss=top1")  # it trains (bpr-max, xe: the loss falls)


@pytest.mark.parametrize("logq, mask_in_bias, n_sample", [(False, False, 7), (True, True, 7), (True, False, 0)])
def test_step_inputs_gather_what_the_pytorch_step_builds(logq: bool, mask_in_bias: bool, n_sample: int) -> None:
    """One launch: the schedule row t, the store row r, the columns, their validity and count,
    the bias (logQ split at B, MASK on invalid columns when asked) and the reset of new sessions."""
    from gru4rec.kernels.triton_step import step_inputs
    from gru4rec.training.losses import MASK
    from gru4rec.training.ops import TorchOps
    from gru4rec.training.sampling import make_logq

    gen = torch.Generator().manual_seed(5)
    T, B, N, n = 6, 5, 40, 70
    s_inputs, s_targets = torch.randint(0, N, (T, B), generator=gen), torch.randint(0, N, (T, B), generator=gen)
    s_active = (torch.rand(T, B, generator=gen) > 0.3).float()
    s_active[4, 1] = 0.0  # step t = 4 has an inactive slot (its column is masked)
    s_keep = (torch.rand(T, B, 1, generator=gen) > 0.5).float()
    store = torch.randint(0, N, (4, n_sample), generator=gen) if n_sample else None
    by = torch.randn(N, generator=gen)
    lq = make_logq(np.arange(1, N + 1), 1.0, 0.5, torch.device("cpu"), torch.float32) if logq else None
    h = torch.randn(B, n, generator=gen)
    C, t, r = B + n_sample, 4, 2
    out = dict(inputs=torch.empty(B, dtype=torch.int64), targets=torch.empty(B, dtype=torch.int64), active=torch.empty(B),
               cols=torch.empty(C, dtype=torch.int64), col_valid=torch.empty(C), n_cols=torch.empty(()), bias=torch.empty(C))
    dev = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    got = {k: dev(v) for k, v in out.items()}
    h_dev = dev(h)
    step_inputs(dev(s_inputs), dev(s_targets), dev(s_active), dev(s_keep), dev(store), dev(torch.tensor(t)), dev(torch.tensor(r)),
                dev(by), None if lq is None else (dev(lq.in_batch), dev(lq.sampled)), mask_in_bias=mask_in_bias, **got, hidden=h_dev)
    got = {k: v.cpu() for k, v in got.items()}
    samples = store[r] if store is not None else torch.empty(0, dtype=torch.int64)
    cols = torch.cat((s_targets[t], samples))
    valid = torch.cat((s_active[t], torch.ones(n_sample)))
    assert torch.equal(got["inputs"], s_inputs[t]) and torch.equal(got["targets"], s_targets[t]) and torch.equal(got["cols"], cols)
    assert torch.equal(got["active"], s_active[t]) and torch.equal(got["col_valid"], valid)
    assert float(got["n_cols"]) == float(s_active[t].sum()) + n_sample
    want_bias = TorchOps().column_bias(by, cols, B, lq, valid if mask_in_bias else None)
    live = valid > 0
    torch.testing.assert_close(got["bias"][live], want_bias[live], rtol=1e-6, atol=1e-6)
    if mask_in_bias:  # MASK exactly where a column is invalid
        assert torch.equal(got["bias"] < MASK / 2, ~live)
    else:
        torch.testing.assert_close(got["bias"], want_bias, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h_dev.cpu(), h * s_keep[t], rtol=0, atol=0)


@pytest.mark.parametrize("params", ["dropout_p_hidden=0.3,momentum=0.2,logq=1.0", "layers=8/6,loss=bpr-max,final_act=elu-0.5"])
def test_a_replayed_step_on_the_triton_backend_trains_like_the_pytorch_loop(params: str) -> None:
    """The counter-driven form of the step (what a CUDA graph replays; here uncaptured), whose
    inputs the Triton backend gathers in one launch, against the plain PyTorch loop: the same step
    losses and weights, sample-store redraws and dropout included."""
    from gru4rec.data import ItemMap, item_support, sessions_from_events
    from gru4rec.datasets.synthetic import generate
    from gru4rec.training.batching import build_schedule
    from test_train import epoch_step_losses

    events = generate(n_sessions=30, n_items=25, seed=6)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    cfg = Config(layers=(8,), batch_size=5, n_sample=6, sample_store_size=18, learning_rate=0.05).replace_from_string(params)
    sch = build_schedule(sessions.items, sessions.offsets, cfg.batch_size, cfg.n_sample, DEVICE)
    runs = []
    for name, switches in backends().items():
        net = GRU4RecNet(len(support), cfg, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        backend = select_backend(DEVICE, unique_rows=False, graph_replay=False if DEVICE == "cuda" else None, **switches)
        trainer = Trainer(net, cfg, support, seed=4, backend=backend)
        assert (trainer._fused_inputs is not None) == (name == "triton")
        losses = epoch_step_losses(trainer, sch, counter_driven=name == "triton")
        assert trainer.sampler.n_redraws > 3
        runs.append((losses.cpu(), net.Wy.detach().cpu().clone()))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("K, d, masked", [(5, 3, True), (37, 70, True), (20, 130, False)])
def test_gather_rows_is_index_select_times_the_mask(K: int, d: int, masked: bool) -> None:
    from gru4rec.kernels.triton_step import gather_rows

    gen = torch.Generator().manual_seed(K)
    table = torch.randn(50, d, generator=gen)
    rows = torch.randint(0, 50, (K,), generator=gen)
    mask = (torch.rand(K, d, generator=gen) > 0.4).float() * 2.5 if masked else None
    out = torch.full((K, d), float("nan"))
    got = gather_rows(table.to(DEVICE), rows.to(DEVICE), None if mask is None else mask.to(DEVICE), out.to(DEVICE)).cpu()
    want = table[rows] * (mask if mask is not None else 1.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dropout_threshold_is_the_inverted_dropout_mask_on_both_sides_of_the_split() -> None:
    from gru4rec.kernels.triton_step import dropout_threshold
    from gru4rec.training.dropout import keep_masks

    u = torch.rand(33 * 1030, generator=torch.Generator().manual_seed(1))
    split = 5 * 1030 + 7
    u[:3] = torch.tensor([0.3, 0.29999, 0.0])  # at and below the first threshold
    u[split:split + 2] = torch.tensor([0.45, 0.4])  # below and at the second
    got = dropout_threshold(u.clone().to(DEVICE), split, 0.3, 0.45).cpu()
    want = u.clone()
    keep_masks(want, split, 0.3, 0.45)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got[0] > 0 and got[1] == 0 and got[2] == 0 and got[split] > 0 and got[split + 1] == 0
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32))  # noqa: E731
    assert set(got[:split].unique().tolist()) == {0.0, f32(1 / 0.7)} and set(got[split:].unique().tolist()) == {0.0, f32(1 / 0.55)}
    with pytest.raises(ValueError, match="p_rest must be in"):
        dropout_threshold(u.clone().to(DEVICE), split, 0.3, 1.0)


def test_bfloat16_products_on_the_triton_backend_train_like_the_pytorch_ops() -> None:
    """With bfloat16 operands the cell stays PyTorch's (its products cast), the rest is Triton's:
    the same epoch losses as the PyTorch ops at the same precision."""
    from gru4rec.data import ItemMap, item_support, sessions_from_events
    from gru4rec.datasets.synthetic import generate
    from gru4rec.training.loop import train_epochs

    events = generate(n_sessions=30, n_items=25, seed=8)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    cfg = Config(layers=(8,), batch_size=5, n_sample=6, n_epochs=1, learning_rate=0.05, dropout_p_hidden=0.1)
    losses = []
    for switches in backends().values():
        net = GRU4RecNet(len(support), cfg, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        backend = select_backend(DEVICE, unique_rows=False, graph_replay=False if DEVICE == "cuda" else None, **switches)
        trainer = Trainer(net, cfg, support, seed=3, precision="bfloat16", backend=backend)
        assert not trainer.cell.fused  # bfloat16 operands: the PyTorch cell on both backends
        losses.append([s.loss for s in train_epochs(trainer, sessions.items, sessions.offsets, progress=False)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
