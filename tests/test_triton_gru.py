"""The fused Triton kernels of one GRU layer (gru4rec/kernels/triton_gru.py) against the cell as
PyTorch code (TorchGRUCell) and against autograd. On a machine without CUDA they run on CPU
tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from gru4rec.config.activations import parse_activation  # noqa: E402
from gru4rec.kernels.triton_support import triton_unavailable  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
_why = triton_unavailable(DEVICE)
if _why is not None:
    pytest.skip(f"the Triton kernels cannot run here: {_why}", allow_module_level=True)

from gru4rec.kernels import triton_gru as tg  # noqa: E402
from gru4rec.training.cell import LayerCache, TorchGRUCell  # noqa: E402
from gru4rec.training.precision import Matmuls  # noqa: E402
from gru4rec.training.triton_ops import TritonGRUCell  # noqa: E402

ACTIVATIONS = ["linear", "relu", "tanh", "leaky-0.01", "elu-0.5", "selu-1.0507-1.6733"]
SIZES = [(3, 5), (17, 33), (64, 130), (33, 70)]  # 33 = one row past a block of 32 (and of 16)
F32 = Matmuls(None, torch.float32)


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal to float32 round-off: 1e-5 relative to the magnitude of the expected values."""
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


def _layer(B: int, n: int, seed: int, dropout: bool, scale: float = 1.0):
    """Random inputs of one layer: v (B × 3n), h, Wrz, Wh, a dropout mask (or None), d = dL/d(out)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * s).to(DEVICE)

    v, h, d = rnd(B, 3 * n, s=scale), rnd(B, n, s=0.8), rnd(B, n)
    wrz, wh = rnd(n, 2 * n, s=n ** -0.5), rnd(n, n, s=n ** -0.5)
    mask = None
    if dropout:  # as DropoutMasks._draw: keep where u ≥ p, kept values scaled by 1/(1 − p)
        p = 0.3
        mask = (torch.rand(B, n, generator=g) >= p).float().mul_(1.0 / (1.0 - p)).to(DEVICE)
    return v, h, wrz, wh, mask, d


def _forward(v, h, wrz, wh, mask, act):
    """The forward pass of the production cell, TritonGRUCell (the first layer's form: h_c = h)."""
    return TritonGRUCell(act).forward(v, h, h, wrz, wh, mask)


def _backward(d, mask, rz, c, h, hr, wh, act, g_bh):
    """TritonGRUCell.backward from that forward's cache: d_v, g_wh, g_wrz (g_bh written)."""
    n = h.shape[1]
    cache = LayerCache(x_c=h, wx=None, h=h, h_c=h, wh=wh, hr=hr, rz=rz, c=c, mask=mask)
    g_wh, g_wrz = torch.empty(n, n, device=h.device), torch.empty(n, 2 * n, device=h.device)
    d_v = TritonGRUCell(act).backward(d, cache, g_wh, g_wrz, g_bh)
    return d_v, g_wh, g_wrz


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dropout", [False, True], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("spec", ACTIVATIONS)
def test_matches_torch_cell(spec: str, dropout: bool, size: tuple[int, int]) -> None:
    B, n = size
    act = parse_activation(spec)
    v, h, wrz, wh, mask, d = _layer(B, n, seed=10 * ACTIVATIONS.index(spec) + 5 * dropout + SIZES.index(size), dropout=dropout, scale=1.5)
    cell = TorchGRUCell(act, F32)

    ref = cell.forward(v, h, h, wrz, wh, mask)
    got = _forward(v, h, wrz, wh, mask, act)
    for name, a, e in zip(("rz", "hr", "c", "out"), got, ref):
        _close(a, e, name)

    rz, hr, c, _ = ref  # the backward passes start from the same cache
    cache = LayerCache(x_c=h, wx=None, h=h, h_c=h, wh=wh, hr=hr, rz=rz, c=c, mask=mask)
    r_wh, r_wrz, r_bh = torch.empty(n, n, device=DEVICE), torch.empty(n, 2 * n, device=DEVICE), torch.empty(3 * n, device=DEVICE)
    r_dv = cell.backward(d, cache, r_wh, r_wrz, r_bh)

    flat = torch.full((3 * n + 9,), float("nan"), device=DEVICE)  # g_bh: a slice of a flat buffer
    g_bh = flat[4:4 + 3 * n]
    d_v, g_wh, g_wrz = _backward(d, mask, rz, c, h, hr, wh, act, g_bh)
    for name, a, e in (("d_v", d_v, r_dv), ("g_bh", g_bh, r_bh), ("g_wh", g_wh, r_wh), ("g_wrz", g_wrz, r_wrz)):
        _close(a, e, name)
    assert flat[:4].isnan().all() and flat[4 + 3 * n:].isnan().all(), "wrote outside g_bh"


def test_whole_layer_gradient_matches_autograd() -> None:
    """tanh layer with an input product: v = x·Wx + Bh; the gradients of Wx, Bh, Wrz, Wh and x
    from the kernels (and torch products) equal autograd's on the same forward in torch ops."""
    B, n, d_in = 19, 37, 11
    act = parse_activation("tanh")
    g = torch.Generator().manual_seed(7)
    x, wx = torch.randn(B, d_in, generator=g), torch.randn(d_in, 3 * n, generator=g) * d_in ** -0.5
    bh = torch.randn(3 * n, generator=g) * 0.1
    h = torch.randn(B, n, generator=g) * 0.8
    wrz, wh = torch.randn(n, 2 * n, generator=g) * n ** -0.5, torch.randn(n, n, generator=g) * n ** -0.5
    mask = (torch.rand(B, n, generator=g) >= 0.25).float() / 0.75
    dout = torch.randn(B, n, generator=g)
    x, wx, bh, h, wrz, wh, mask, dout = (t.to(DEVICE) for t in (x, wx, bh, h, wrz, wh, mask, dout))

    leaves = [t.clone().requires_grad_() for t in (x, wx, bh, wrz, wh)]
    ax, awx, abh, awrz, awh = leaves
    v = ax @ awx + abh
    rz = torch.sigmoid(v[:, n:] + h @ awrz)
    r, z = rz[:, :n], rz[:, n:]
    c = torch.tanh(v[:, :n] + (h * r) @ awh)
    out = (h + z * (c - h)) * mask
    (out * dout).sum().backward()

    v = x @ wx + bh
    rz, hr, c, out_k = _forward(v, h, wrz, wh, mask, act)
    _close(out_k, out.detach(), "out")
    g_bh = torch.empty(3 * n, device=DEVICE)
    d_v, g_wh, g_wrz = _backward(dout, mask, rz, c, h, hr, wh, act, g_bh)
    got = {"x": d_v @ wx.t(), "Wx": x.t() @ d_v, "Bh": g_bh, "Wrz": g_wrz, "Wh": g_wh}
    for (name, a), leaf in zip(got.items(), leaves):
        _close(a, leaf.grad, f"dL/d{name}")


def test_strided_views() -> None:
    """Column slices of wider tensors (row strides), a transposed h and a column-strided mask;
    nothing outside the views is written."""
    B, n = 9, 21
    act = parse_activation("elu-0.5")
    v, h0, wrz, wh, mask0, d0 = _layer(B, n, seed=3, dropout=True)
    cell = TorchGRUCell(act, F32)
    ref = cell.forward(v, h0, h0, wrz, wh, mask0)

    h = h0.t().contiguous().t()  # column-major
    mask = torch.zeros(B, 2 * n, device=DEVICE)[:, ::2]
    mask.copy_(mask0)
    wide = torch.full((B, 2 * n + 7), float("nan"), device=DEVICE)
    rz = wide[:, 3:3 + 2 * n]
    torch.addmm(v[:, n:], h, wrz, out=rz)
    hr_wide = torch.full((B, n + 5), float("nan"), device=DEVICE)
    hr = tg.gru_gates(rz, h, hr_wide[:, 2:2 + n])
    c_wide = torch.full((B, n + 4), float("nan"), device=DEVICE)
    c = c_wide[:, 1:1 + n]
    torch.addmm(v[:, :n], hr, wh, out=c)
    out = tg.gru_output(c, h, rz, mask, torch.empty(n, B, device=DEVICE).t(), act)
    for name, a, e in zip(("rz", "hr", "c", "out"), (rz, hr, c, out), ref):
        _close(a, e, name)
    for name, t, keep in (("rz", wide, (slice(0, 3), slice(3 + 2 * n, None))), ("hr", hr_wide, (slice(0, 2), slice(2 + n, None))),
                          ("c", c_wide, (slice(0, 1), slice(1 + n, None)))):
        assert all(t[:, s].isnan().all() for s in keep), f"wrote outside {name}"

    cache = LayerCache(x_c=h0, wx=None, h=h0, h_c=h0, wh=wh, hr=ref[1], rz=ref[0], c=ref[2], mask=mask0)
    r_bh = torch.empty(3 * n, device=DEVICE)
    r_dv = cell.backward(d0, cache, torch.empty(n, n, device=DEVICE), torch.empty(n, 2 * n, device=DEVICE), r_bh)
    d = torch.empty(n, B, device=DEVICE).t()
    d.copy_(d0)
    g_bh = torch.full((6 * n,), float("nan"), device=DEVICE)[::2]  # strided 1-D
    d_v = torch.empty(B, 3 * n, device=DEVICE)
    tg.gru_backward_out(d, mask, rz, c, h, d_v, g_bh, act)
    tg.gru_backward_reset(torch.mm(d_v[:, :n], wh.t()), h, rz, d_v, g_bh)
    _close(d_v, r_dv, "d_v")
    _close(g_bh, r_bh, "g_bh")


def test_extreme_preactivations() -> None:
    """Pre-activations from −200 to 200 and near 0: no inf or NaN, and f(u) as the torch
    activation gives it (Wh = 0, so c = f(v_c))."""
    u = torch.cat([torch.tensor([-200.0, -90.0, -30.0, -1.0, -0.5, -1e-3, -1e-7, 0.0, 1e-7, 1e-3, 0.5, 1.0, 30.0, 90.0, 200.0]),
                   torch.linspace(-3.0, 3.0, 49)])
    n = u.numel()
    B = 2
    v = u.repeat(B, 3).to(DEVICE)
    h = torch.linspace(-1, 1, B * n).reshape(B, n).to(DEVICE)
    wrz, wh = torch.zeros(n, 2 * n, device=DEVICE), torch.zeros(n, n, device=DEVICE)
    for spec in ACTIVATIONS:
        act = parse_activation(spec)
        ref = TorchGRUCell(act, F32).forward(v, h, h, wrz, wh, None)
        got = _forward(v, h, wrz, wh, None, act)
        for name, a, e in zip(("rz", "hr", "c", "out"), got, ref):
            assert torch.isfinite(a).all(), f"{spec}: {name} is not finite"
            # relative accuracy where |f(u)| is small (no cancellation in tanh, sigmoid, expm1)
            torch.testing.assert_close(
                a, e, rtol=2e-6, atol=1e-30 if name != "out" else 1e-6, msg=lambda m, spec=spec, name=name: f"{spec} {name}: {m}"
            )


def test_column_sums_are_deterministic() -> None:
    B, n = 64, 130
    act = parse_activation("tanh")
    v, h, wrz, wh, mask, d = _layer(B, n, seed=11, dropout=True)
    rz, hr, c, _ = _forward(v, h, wrz, wh, mask, act)
    runs = []
    for _ in range(2):
        g_bh = torch.empty(3 * n, device=DEVICE)
        d_v, _, _ = _backward(d, mask, rz, c, h, hr, wh, act, g_bh)
        runs.append((d_v, g_bh))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_activation_code() -> None:
    assert tg.activation_code(parse_activation("tanh")) == (tg.ACT_TANH, 0.0, 0.0)
    assert tg.activation_code(parse_activation("linear")) == (tg.ACT_LINEAR, 0.0, 0.0)
    assert tg.activation_code(parse_activation("leaky-0.25")) == (tg.ACT_LEAKY, 0.25, 0.0)
    assert tg.activation_code(parse_activation("elu-0.5")) == (tg.ACT_ELU, 0.5, 0.0)
    assert tg.activation_code(parse_activation("selu-1.5-2")) == (tg.ACT_SELU, 1.5, 2.0)

    class Duck:  # duck-typed: name and params only
        name, params = "relu", ()

    assert tg.activation_code(Duck()) == (tg.ACT_RELU, 0.0, 0.0)
    for bad in (parse_activation("softmax"), parse_activation("softmax_logit"), "tanh", None):
        with pytest.raises(ValueError, match="act"):
            tg.activation_code(bad)


def test_bad_inputs_name_the_argument() -> None:
    B, n = 4, 6
    act = parse_activation("tanh")

    def z(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=DEVICE)

    h, rz, hr, c, out, d, d_v, g_bh, mask = z(B, n), z(B, 2 * n), z(B, n), z(B, n), z(B, n), z(B, n), z(B, 3 * n), z(3 * n), z(B, n)
    cases = [
        ("h", lambda: tg.gru_gates(rz, z(B, n, dtype=torch.float64), hr)),
        ("h", lambda: tg.gru_gates(rz, z(B * n), hr)),
        ("rz", lambda: tg.gru_gates(z(B, n), h, hr)),
        ("rz", lambda: tg.gru_gates(z(B, 2 * n, dtype=torch.float16), h, hr)),
        ("hr", lambda: tg.gru_gates(rz, h, z(B + 1, n))),
        ("c", lambda: tg.gru_output(z(B, n, dtype=torch.bfloat16), h, rz, None, out, act)),
        ("mask", lambda: tg.gru_output(c, h, rz, z(B, 2 * n), out, act)),
        ("out", lambda: tg.gru_output(c, h, rz, mask, z(n, B), act)),
        ("act", lambda: tg.gru_output(c, h, rz, mask, out, parse_activation("softmax"))),
        ("act", lambda: tg.gru_output(c, h, rz, mask, out, (9, 0.0, 0.0))),
        ("d", lambda: tg.gru_backward_out(z(B, n, dtype=torch.float64), None, rz, c, h, d_v, g_bh, act)),
        ("d_v", lambda: tg.gru_backward_out(d, None, rz, c, h, z(B, 2 * n), g_bh, act)),
        ("g_bh", lambda: tg.gru_backward_out(d, None, rz, c, h, d_v, z(2 * n), act)),
        ("mask", lambda: tg.gru_backward_out(d, z(B, n, dtype=torch.int64), rz, c, h, d_v, g_bh, act)),
        ("dhr", lambda: tg.gru_backward_reset(z(B, 2 * n), h, rz, d_v, g_bh)),
        ("d_v", lambda: tg.gru_backward_reset(d, h, rz, z(B, 3 * n, dtype=torch.float64), g_bh)),
        ("g_bh", lambda: tg.gru_backward_reset(d, h, rz, d_v, z(1, 3 * n))),
        ("rz", lambda: tg.gru_backward_reset(d, h, "rz", d_v, g_bh)),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=rf"^{name} "):
            call()
