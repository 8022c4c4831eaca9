"""GRU4RecNet (docs/behaviour.md §2): per-block initialisation, forward pass against the NumPy reference,
inverted dropout with its placement, seed reproducibility, none mode with several layers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import numpy_reference as ref
from gru4rec.config import Config
from gru4rec.network.gru import GRU4RecNet

torch.set_num_threads(1)

MODES = {
    "none": dict(constrained_embedding=False, embedding=0),
    "separate": dict(constrained_embedding=False, embedding=3),
    "shared": dict(constrained_embedding=True),
}


def make_net(n_items: int, mode: str, layers: tuple[int, ...], seed: int = 0, **kw: object) -> GRU4RecNet:
    cfg = Config(layers=layers, **{**MODES[mode], **kw})
    return GRU4RecNet(n_items, cfg, generator=torch.Generator().manual_seed(seed))


def net_to_params(net: GRU4RecNet) -> ref.Params:
    """The engine's parameters as the reference's flat float64 dict."""
    p = {"Wy": net.Wy, "By": net.By}
    if net.E is not None:
        p["E"] = net.E
    for i, layer in enumerate(net.layers):
        p.update({f"Wx_{i}": layer.Wx, f"Wh_{i}": layer.Wh, f"Wrz_{i}": layer.Wrz, f"Bh_{i}": layer.Bh})
    return {k: v.detach().double().cpu().numpy().copy() for k, v in p.items()}


def load_params(net: GRU4RecNet, params: ref.Params) -> None:
    """Copy reference parameters into the engine (its dtype is kept)."""
    with torch.no_grad():  # copy_ converts dtype and device
        net.Wy.copy_(torch.from_numpy(params["Wy"]))
        net.By.copy_(torch.from_numpy(params["By"]))
        if "E" in params:
            net.E.copy_(torch.from_numpy(params["E"]))
        for i, layer in enumerate(net.layers):
            layer.Wx.copy_(torch.from_numpy(params[f"Wx_{i}"]))
            layer.Wh.copy_(torch.from_numpy(params[f"Wh_{i}"]))
            layer.Wrz.copy_(torch.from_numpy(params[f"Wrz_{i}"]))
            layer.Bh.copy_(torch.from_numpy(params[f"Bh_{i}"]))


def blocks(net: GRU4RecNet) -> list[tuple[str, np.ndarray]]:
    """Every independently initialised weight block (docs/behaviour.md §2), with a name."""
    out = [("Wy", net.Wy.detach().numpy())]
    if net.E is not None:
        out.append(("E", net.E.detach().numpy()))
    for i, layer in enumerate(net.layers):
        n = layer.Wh.shape[0]
        wx, wrz = layer.Wx.detach().numpy(), layer.Wrz.detach().numpy()
        out += [(f"Wx_{i}[{k}]", wx[:, k * n:(k + 1) * n]) for k in range(3)]
        out.append((f"Wh_{i}", layer.Wh.detach().numpy()))
        out += [(f"Wrz_{i}[{k}]", wrz[:, k * n:(k + 1) * n]) for k in range(2)]
    return out


# ------------------------------------------------------------------ initialisation

@pytest.mark.parametrize("mode", ["none", "separate", "shared"])
def test_init_uniform_per_block_bound(mode: str) -> None:
    # Shapes chosen so that the per-block bound differs clearly from a whole-matrix bound
    # (e.g. Wrz L×2L: block sqrt(6/(L+L)) vs whole sqrt(6/(L+2L))).
    net = make_net(400, mode, (30, 20), embedding=25) if mode == "separate" else make_net(400, mode, (30, 20))
    for name, w in blocks(net):
        sigma = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
        amax = float(np.abs(w).max())
        # max of n uniforms on [-σ, σ] lies above σ(1 - 20/n) with overwhelming probability
        assert amax <= sigma * (1 + 1e-6), (name, amax, sigma)
        assert amax >= sigma * (1 - 20.0 / w.size), (name, amax, sigma)
        # uniform: std σ/√3, mean 0
        assert abs(w.std() - sigma / math.sqrt(3)) < 6 * sigma / math.sqrt(w.size), name
        assert abs(w.mean()) < 6 * sigma / math.sqrt(w.size), name
    assert np.all(net.By.detach().numpy() == 0)
    for layer in net.layers:
        assert np.all(layer.Bh.detach().numpy() == 0)


def test_init_blocks_are_independent() -> None:
    net = make_net(50, "shared", (40,))
    wx = net.layers[0].Wx.detach().numpy()
    # three blocks of the same shape: drawn independently, so not equal and uncorrelated
    a, b = wx[:, :40].ravel(), wx[:, 40:80].ravel()
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.1


def test_init_fixed_sigma() -> None:
    net = make_net(300, "separate", (20, 10), sigma=0.05, embedding=8)
    for name, w in blocks(net):
        amax = float(np.abs(w).max())
        assert 0.05 * (1 - 20.0 / w.size) <= amax <= 0.05 * (1 + 1e-6), (name, amax)


def test_init_as_normal() -> None:
    net = make_net(2000, "shared", (40,), init_as_normal=True)
    for name, w in blocks(net):
        sigma = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
        assert abs(w.std() / sigma - 1) < 6 / math.sqrt(2 * w.size), (name, w.std(), sigma)
        # a normal draw exceeds σ in ~32 % of the entries (a uniform never does)
        frac = float((np.abs(w) > sigma).mean())
        assert abs(frac - 0.3173) < 6 * math.sqrt(0.32 * 0.68 / w.size) + 1e-9, (name, frac)
    net2 = make_net(500, "none", (10,), init_as_normal=True, sigma=0.3)
    for name, w in blocks(net2):
        assert abs(w.std() / 0.3 - 1) < 6 / math.sqrt(2 * w.size), (name, w.std())


def test_seed_reproducibility() -> None:
    a = net_to_params(make_net(30, "separate", (6, 5), seed=7, embedding=4))
    b = net_to_params(make_net(30, "separate", (6, 5), seed=7, embedding=4))
    c = net_to_params(make_net(30, "separate", (6, 5), seed=8, embedding=4))
    for k in a:
        if k.startswith("B"):
            continue
        np.testing.assert_array_equal(a[k], b[k])
        assert not np.array_equal(a[k], c[k]), k


# ------------------------------------------------------------------ forward vs reference

FORWARD_CASES = [
    ("none", (5,), "tanh"), ("none", (5, 4), "relu"), ("none", (4, 3, 5), "tanh"),
    ("separate", (5,), "elu-0.7"), ("separate", (4, 6), "tanh"),
    ("shared", (5,), "leaky-0.2"), ("shared", (3, 5), "selu-1.05-1.6"), ("shared", (4,), "linear"),
]


@pytest.mark.parametrize("mode,layers,hidden_act", FORWARD_CASES)
def test_step_matches_reference(mode: str, layers: tuple[int, ...], hidden_act: str) -> None:
    n_items = 11
    rng = np.random.default_rng(3)
    net = make_net(n_items, mode, layers, hidden_act=hidden_act).double().eval()
    params = ref.init_params(n_items, layers, mode, embedding=3, rng=rng)
    load_params(net, params)
    cfg = ref.RefConfig(layers=layers, mode=mode, hidden_act=hidden_act)
    B = 4
    hidden_np = [rng.uniform(-1, 1, (B, n)) for n in layers]
    hidden = [torch.from_numpy(h.copy()) for h in hidden_np]
    items = np.array([2, 7, 2, 10])
    with torch.no_grad():
        out = net.step(torch.from_numpy(items), hidden)
        scores = net.score_all(out)
    ref_out, ref_h = ref.gru_forward(params, hidden_np, items, cfg)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-10, atol=1e-12)
    for h, rh in zip(hidden, ref_h):
        np.testing.assert_allclose(h.numpy(), rh, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(scores.numpy(), ref_out @ params["Wy"].T + params["By"], rtol=1e-10, atol=1e-12)


def test_none_mode_three_layers_sequence() -> None:
    """Several steps in none mode with three layers (the official port crashes here)."""
    n_items = 9
    layers = (6, 4, 5)
    rng = np.random.default_rng(5)
    net = make_net(n_items, "none", layers).double().eval()
    params = net_to_params(net)
    assert params["Wx_0"].shape == (n_items, 18) and params["Wx_1"].shape == (6, 12)
    cfg = ref.RefConfig(layers=layers, mode="none")
    hidden = net.init_hidden(3)
    hidden_np = [np.zeros((3, n)) for n in layers]
    for _ in range(4):
        items = rng.integers(0, n_items, 3)
        with torch.no_grad():
            out = net.step(torch.from_numpy(items), hidden)
        ref_out, hidden_np = ref.gru_forward(params, hidden_np, items, cfg)
        np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-10, atol=1e-12)
    assert [tuple(h.shape) for h in hidden] == [(3, 6), (3, 4), (3, 5)]


def test_init_hidden_zero() -> None:
    net = make_net(5, "shared", (3, 2))
    hs = net.init_hidden(4)
    assert [tuple(h.shape) for h in hs] == [(4, 3), (4, 2)]
    assert all(float(h.abs().sum()) == 0 for h in hs)


# ------------------------------------------------------------------ dropout

def _identity_candidate_net(mode: str, L: int, p_embed: float, p_hidden: float, n_items: int = 50,
                            n_layers: int = 1) -> GRU4RecNet:
    """A net whose first layer outputs its input exactly (update gate 1, linear identity candidate),
    so the dropout masks are visible in the output."""
    net = make_net(n_items, mode, (L,) * n_layers, hidden_act="linear", dropout_p_embed=p_embed,
                   dropout_p_hidden=p_hidden, **({"embedding": L} if mode == "separate" else {})).double()
    with torch.no_grad():
        for layer in net.layers:
            layer.Wx.zero_()
            layer.Wrz.zero_()
            layer.Wh.zero_()
            layer.Bh.zero_()
            layer.Bh[2 * L:] = 60.0  # z = sigmoid(60) = 1 in float64 up to 1e-26
            if not (mode == "none" and layer is net.layers[0]):
                layer.Wx[:, :L] = torch.eye(L, dtype=torch.float64)
        if mode == "none":
            net.layers[0].Wx[:, :L] = torch.rand(n_items, L, dtype=torch.float64) + 0.5
        net.Wy.copy_(torch.rand_like(net.Wy) + 0.5)  # strictly positive inputs
        if net.E is not None:
            net.E.copy_(torch.rand_like(net.E) + 0.5)
    return net


@pytest.mark.parametrize("mode", ["separate", "shared"])
def test_embedding_dropout_inverted(mode: str) -> None:
    torch.manual_seed(0)
    p, L, B = 0.3, 40, 200
    net = _identity_candidate_net(mode, L, p_embed=p, p_hidden=0.0)
    items = torch.randint(0, 50, (B,))
    net.eval()
    with torch.no_grad():
        clean = net.step(items, net.init_hidden(B)).numpy()
    net.train()
    with torch.no_grad():
        dropped = net.step(items, net.init_hidden(B)).numpy()
    zero = dropped == 0
    frac = zero.mean()
    assert abs(frac - p) < 6 * math.sqrt(p * (1 - p) / zero.size), frac
    # kept entries are scaled by 1/(1-p): the expectation is preserved
    np.testing.assert_allclose(dropped[~zero], clean[~zero] / (1 - p), rtol=1e-12)


def test_no_embedding_dropout_in_none_mode() -> None:
    net = _identity_candidate_net("none", 8, p_embed=0.5, p_hidden=0.0)
    items = torch.arange(20)
    net.eval()
    with torch.no_grad():
        clean = net.step(items, net.init_hidden(20))
    net.train()
    with torch.no_grad():
        trained = net.step(items, net.init_hidden(20))
    torch.testing.assert_close(trained, clean, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["none", "shared"])
def test_hidden_dropout_every_layer_and_carried_state(mode: str) -> None:
    """Hidden dropout hits every layer's output (layer 0 too in none mode); the dropped output is
    the next layer's input and the state carried to the next step."""
    torch.manual_seed(1)
    p, L, B = 0.25, 30, 100
    net = _identity_candidate_net(mode, L, p_embed=0.0, p_hidden=p, n_layers=2)
    items = torch.randint(0, 50, (B,))
    net.eval()
    with torch.no_grad():
        clean0 = net.step(items, net.init_hidden(B)).numpy()  # identity layers: = layer-0 input
    net.train()
    hidden = net.init_hidden(B)
    with torch.no_grad():
        out = net.step(items, hidden).numpy()
    h0, h1 = hidden[0].numpy(), hidden[1].numpy()
    keep0 = h0 != 0
    assert abs((~keep0).mean() - p) < 6 * math.sqrt(p * (1 - p) / h0.size)
    np.testing.assert_allclose(h0[keep0], clean0[keep0] / (1 - p), rtol=1e-12)
    # layer 1 is the identity of its (dropped) input, then dropped again
    keep1 = h1 != 0
    assert np.all(~keep1 | keep0)  # whatever layer 0 dropped stays 0
    np.testing.assert_allclose(h1[keep1], h0[keep1] / (1 - p), rtol=1e-12)
    frac1 = (~keep1 & keep0).sum() / keep0.sum()
    assert abs(frac1 - p) < 6 * math.sqrt(p * (1 - p) / keep0.sum())
    np.testing.assert_array_equal(out, h1)


# ------------------------------------------------------------------ seed: whole training runs

def _tiny_events(seed: int = 0):
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    t = 0
    for s in range(60):
        for _ in range(int(rng.integers(1, 7))):
            rows.append((s, int(rng.zipf(1.5) % 30), t))
            t += 1
    return pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"])


def _fit(seed: int) -> tuple[list[float], dict[str, np.ndarray]]:
    from gru4rec.recommender import GRU4Rec

    model = GRU4Rec(Config(layers=(8,), batch_size=6, n_sample=5, sample_store_size=40, n_epochs=2, seed=seed,
                           dropout_p_embed=0.2, dropout_p_hidden=0.3, momentum=0.2, train_random_order=True),
                    device="cpu")
    model.fit(_tiny_events(), progress=False)
    return [h.loss for h in model.history], {k: v.detach().numpy().copy() for k, v in model.net.state_dict().items()}


def test_seed_reproducible_training() -> None:
    """Same seed: identical epoch losses and weights (init, sampling, dropout, session order);
    another seed: different ones."""
    loss_a, w_a = _fit(11)
    loss_b, w_b = _fit(11)
    loss_c, w_c = _fit(12)
    assert len(loss_a) == 2 and all(np.isfinite(loss_a))
    assert loss_a == loss_b
    for k in w_a:
        np.testing.assert_array_equal(w_a[k], w_b[k], err_msg=k)
    assert loss_a != loss_c
    assert not np.array_equal(w_a["Wy"], w_c["Wy"])


# ------------------------------------------------------------------ dropout inside the training step

def _dropout_trainer(mode: str, layers: tuple[int, ...], p_embed: float, p_hidden: float, n_items: int, batch: int):
    from gru4rec.training.trainer import Trainer

    cfg = Config(layers=layers, batch_size=batch, n_sample=4, sample_store_size=40, dropout_p_embed=p_embed,
                 dropout_p_hidden=p_hidden, loss="cross-entropy", seed=3, **MODES[mode])
    net = GRU4RecNet(n_items, cfg).double()
    params = ref.init_params(n_items, layers, mode, rng=np.random.default_rng(2))
    load_params(net, params)
    support = np.arange(1, n_items + 1, dtype=np.int64)
    return cfg, net, params, Trainer(net, cfg, support)


def _run(trainer, inp: np.ndarray, tgt: np.ndarray, samples: np.ndarray) -> float:
    ones = torch.ones(len(inp), dtype=torch.float64)
    reset_all = torch.zeros(len(inp), 1, dtype=torch.float64)  # keep = 0: every slot starts afresh
    return float(trainer.train_step(torch.from_numpy(inp), torch.from_numpy(tgt), ones, reset_all, torch.from_numpy(samples)))


def _ref_loss(params: ref.Params, out: np.ndarray, tgt: np.ndarray, samples: np.ndarray, batch: int) -> float:
    cols = np.concatenate([tgt, samples])
    r = ref.softmax(out @ params["Wy"][cols].T + params["By"][cols])
    return float(ref.loss_per_row("cross-entropy", r).sum() / batch)


def test_training_step_hidden_dropout() -> None:
    """In the step, every layer's output (layer 0 too in none mode) is dropped with inverted
    scaling; the dropped output feeds the next layer, is the carried state and is scored."""
    p, layers, n_items, batch = 0.3, (16, 12), 40, 64
    cfg, net, params, trainer = _dropout_trainer("none", layers, 0.0, p, n_items, batch)
    rng = np.random.default_rng(4)
    inp, tgt, samples = rng.integers(0, n_items, batch), rng.integers(0, n_items, batch), rng.integers(0, n_items, 4)
    loss = _run(trainer, inp, tgt, samples)
    zeros = [np.zeros((batch, n)) for n in layers]
    clean0 = ref.gru_layer(None, zeros[0], params["Wx_0"], params["Wh_0"], params["Wrz_0"], params["Bh_0"], "tanh",
                           onehot_rows=inp)
    h0 = trainer.hidden[0].numpy()
    keep0 = h0 != 0
    assert abs((~keep0).mean() - p) < 6 * math.sqrt(p * (1 - p) / h0.size)
    np.testing.assert_allclose(h0[keep0], clean0[keep0] / (1 - p), rtol=1e-12)
    clean1 = ref.gru_layer(h0, zeros[1], params["Wx_1"], params["Wh_1"], params["Wrz_1"], params["Bh_1"], "tanh")
    h1 = trainer.hidden[1].numpy()
    keep1 = h1 != 0
    assert abs((~keep1).mean() - p) < 6 * math.sqrt(p * (1 - p) / h1.size)
    np.testing.assert_allclose(h1[keep1], clean1[keep1] / (1 - p), rtol=1e-10)
    assert loss == pytest.approx(_ref_loss(params, h1, tgt, samples, batch), rel=1e-10)


@pytest.mark.parametrize("mode", ["separate", "shared"])
def test_training_step_embedding_dropout(mode: str) -> None:
    """Embedding dropout acts on the layer-0 input rows (inverted): with a layer that passes its
    input through unchanged, the carried state is the dropped embedding."""
    from gru4rec.training.trainer import Trainer

    p, L, n_items, batch = 0.4, 16, 30, 64
    cfg = Config(layers=(L,), batch_size=batch, n_sample=4, sample_store_size=40, dropout_p_embed=p,
                 hidden_act="linear", seed=3, **{**MODES[mode], **({"embedding": L} if mode == "separate" else {})})
    net = GRU4RecNet(n_items, cfg).double()
    load_params(net, ref.init_params(n_items, (L,), mode, embedding=L, rng=np.random.default_rng(2)))
    with torch.no_grad():  # identity layer: z = 1, candidate = input (linear activation)
        layer = net.layers[0]
        layer.Wx.zero_()
        layer.Wx[:, :L] = torch.eye(L, dtype=torch.float64)
        layer.Wrz.zero_()
        layer.Wh.zero_()
        layer.Bh.zero_()
        layer.Bh[2 * L:] = 60.0
    params = net_to_params(net)
    trainer = Trainer(net, cfg, np.arange(1, n_items + 1, dtype=np.int64))
    rng = np.random.default_rng(5)
    inp, tgt, samples = rng.integers(0, n_items, batch), rng.integers(0, n_items, batch), rng.integers(0, n_items, 4)
    loss = _run(trainer, inp, tgt, samples)
    clean = (params["E"] if mode == "separate" else params["Wy"])[inp]
    h = trainer.hidden[0].numpy()
    keep = h != 0
    assert abs((~keep).mean() - p) < 6 * math.sqrt(p * (1 - p) / h.size)
    np.testing.assert_allclose(h[keep], clean[keep] / (1 - p), rtol=1e-12)
    assert loss == pytest.approx(_ref_loss(params, h, tgt, samples, batch), rel=1e-10)
