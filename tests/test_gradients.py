"""Gradients of the engine's training step against finite differences of the NumPy reference loss.

The engine's gradient is read through the optimiser: with plain SGD, learning rate 1, no momentum
and no L2, one step changes every parameter by exactly −g (item tables at their used rows, with
duplicate rows summed), so ``g = p_before − p_after`` for every entry of every parameter.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_reference as ref
from gru4rec.config import Config
from gru4rec.training.losses import make_loss
from test_model import net_to_params
from test_step_reference import LOSS_VARIANTS, STEPS, SUPPORT, VARIANT_IDS, engine_step, make_config, make_trainer, ref_config, start

torch.set_num_threads(1)


def engine_gradients(cfg: Config, params: ref.Params, hidden: list[np.ndarray], step: dict) -> ref.Params:
    trainer = make_trainer(cfg, params, hidden)
    engine_step(trainer, step)
    after = net_to_params(trainer.net)
    return {k: params[k] - after[k] for k in params}


def reference_gradients(cfg: Config, params: ref.Params, hidden: list[np.ndarray], step: dict) -> ref.Params:
    _, grads, _ = ref.step_gradients(params, hidden, np.array(step["inp"]), np.array(step["tgt"]),
                                     np.array(step["active"], bool), np.array(step["reset"], bool),
                                     np.array(step["samples"]), ref_config(cfg), SUPPORT)
    return grads


def check(cfg: Config, mode: str, layers: tuple[int, ...], step: dict, seed: int = 1) -> None:
    params, hidden = start(mode, layers, seed=seed)
    got = engine_gradients(cfg, params, hidden, step)
    exp = reference_gradients(cfg, params, hidden, step)
    assert set(got) == set(exp)
    scale = max(float(np.abs(g).max()) for g in exp.values())
    assert scale > 1e-3  # the case has real gradients
    for k in exp:
        np.testing.assert_allclose(got[k], exp[k], rtol=1e-6, atol=1e-9 * max(1.0, scale), err_msg=k)


@pytest.mark.parametrize("mode,layers", [("none", (4,)), ("separate", (4, 3)), ("shared", (4,))])
@pytest.mark.parametrize("loss,final_act,kw", LOSS_VARIANTS, ids=VARIANT_IDS)
def test_step_gradients_every_loss(loss: str, final_act: str, kw: dict, mode: str, layers: tuple[int, ...]) -> None:
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, adapt="sgd", learning_rate=1.0,
                      # logQ pushes scores down: with relu every score would be 0 (no gradient)
                      logq=1.0 if loss in ("cross-entropy", "bpr-max") and final_act != "relu" else 0.0,
                      sample_alpha=0.4, **kw)
    check(cfg, mode, layers, STEPS[0])


@pytest.mark.parametrize("mode,layers", [("none", (3, 4)), ("separate", (4,)), ("shared", (3, 4))])
@pytest.mark.parametrize("loss,final_act", [("cross-entropy", "softmax"), ("bpr-max", "elu-0.5"), ("top1", "linear")])
def test_step_gradients_epoch_tail(loss: str, final_act: str, mode: str, layers: tuple[int, ...]) -> None:
    """Two of four rows active, a reset row: inactive rows contribute nothing to any gradient."""
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, adapt="sgd", learning_rate=1.0, logq=0.5)
    check(cfg, mode, layers, STEPS[2], seed=5)


@pytest.mark.parametrize("hidden_act", ["relu", "elu-0.8", "leaky-0.2", "selu-1.05-1.6", "linear"])
def test_step_gradients_hidden_activations(hidden_act: str) -> None:
    cfg = make_config("shared", (5,), loss="cross-entropy", hidden_act=hidden_act, adapt="sgd", learning_rate=1.0)
    check(cfg, "shared", (5,), STEPS[1], seed=2)


@pytest.mark.parametrize("loss,final_act,kw", LOSS_VARIANTS, ids=VARIANT_IDS)
def test_loss_gradient_wrt_scores(loss: str, final_act: str, kw: dict) -> None:
    """d loss / d raw scores of the masked loss equals finite differences of the reference on the
    compacted matrix; inactive rows and their target columns get exactly zero gradient."""
    rng = np.random.default_rng(12)
    Bq, Sq = 4, 3
    raw = rng.normal(scale=1.2, size=(Bq, Bq + Sq))
    active = np.array([1, 1, 0, 1], dtype=bool)
    fn = make_loss(Config(loss=loss, final_act=final_act, batch_size=Bq, **kw))
    x = torch.from_numpy(raw.copy()).requires_grad_()
    col_valid = torch.from_numpy(np.concatenate([active, np.ones(Sq, bool)]).astype(np.float64))
    fn(x, col_valid, torch.from_numpy(active.astype(np.float64)), torch.tensor(float(active.sum() + Sq), dtype=torch.float64)).backward()
    got = x.grad.numpy()
    rows = np.flatnonzero(active)
    cols = np.concatenate([rows, Bq + np.arange(Sq)])

    def f(p: ref.Params) -> float:
        r = ref.apply_final_act(final_act, p["s"])
        return float(ref.loss_per_row(loss, r, kw.get("smoothing", 0.0), kw.get("bpreg", 1.0)).sum() / Bq)

    exp = ref.numerical_gradients(f, {"s": raw[rows][:, cols].copy()})["s"]
    np.testing.assert_allclose(got[rows][:, cols], exp, rtol=1e-6, atol=1e-10)
    assert np.all(got[~active] == 0)
    assert np.all(got[:, np.flatnonzero(~active)] == 0)
