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
from gru4rec.model import GRU4RecNet  # noqa: E402
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
            torch.testing.assert_close(state[k], want_state[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k} after step {t + 1}: {m}")


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
        torch.testing.assert_close(v, runs[1][1][k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert runs[0][0][1] < runs[0][0][0] or params.startswith("loss=top1")  # it trains (bpr-max, xe: the loss falls)
