"""One training step of the torch engine against the independent NumPy reference (docs/behaviour.md §2–§6).

The engine runs in float64 here, so loss values, hidden states, updated parameters and optimiser
state must agree to near machine precision (the reference's gradients come from central finite
differences, which bounds the agreement of updated parameters to ~1e-8).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import numpy_reference as ref
from gru4rec.config import Config
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.losses import make_loss
from gru4rec.training.trainer import Trainer
from test_model import MODES, load_params, net_to_params

torch.set_num_threads(1)

N_ITEMS = 12
SUPPORT = np.array([3, 17, 1, 40, 8, 25, 2, 11, 6, 90, 5, 14], dtype=np.int64)
B, S = 4, 3
EMB = 3  # separate-mode embedding width

# Three consecutive steps with duplicates everywhere: item 3 is two rows' input, a target and a
# sample in step 1; sample 7 appears twice and equals a target in step 2; the last row is inactive
# (epoch tail) and, as the schedule does, carries the first active row's events; step 3 shrinks to
# two rows. Item 9 is used in step 1 only (its momentum must not decay in steps 2 and 3).
STEPS = [
    dict(inp=[3, 3, 5, 3], tgt=[5, 1, 3, 5], active=[1, 1, 1, 0], reset=[0, 1, 0, 0], samples=[1, 9, 3]),
    dict(inp=[5, 1, 3, 5], tgt=[2, 7, 3, 2], active=[1, 1, 1, 0], reset=[0, 0, 1, 0], samples=[7, 7, 0]),
    dict(inp=[2, 2, 3, 2], tgt=[10, 10, 11, 10], active=[1, 0, 1, 0], reset=[1, 0, 0, 0], samples=[5, 10, 4]),
]


# ------------------------------------------------------------------ glue between engine and reference

def make_config(mode: str, layers: tuple[int, ...], **kw: object) -> Config:
    base = dict(layers=layers, batch_size=B, n_sample=S, sample_store_size=30, **MODES[mode])
    if mode == "separate":
        base["embedding"] = EMB
    base.update(kw)
    return Config(**base)


CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])
DEVICES = ["cpu", CUDA]


def make_trainer(cfg: Config, params: ref.Params, hidden: list[np.ndarray], dtype: torch.dtype = torch.float64,
                 device: str = "cpu", reference: bool = False) -> Trainer:
    net = GRU4RecNet(N_ITEMS, cfg).to(device=device, dtype=dtype)
    load_params(net, params)
    trainer = Trainer(net, cfg, SUPPORT, reference=reference)
    for h, hn in zip(trainer.hidden, hidden):
        h.copy_(torch.from_numpy(hn))
    return trainer


def ref_config(cfg: Config) -> ref.RefConfig:
    return ref.RefConfig(layers=cfg.layers, mode=cfg.embedding_mode, loss=cfg.loss, final_act=cfg.final_act,
                         hidden_act=cfg.hidden_act, batch_size=cfg.batch_size, logq=cfg.logq,
                         sample_alpha=cfg.sample_alpha, smoothing=cfg.smoothing, bpreg=cfg.bpreg)


def opt_config(cfg: Config) -> ref.OptConfig:
    return ref.OptConfig(adapt=cfg.adapt, learning_rate=cfg.learning_rate, momentum=cfg.momentum, lmbd=cfg.lmbd,
                         grad_cap=cfg.grad_cap, adapt_params=cfg.resolved_adapt_params, adam_eps=1e-6)


def keep_of(reset: torch.Tensor) -> torch.Tensor:
    """The step's ``keep`` column (B×1) of a 0/1 reset vector."""
    return (1.0 - reset).unsqueeze(1)


def engine_step(trainer: Trainer, step: dict) -> float:
    dev = trainer.net.Wy.device
    f = lambda k: torch.tensor(step[k], dtype=trainer.net.Wy.dtype, device=dev)  # noqa: E731
    i = lambda k: torch.tensor(step[k], dtype=torch.int64, device=dev)  # noqa: E731
    loss = trainer.train_step(i("inp"), i("tgt"), f("active"), keep_of(f("reset")), i("samples"))
    assert loss.dim() == 0
    return float(loss)


def ref_forward(params: ref.Params, hidden: list[np.ndarray], step: dict, rcfg: ref.RefConfig) -> ref.StepResult:
    return ref.forward_step(params, hidden, np.array(step["inp"]), np.array(step["tgt"]), np.array(step["active"], bool),
                            np.array(step["reset"], bool), np.array(step["samples"]), rcfg, SUPPORT)


def ref_train_step(params: ref.Params, hidden: list[np.ndarray], state: ref.OptState, step: dict,
                   rcfg: ref.RefConfig, ocfg: ref.OptConfig):
    """One step of the NumPy reference: (result, new params, new state, touched rows); the
    active rows of ``hidden`` are updated in place."""
    res, grads, rows = ref.step_gradients(params, hidden, np.array(step["inp"]), np.array(step["tgt"]),
                                          np.array(step["active"], bool), np.array(step["reset"], bool),
                                          np.array(step["samples"], dtype=np.int64), rcfg, SUPPORT)
    params, state = ref.optimizer_step(params, grads, state, rows, ocfg)
    for h, rh in zip(hidden, res.hidden):
        h[res.active_idx] = rh
    return res, params, state, rows


def start(mode: str, layers: tuple[int, ...], seed: int = 0) -> tuple[ref.Params, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    params = ref.init_params(N_ITEMS, layers, mode, embedding=EMB, rng=rng, scale=0.6, bias_scale=0.2)
    hidden = [rng.uniform(-0.8, 0.8, (B, n)) for n in layers]
    return params, hidden


def engine_state(trainer: Trainer) -> dict[str, np.ndarray]:
    """Optimiser state keyed like the reference's parameter names."""
    rename = {"layers.0.Wx": "Wx_0"}
    out = {}
    for key, value in trainer.optimizer.state_dict().items():
        if key == "t":
            continue
        name, kind = key.rsplit(".", 1)
        if name.startswith("layers."):
            _, i, p = name.split(".")
            name = f"{p}_{i}"
        out[f"{rename.get(name, name)}.{kind}"] = value.detach().cpu().numpy()
    return out


# ------------------------------------------------------------------ the reference on hand-computed cases

def test_reference_gru_scalar_by_hand() -> None:
    """L = 1, shared mode: every quantity written out."""
    p = {"Wy": np.array([[0.5], [-1.0]]), "By": np.array([0.1, -0.2]), "Wx_0": np.array([[0.3, -0.4, 0.8]]),
         "Wh_0": np.array([[0.7]]), "Wrz_0": np.array([[0.2, -0.6]]), "Bh_0": np.array([0.05, 0.1, -0.1])}
    cfg = ref.RefConfig(layers=(1,), mode="shared")
    h = 0.4
    x = -1.0  # Wy[1]
    sig = lambda t: 1 / (1 + math.exp(-t))  # noqa: E731
    r = sig(-0.4 * x + 0.1 + 0.2 * h)
    z = sig(0.8 * x - 0.1 - 0.6 * h)
    cand = math.tanh(0.7 * h * r + 0.3 * x + 0.05)
    expected = (1 - z) * h + z * cand
    out, _ = ref.gru_forward(p, [np.array([[h]])], np.array([1]), cfg)
    assert out[0, 0] == pytest.approx(expected, rel=1e-14)


def test_reference_losses_by_hand() -> None:
    """One row, columns [positive, neg a, neg b] with scores (1, 0, -1)."""
    r = np.array([[1.0, 0.0, -1.0]])
    sig = lambda t: 1 / (1 + math.exp(-t))  # noqa: E731
    e = math.e
    p = np.array([e, 1, 1 / e]) / (e + 1 + 1 / e)
    assert ref.loss_per_row("cross-entropy", ref.softmax(r))[0] == pytest.approx(-math.log(p[0]), rel=1e-12)
    assert ref.loss_per_row("xe_logit", -ref.log_softmax(r))[0] == pytest.approx(-math.log(p[0]), rel=1e-12)
    # smoothing 0.3, n = 3: (1 - 0.3·3/2)·(−log p0) + 0.3/2·Σ −log pj
    sm = (1 - 0.45) * -math.log(p[0]) + 0.15 * -sum(math.log(q) for q in p)
    assert ref.loss_per_row("cross-entropy", ref.softmax(r), 0.3)[0] == pytest.approx(sm, rel=1e-12)
    assert ref.loss_per_row("xe_logit", -ref.log_softmax(r), 0.3)[0] == pytest.approx(sm, rel=1e-12)
    w = np.array([1, 1 / e]) / (1 + 1 / e)  # softmax over the negatives (0, -1)
    bprmax = -math.log(w[0] * sig(1) + w[1] * sig(2)) + 2.0 * (w[0] * 0 + w[1] * 1)
    assert ref.loss_per_row("bpr-max", r, bpreg=2.0)[0] == pytest.approx(bprmax, rel=1e-12)
    top1max = w[0] * (sig(-1) + sig(0)) + w[1] * (sig(-2) + sig(1))
    assert ref.loss_per_row("top1-max", r)[0] == pytest.approx(top1max, rel=1e-12)
    bpr = -math.log(sig(0)) - math.log(sig(1)) - math.log(sig(2))
    assert ref.loss_per_row("bpr", r)[0] == pytest.approx(bpr, rel=1e-12)
    top1 = (sig(0) + sig(1) + sig(-1) + sig(0) + sig(-2) + sig(1)) / 3 - sig(1) / 3
    assert ref.loss_per_row("top1", r)[0] == pytest.approx(top1, rel=1e-12)


# ------------------------------------------------------------------ the loss functions on masked batches

LOSS_VARIANTS = [
    ("cross-entropy", "softmax", {}),
    ("cross-entropy", "softmax", {"smoothing": 0.1}),
    ("xe_logit", "softmax_logit", {}),
    ("xe_logit", "softmax_logit", {"smoothing": 0.2}),
    ("bpr-max", "elu-0.5", {"bpreg": 1.0}),
    ("bpr-max", "linear", {"bpreg": 0.0}),
    ("bpr-max", "elu-1", {"bpreg": 1.95}),
    ("bpr-max", "relu", {"bpreg": 0.5}),
    ("bpr-max", "tanh", {"bpreg": 1.0}),
    ("top1-max", "linear", {}),
    ("top1-max", "tanh", {}),
    ("top1-max", "selu-1.05-1.6", {}),
    ("bpr", "linear", {}),
    ("bpr", "leaky-0.1", {}),
    ("top1", "linear", {}),
    ("top1", "selu-1.05-1.6", {}),
]
VARIANT_IDS = [f"{loss}-{a}-{'-'.join(f'{k}{v}' for k, v in kw.items())}" for loss, a, kw in LOSS_VARIANTS]


@pytest.mark.parametrize("loss,final_act,kw", LOSS_VARIANTS, ids=VARIANT_IDS)
def test_loss_function_masked_matches_reference(loss: str, final_act: str, kw: dict) -> None:
    """make_loss on a fixed B×(B+S) matrix with inactive rows equals the reference on the
    compacted (shrunk) matrix: inactive rows and their target columns vanish."""
    rng = np.random.default_rng(9)
    Bq, Sq = 5, 4
    raw = rng.normal(scale=1.5, size=(Bq, Bq + Sq))
    active = np.array([1, 0, 1, 1, 0], dtype=bool)
    cfg = Config(loss=loss, final_act=final_act, batch_size=Bq, **kw)
    fn = make_loss(cfg)
    col_valid = torch.from_numpy(np.concatenate([active, np.ones(Sq, bool)]).astype(np.float64))
    row_valid = torch.from_numpy(active.astype(np.float64))
    got = fn(torch.from_numpy(raw.copy()), col_valid, row_valid, torch.tensor(float(active.sum() + Sq), dtype=torch.float64))
    keep_cols = np.concatenate([np.flatnonzero(active), Bq + np.arange(Sq)])
    compact = raw[np.flatnonzero(active)][:, keep_cols]
    r = ref.apply_final_act(final_act, compact)
    expected = ref.loss_per_row(loss, r, kw.get("smoothing", 0.0), kw.get("bpreg", 1.0)).sum() / Bq
    assert float(got) == pytest.approx(expected, rel=1e-10, abs=1e-13)


# ------------------------------------------------------------------ the full step: loss and hidden states

@pytest.mark.parametrize("logq", [0.0, 1.0])
@pytest.mark.parametrize("mode,layers", [("none", (5,)), ("separate", (5,)), ("shared", (5,)),
                                         ("none", (4, 5)), ("separate", (5, 4)), ("shared", (4, 5))])
@pytest.mark.parametrize("loss,final_act,kw", LOSS_VARIANTS, ids=VARIANT_IDS)
def test_step_loss_and_hidden(loss: str, final_act: str, kw: dict, mode: str, layers: tuple[int, ...], logq: float,
                              device: str = "cpu") -> None:
    params, hidden = start(mode, layers, seed=len(layers))
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, logq=logq, sample_alpha=0.3, **kw)
    trainer = make_trainer(cfg, params, hidden, device=device)
    res = ref_forward(params, hidden, STEPS[0], ref_config(cfg))
    got = engine_step(trainer, STEPS[0])
    assert got == pytest.approx(res.loss, rel=1e-10, abs=1e-13)
    for h, rh in zip(trainer.hidden, res.hidden):
        np.testing.assert_allclose(h.cpu().numpy()[res.active_idx], rh, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("loss,final_act", [("cross-entropy", "softmax"), ("bpr-max", "elu-0.5"), ("top1", "linear")])
def test_step_without_samples(loss: str, final_act: str) -> None:
    """n_sample = 0: only the in-batch targets are candidates (M × M scores), at the tail too."""
    mode, layers = "separate", (5,)
    params, hidden = start(mode, layers, seed=6)
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, n_sample=0, logq=1.0, momentum=0.2)
    trainer = make_trainer(cfg, params, hidden)
    rcfg, ocfg = ref_config(cfg), opt_config(cfg)
    state = ref.OptState.zeros(params)
    hidden = [h.copy() for h in hidden]
    for t, base in enumerate(STEPS):
        step = dict(base, samples=[])
        res, params, state, rows = ref_train_step(params, hidden, state, step, rcfg, ocfg)
        assert res.scores.shape == (len(res.active_idx),) * 2
        loss_value = trainer.train_step(torch.tensor(step["inp"]), torch.tensor(step["tgt"]),
                                        torch.tensor(step["active"], dtype=torch.float64),
                                        keep_of(torch.tensor(step["reset"], dtype=torch.float64)), None)
        assert float(loss_value) == pytest.approx(res.loss, rel=1e-9), f"loss at step {t + 1}"
        got = net_to_params(trainer.net)
        for k in params:
            np.testing.assert_allclose(got[k], params[k], rtol=1e-7, atol=1e-8, err_msg=f"{k} after step {t + 1}")


@pytest.mark.parametrize("loss,final_act,kw", LOSS_VARIANTS, ids=VARIANT_IDS)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_step_loss_and_hidden_cuda(loss: str, final_act: str, kw: dict) -> None:
    """The same contract on a GPU (two layers, shared and none modes, logQ on)."""
    for mode in ("shared", "none"):
        test_step_loss_and_hidden(loss, final_act, kw, mode, (4, 5), 1.0, device="cuda")


def test_logq_split_uses_current_batch() -> None:
    """At the tail (M = 2 of B = 4) the in-batch/sample logQ split is at column M, not B: a
    reference that splits at B gives a different loss, the engine must give the right one."""
    mode, layers = "shared", (5,)
    params, hidden = start(mode, layers, seed=3)
    cfg = make_config(mode, layers, loss="cross-entropy", logq=1.0, sample_alpha=0.0)
    trainer = make_trainer(cfg, params, hidden)
    step = STEPS[2]
    res = ref_forward(params, hidden, step, ref_config(cfg))
    got = engine_step(trainer, step)
    assert got == pytest.approx(res.loss, rel=1e-10)
    # sanity of the test's power: with alpha 0 the samples get no correction, so moving the
    # split changes the loss noticeably
    M = len(res.active_idx)
    logs = np.log(SUPPORT[res.cols].astype(float))
    wrong_corr = np.concatenate([logs[:B], 0 * logs[B:]])[: M + S] if M + S >= B else None
    assert wrong_corr is not None
    wrong = ref.loss_per_row("cross-entropy", ref.softmax(res.scores - wrong_corr)).sum() / B
    assert abs(wrong - res.loss) > 1e-3


# ------------------------------------------------------------------ the full step: parameter and state updates

UPDATE_CASES = [
    # (mode, layers, loss, final_act, loss kw, optimiser kw)
    ("shared", (5,), "cross-entropy", "softmax", {"logq": 1.0}, {"momentum": 0.0}),
    ("shared", (4, 5), "cross-entropy", "softmax", {"logq": 1.0, "smoothing": 0.1}, {"momentum": 0.3, "lmbd": 0.01}),
    ("separate", (5,), "bpr-max", "elu-0.5", {"bpreg": 1.5}, {"momentum": 0.4}),
    ("separate", (5, 4), "xe_logit", "softmax_logit", {}, {"momentum": 0.2, "lmbd": 0.02, "grad_cap": 0.3}),
    ("none", (5,), "bpr-max", "elu-1", {"bpreg": 0.5, "logq": 1.0}, {"momentum": 0.5, "lmbd": 0.05}),
    ("none", (4, 5), "top1-max", "linear", {}, {"momentum": 0.0, "lmbd": 0.03, "grad_cap": 0.2}),
    ("shared", (5,), "bpr", "linear", {}, {"adapt": "rmsprop", "adapt_params": (0.8,), "momentum": 0.1}),
    ("none", (5,), "top1", "linear", {}, {"adapt": "adam", "adapt_params": (0.9, 0.99)}),
    ("separate", (5,), "cross-entropy", "softmax", {}, {"adapt": "adadelta", "adapt_params": (0.9,)}),
    ("shared", (5,), "bpr-max", "elu-0.5", {}, {"adapt": "sgd", "momentum": 0.3, "lmbd": 0.1}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["fast", "autograd"])
@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda c: f"{c[0]}-{len(c[1])}L-{c[2]}-{'-'.join(f'{k}{v}' for k, v in c[5].items())}")
def test_three_steps_update_params_and_state(case: tuple, path: str, device: str) -> None:
    """Both training paths of the engine (the hand-written backward and the autograd one)."""
    mode, layers, loss, final_act, loss_kw, opt_kw = case
    params, hidden = start(mode, layers, seed=7)
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, learning_rate=0.1, sample_alpha=0.5,
                      **loss_kw, **opt_kw)
    trainer = make_trainer(cfg, params, hidden, device=device, reference=path == "autograd")
    rcfg, ocfg = ref_config(cfg), opt_config(cfg)
    state = ref.OptState.zeros(params)
    hidden = [h.copy() for h in hidden]
    touched: set[int] = set()
    for t, step in enumerate(STEPS):
        res, params, state, rows = ref_train_step(params, hidden, state, step, rcfg, ocfg)
        touched |= set(rows["Wy"].tolist())
        got_loss = engine_step(trainer, step)
        assert got_loss == pytest.approx(res.loss, rel=1e-9), f"loss at step {t + 1}"
        got = net_to_params(trainer.net)
        for k in params:
            np.testing.assert_allclose(got[k], params[k], rtol=1e-7, atol=1e-8, err_msg=f"{k} after step {t + 1}")
        est = engine_state(trainer)
        for k in params:
            if cfg.momentum > 0:
                np.testing.assert_allclose(est[f"{k}.vel"], state.vel[k], rtol=1e-6, atol=1e-8,
                                           err_msg=f"velocity of {k} after step {t + 1}")
            if cfg.adapt != "sgd":
                np.testing.assert_allclose(est[f"{k}.acc"], state.acc[k], rtol=1e-6, atol=1e-10,
                                           err_msg=f"accumulator of {k} after step {t + 1}")
        for h, rh in zip(trainer.hidden, hidden):
            # after step 1 the parameters already carry the finite-difference error (~1e-9)
            np.testing.assert_allclose(h.cpu().numpy()[res.active_idx], rh[res.active_idx], rtol=1e-7, atol=1e-8)
    # items never used keep their initial rows exactly (lazy sparse updates)
    untouched = sorted(set(range(N_ITEMS)) - touched)
    assert untouched  # the test data leaves some items unused
    start_params, _ = start(mode, layers, seed=7)
    got = net_to_params(trainer.net)
    np.testing.assert_array_equal(got["Wy"][untouched], start_params["Wy"][untouched])


@pytest.mark.parametrize("loss,final_act,kw", [("cross-entropy", "softmax", {"logq": 1.0}),
                                               ("bpr-max", "elu-0.5", {"bpreg": 1.0})])
def test_float32_engine_two_steps(loss: str, final_act: str, kw: dict) -> None:
    """The default float32 engine agrees with the float64 reference to float32 tolerance."""
    mode, layers = "shared", (5,)
    params, hidden = start(mode, layers, seed=8)
    cfg = make_config(mode, layers, loss=loss, final_act=final_act, momentum=0.3, learning_rate=0.05, **kw)
    trainer = make_trainer(cfg, params, hidden, dtype=torch.float32)
    assert trainer.net.Wy.dtype == torch.float32
    rcfg, ocfg = ref_config(cfg), opt_config(cfg)
    state = ref.OptState.zeros(params)
    hidden = [h.copy() for h in hidden]
    for t, step in enumerate(STEPS[:2]):
        res, params, state, rows = ref_train_step(params, hidden, state, step, rcfg, ocfg)
        # params were rounded to float32 on loading: compare loosely
        assert engine_step(trainer, step) == pytest.approx(res.loss, rel=1e-5)
        got = net_to_params(trainer.net)
        for k in params:
            np.testing.assert_allclose(got[k], params[k], rtol=1e-4, atol=2e-6, err_msg=f"{k} after step {t + 1}")


# ------------------------------------------------------------------ inactive slots carrying foreign items

@pytest.mark.parametrize("lmbd", [0.0, 0.05])
def test_inactive_slot_touches_no_row_of_its_own(lmbd: float) -> None:
    """Shrinking semantics (docs/behaviour.md §3): an inactive slot does not exist, so no row beyond those of the
    active slots and the samples may change (nor its momentum). The schedule gives the inactive
    slot the first active slot's items (tested in test_schedule); here the slot's former items,
    11 and 6 (both used in step 1, so with momentum to decay), must stay as they were."""
    mode, layers = "separate", (5,)
    params, hidden = start(mode, layers, seed=4)
    cfg = make_config(mode, layers, loss="cross-entropy", momentum=0.5, lmbd=lmbd, learning_rate=0.1)
    trainer = make_trainer(cfg, params, hidden)
    step1 = dict(inp=[11, 6, 2, 1], tgt=[4, 11, 1, 2], active=[1, 1, 1, 1], reset=[0, 0, 0, 0], samples=[6, 0, 8])
    step2 = dict(inp=[3, 5, 7, 3], tgt=[5, 3, 9, 5], active=[1, 1, 1, 0], reset=[0, 0, 0, 0], samples=[0, 8, 8])
    engine_step(trainer, step1)
    before = net_to_params(trainer.net)
    engine_step(trainer, step2)
    after = net_to_params(trainer.net)
    np.testing.assert_array_equal(after["E"][[11, 1, 2, 4]], before["E"][[11, 1, 2, 4]])
    np.testing.assert_array_equal(after["Wy"][[6, 11, 1, 2, 4]], before["Wy"][[6, 11, 1, 2, 4]])
    np.testing.assert_array_equal(after["By"][[6, 11, 1, 2, 4]], before["By"][[6, 11, 1, 2, 4]])
