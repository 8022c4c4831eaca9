"""The fused CPU kernels (gru4rec/kernels/cpu_kernels.c) against the PyTorch code they replace: every
optimiser method's update, making rows unique, summing score columns per item, whole training
epochs; their argument checks; building, caching and falling back when they cannot be built."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gru4rec.config import Config
from gru4rec.kernels import build as kernel_build
from gru4rec.kernels import cpu as cpu_ops
from gru4rec.training.backend import select_backend
from gru4rec.training.optim import Optimizer
from test_optim import METHODS

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kernels() -> cpu_ops.CpuKernels:
    k = cpu_ops.cpu_kernels()
    if k is None:
        pytest.skip("the fused CPU kernels cannot be built here (no working C compiler, or GRU4REC_CPU_KERNELS=0)")
    return k


def _tables(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"A": rng.normal(size=(7, 5)), "b": rng.normal(size=9), "W": rng.normal(size=(40, 6)), "By": rng.normal(size=40)}


@pytest.mark.parametrize("kw", METHODS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_fused_update_equals_pytorch_update(kernels, kw: dict) -> None:
    """Three steps of every method (momentum, L2, grad_cap) on float32 tables, rows repeated
    within a step and some never used: parameters and state as the PyTorch code leaves them."""
    cfg = Config(learning_rate=0.07, **kw)
    start = _tables(5)
    runs = {}
    for fused in (True, False):
        tp = {k: nn.Parameter(torch.tensor(v, dtype=torch.float32)) for k, v in start.items()}
        opt = Optimizer({"A": tp["A"], "b": tp["b"]}, {"W": tp["W"], "By": tp["By"]}, cfg, select_backend("cpu", cpu_kernels=fused))
        assert (opt.kernels is not None) == fused
        rng = np.random.default_rng(6)
        for rows in ([3, 17, 3, 3, 0, 39], [17, 25], list(range(0, 40, 3)) * 2):
            dense = [torch.tensor(rng.normal(size=start[k].shape), dtype=torch.float32) for k in ("A", "b")]
            idx = torch.tensor(rows)
            sparse = {k: (idx, torch.tensor(rng.normal(size=(len(rows),) + start[k].shape[1:]), dtype=torch.float32)) for k in ("W", "By")}
            with torch.no_grad():
                opt.step(dense, sparse)
        runs[fused] = ({k: p.detach().clone() for k, p in tp.items()}, {k: v.clone() for k, v in opt.state_dict().items()})
    (p_fused, s_fused), (p_torch, s_torch) = runs[True], runs[False]
    for k in p_torch:
        assert not torch.equal(p_torch[k], torch.tensor(start[k], dtype=torch.float32)), (
            f"{k} never changed: the test would not see an error"
        )
        torch.testing.assert_close(p_fused[k], p_torch[k], rtol=2e-6, atol=1e-7, msg=lambda m, k=k: f"{k}: {m}")
    assert s_fused.keys() == s_torch.keys()
    for k in s_torch:
        torch.testing.assert_close(s_fused[k], s_torch[k], rtol=2e-6, atol=1e-7, msg=lambda m, k=k: f"state {k}: {m}")
    untouched = [r for r in range(40) if r not in {3, 17, 0, 39, 25, *range(0, 40, 3)}]
    assert torch.equal(p_fused["W"][untouched], torch.tensor(start["W"], dtype=torch.float32)[untouched])


def test_dense_update_by_hand(kernels) -> None:
    """Adagrad with momentum on a whole table, one element worked out by hand."""
    p, acc, vel = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0]), torch.tensor([0.1, 0.0])
    update = kernels.table_update(p, {"acc": acc, "vel": vel}, method="adagrad", lr=0.2, momentum=0.5, lmbd=0.0)
    update(None, torch.tensor([1.0, 0.0]))
    # acc = 0.5 + 1 = 1.5; vel = 0.5·0.1 − 0.2·1/sqrt(1.5 + 1e-6); p = 1 + vel
    v = 0.05 - 0.2 / np.sqrt(1.5 + 1e-6)
    np.testing.assert_allclose(acc.numpy(), [1.5, 0.0])
    np.testing.assert_allclose(vel.numpy(), [v, 0.0], rtol=1e-6)
    np.testing.assert_allclose(p.numpy(), [1.0 + v, -2.0], rtol=1e-6)


def test_large_update_uses_threads_and_agrees(kernels) -> None:
    """Tables large enough for the threaded loops (when torch has more than one thread)."""
    rng = np.random.default_rng(0)
    cfg = Config(learning_rate=0.1, momentum=0.3, adapt="adagrad")
    w0 = torch.tensor(rng.normal(size=(3000, 64)), dtype=torch.float32)
    rows = torch.tensor(rng.choice(3000, size=1500, replace=False))
    g_rows = torch.tensor(rng.normal(size=(1500, 64)), dtype=torch.float32)
    g_dense = torch.tensor(rng.normal(size=50_000), dtype=torch.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = []
        for fused in (True, False):
            W, D = nn.Parameter(w0.clone()), nn.Parameter(torch.zeros(50_000))
            opt = Optimizer({"D": D}, {"W": W}, cfg, select_backend("cpu", cpu_kernels=fused))
            with torch.no_grad():
                opt.step([g_dense.clone()], {"W": (rows, g_rows.clone())})
            out.append((W.detach(), D.detach()))
    finally:
        torch.set_num_threads(before)
    assert not torch.equal(out[0][0], w0)
    torch.testing.assert_close(out[0][0], out[1][0], rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("method", ["adagrad", "adam"])
def test_tables_update_equals_one_update_per_table(kernels, method: str, threads: int) -> None:
    """Several tables in one call (the optimiser's step: the dense buffer whole, item tables at
    their rows, one of them too small to be split on its own) leave every table and state
    bit for bit as one call per table does."""
    rng = np.random.default_rng(3)
    start = {"dense": rng.normal(size=40_000), "W": rng.normal(size=(500, 48)), "By": rng.normal(size=500)}
    rows = torch.tensor(rng.choice(500, size=300, replace=False))
    grads = {"dense": (None, rng.normal(size=40_000)), "W": (rows, rng.normal(size=(300, 48))), "By": (rows, rng.normal(size=300))}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = []
        for grouped in (True, False):
            tables = {k: torch.tensor(v, dtype=torch.float32) for k, v in start.items()}
            states = {k: {"acc": torch.full_like(t, 0.5), "m": torch.full_like(t, 0.1), "vel": torch.full_like(t, -0.2)}
                      for k, t in tables.items()}
            updates = {k: kernels.table_update(t, states[k], method=method, lr=0.1, momentum=0.3, lmbd=0.01, decay=0.9, beta1=0.8)
                       for k, t in tables.items()}
            g = {k: (r, torch.tensor(v, dtype=torch.float32)) for k, (r, v) in grads.items()}
            if grouped:
                kernels.tables_update(updates)(g, 0.2, 0.1)
            else:
                for k, (r, gk) in g.items():
                    updates[k](r, gk, 0.2, 0.1)
            out.append((tables, states))
    finally:
        torch.set_num_threads(before)
    (t_group, s_group), (t_each, s_each) = out
    for k in start:
        assert not torch.equal(t_each[k], torch.tensor(start[k], dtype=torch.float32))
        assert torch.equal(t_group[k], t_each[k]), k
        for key in ("acc", "m", "vel"):
            assert torch.equal(s_group[k][key], s_each[k][key]), (k, key)


def test_dropout_masks_equal_pytorch_masks_bit_for_bit(kernels) -> None:
    """The fused threshold is keep_masks exactly: the factor 1/(1 − p) as float32, u = p kept,
    both sides of the split with their own p (and a split at either end)."""
    from gru4rec.training.dropout import keep_masks

    u = torch.rand(10_001, generator=torch.Generator().manual_seed(1))
    u[[3, 7000]] = torch.tensor([0.3, 0.45])  # exactly p: kept (u ≥ p)
    for split, p_first, p_rest in ((4000, 0.3, 0.45), (0, 0.9, 0.2), (10_001, 0.1, 0.0), (5, 0.0, 0.7)):
        got, want = u.clone(), u.clone()
        kernels.dropout_masks(got, split, p_first, p_rest)
        keep_masks(want, split, p_first, p_rest)
        assert torch.equal(got, want), (split, p_first, p_rest)
    got = u.clone()
    kernels.dropout_masks(got, 4000, 0.3, 0.45)
    keep_first = float(np.float32(1 / 0.7))
    assert got[3] == keep_first and got[7000] == np.float32(1 / 0.55) and set(got[:4000].unique().tolist()) == {0.0, keep_first}


@pytest.mark.parametrize("seed", [0, 7, 2**32 + 5])
def test_the_uniform_kernel_gives_torch_rands_draws_and_leaves_its_state(kernels, seed: int) -> None:
    """g4r_mt19937_uniform against torch.rand on a twin generator: draws of every length around
    the state's 624-output twists, interleaved with torch's own draws (rand, randn, randint) on
    the same generator, equal bit for bit, and the generators' whole states equal after each."""
    ours, twin = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for n in (0, 1, 622, 1, 624, 625, 1247, 3, 131_072, 10):
        got, want = torch.full((n,), -1.0), torch.empty(n)
        kernels.torch_rand(got, ours)
        torch.rand(n, generator=twin, out=want)
        assert torch.equal(got, want), n
        assert torch.equal(ours.get_state(), twin.get_state()), n
        for g in (ours, twin):  # torch's own draws on the same generators between the kernel's
            torch.randn(3, generator=g)
            torch.randint(0, 5, (2,), generator=g)
            torch.rand(5, generator=g)
    assert torch.equal(ours.get_state(), twin.get_state())


def test_the_dropout_draws_fall_back_to_torch_where_the_kernel_does_not_match(kernels) -> None:
    """The kernel's draws are used only after they matched torch.rand once; a kernel that does not
    (a stand-in writing zeros) is not, and the masks' draws are torch.rand's either way."""
    from gru4rec.kernels.cpu import TorchRand
    from gru4rec.training.ops import CpuKernelOps

    assert kernels.torch_rand.matches_torch()
    wrong = TorchRand(lambda state, n, out: ctypes.memset(out, 0, 4 * n))
    assert not wrong.matches_torch()
    ops = CpuKernelOps(kernels)
    for rand in (kernels.torch_rand, wrong):
        ops.kernels = types.SimpleNamespace(torch_rand=rand)
        got, want = torch.empty(2000), torch.empty(2000)
        ops.dropout_uniform(got, torch.Generator().manual_seed(3))
        torch.rand(2000, generator=torch.Generator().manual_seed(3), out=want)
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="float32"):
        kernels.torch_rand(torch.empty(4, dtype=torch.float64), torch.Generator())


def test_unique_equals_torch_unique(kernels) -> None:
    rng = np.random.default_rng(2)
    n_items = 500
    mark = torch.zeros(n_items, dtype=torch.uint8)
    slot = torch.zeros(n_items, dtype=torch.int64)
    for n in (1, 7, 300, 2000):
        rows = torch.tensor(rng.integers(0, n_items, size=n))
        uniq, inverse = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        k, k_first = kernels.unique(rows, mark, slot, uniq, inverse)
        want, want_inverse = torch.unique(rows, return_inverse=True)
        assert k == k_first == want.numel()
        assert torch.equal(uniq[:k], want) and torch.equal(inverse, want_inverse)
        assert int(mark.sum()) == 0
        # grouped: the first n_first positions' values first (ascending), then the others' in
        # order of appearance; slot holds stale entries from the calls before
        n_first = n // 2
        k, k_first = kernels.unique(rows, mark, slot, uniq, inverse, n_first)
        head = torch.unique(rows[:n_first])
        seen, tail = set(head.tolist()), []
        for v in rows[n_first:].tolist():
            if v not in seen:
                seen.add(v)
                tail.append(v)
        assert k_first == head.numel() and uniq[:k].tolist() == head.tolist() + tail
        assert torch.equal(uniq[inverse], rows) and int(mark.sum()) == 0


def test_grouped_unique_by_hand(kernels) -> None:
    mark, slot = torch.zeros(10, dtype=torch.uint8), torch.zeros(10, dtype=torch.int64)
    rows = torch.tensor([7, 2, 7, 9, 2, 0, 9, 5, 0])
    uniq, inverse = torch.empty(9, dtype=torch.int64), torch.empty(9, dtype=torch.int64)
    assert kernels.unique(rows, mark, slot, uniq, inverse, 4) == (5, 3)
    assert uniq[:5].tolist() == [2, 7, 9, 0, 5] and inverse.tolist() == [1, 0, 1, 2, 0, 3, 2, 4, 3]
    with pytest.raises(ValueError, match="n_first"):
        kernels.unique(rows, mark, slot, uniq, inverse, 10)


def test_sum_columns_equals_index_add(kernels) -> None:
    rng = np.random.default_rng(3)
    g = torch.tensor(rng.normal(size=(33, 250)), dtype=torch.float32)
    group = torch.tensor(rng.integers(0, 90, size=250))
    want = torch.zeros(33, 90).index_add_(1, group, g)
    got = kernels.sum_columns(g, group, 90)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[:, 89] == 0, want[:, 89] == 0)
    # each sum in column order, to the bit: float32 additions column after column from 0
    exact = np.zeros((33, 95), dtype=np.float32)
    for j, u in enumerate(group.tolist()):
        exact[:, u] += g[:, j].numpy()
    assert torch.equal(kernels.sum_columns(g, group, 95), torch.from_numpy(exact))  # groups 90-94 have no columns: 0


def test_sum_rows_adds_in_row_order(kernels) -> None:
    """Column sums to the bit as float32 additions row after row (the one-call CPU step's and
    FastStep's By gradient), over more columns than one thread's block; no rows: zeros."""
    g = torch.tensor(np.random.default_rng(5).normal(size=(37, 2500)), dtype=torch.float32)
    exact = g[0].numpy().copy()
    for b in range(1, 37):
        exact += g[b].numpy()
    got = kernels.sum_rows(g)
    assert torch.equal(got, torch.from_numpy(exact))
    assert torch.equal(kernels.sum_rows(torch.zeros(0, 3)), torch.zeros(3))


def test_add_rows_equals_index_add(kernels) -> None:
    g = torch.Generator().manual_seed(10)
    table = torch.randn(12, 5, generator=g)
    rows = torch.tensor([3, 0, 3, 11, 3])  # repeated rows add up
    src = torch.randn(5, 5, generator=g)
    want = table.clone().index_add_(0, rows, src)
    kernels.add_rows(table, rows, src)
    torch.testing.assert_close(table, want, rtol=1e-6, atol=1e-6)
    one = torch.zeros(2, 2)
    kernels.add_rows(one, torch.tensor([1, 1]), torch.tensor([[1.0, 2.0], [0.5, 0.25]]))
    assert one.tolist() == [[0.0, 0.0], [1.5, 2.25]]
    with pytest.raises(ValueError, match="src must be"):
        kernels.add_rows(one, torch.tensor([1]), torch.ones(3))


def test_column_bias_equals_pytorch(kernels) -> None:
    g = torch.Generator().manual_seed(8)
    by, lq_in, lq_s = torch.randn(30, generator=g), torch.randn(30, generator=g), torch.randn(30, generator=g)
    targets, samples = torch.randint(0, 30, (6,), generator=g), torch.randint(0, 30, (11,), generator=g)
    cols = torch.cat((targets, samples))
    valid = torch.cat((torch.tensor([1.0, 1, 0, 1, 0, 1]), torch.ones(11)))
    logq = torch.cat((lq_in[targets], lq_s[samples]))
    assert torch.equal(kernels.column_bias(cols, 6, by, lq_in, lq_s, valid), by[cols] - logq + (1.0 - valid) * -1e30)
    assert torch.equal(kernels.column_bias(cols, 6, by, lq_in, lq_s, None), by[cols] - logq)
    assert torch.equal(kernels.column_bias(cols, 6, by, None, None, None), by[cols])
    out = kernels.column_bias(torch.tensor([2, 0, 2]), 1, torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 0.0, 0.25]),
                              torch.tensor([0.0, 3.0, 0.5]), torch.tensor([1.0, 0.0, 1.0]))
    assert out.tolist() == torch.tensor([1.75, -1e30, 1.5]).tolist()  # 2 − 0.25 (in-batch logq); masked; 2 − 0.5 (sample logq)
    with pytest.raises(ValueError, match="go together"):
        kernels.column_bias(cols, 6, by, lq_in, None, None)


def test_gather_columns_equals_index_select(kernels) -> None:
    g = torch.Generator().manual_seed(6)
    s = torch.randn(5, 9, generator=g)
    group = torch.randint(0, 9, (23,), generator=g)
    bias = torch.randn(23, generator=g)
    assert torch.equal(kernels.gather_columns(s, group, bias), s[:, group] + bias)
    # by hand: out[b, j] = s[b, group[j]] + bias[j]
    out = kernels.gather_columns(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([1, 1, 0]), torch.tensor([0.5, 0.0, -1.0]))
    assert out.tolist() == [[2.5, 2.0, 0.0], [4.5, 4.0, 2.0]]


# ------------------------------------------------------------------ the GRU cell

def _cell_inputs(B: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # pre-activations across the ranges that matter: tiny (tanh's polynomial), moderate, saturated
    scale = torch.tensor([1e-6, 1e-3, 0.3, 0.6, 0.7, 2.0, 9.0, 40.0, 100.0])
    pick = lambda *shape: torch.randn(*shape, generator=g) * scale[torch.randint(0, len(scale), shape, generator=g)]  # noqa: E731
    mask = (torch.rand(B, n, generator=g) >= 0.3).float() / 0.7
    return {"a": pick(B, 2 * n), "u": pick(B, n), "h": torch.rand(B, n, generator=g) * 2 - 1, "d": torch.randn(B, n, generator=g),
            "t": torch.randn(B, n, generator=g), "mask": mask}


@pytest.mark.parametrize("B,n", [(3, 7), (64, 600)])  # the second is large enough for the threads
def test_gru_forward_kernels_equal_pytorch(kernels, B: int, n: int) -> None:
    x = _cell_inputs(B, n, seed=B)
    rz = x["a"].clone()
    hr = kernels.gru_gates(rz, x["h"])
    want_rz = torch.sigmoid(x["a"].double())
    # sigmoid and tanh to a few float32 ulp of the exact (float64) values, tiny inputs included
    torch.testing.assert_close(rz.double(), want_rz, rtol=4e-7, atol=1e-30)
    torch.testing.assert_close(hr, x["h"] * rz[:, :n], rtol=0, atol=0)
    for mask in (None, x["mask"]):
        c = x["u"].clone()
        out = kernels.gru_output(c, x["h"], rz, mask)
        torch.testing.assert_close(c.double(), torch.tanh(x["u"].double()), rtol=4e-7, atol=1e-30)
        want = torch.lerp(x["h"], c, rz[:, n:])
        torch.testing.assert_close(out, want if mask is None else want * mask, rtol=0, atol=0)


@pytest.mark.parametrize("B,n", [(3, 7), (64, 600)])
def test_gru_backward_kernels_equal_pytorch(kernels, B: int, n: int) -> None:
    """The formulas of the PyTorch path of gru4rec/training/cell.py (its fallback), element by element, computed
    in float64 from the same float32 inputs: the kernels may fuse a multiply and an add (more
    exact than PyTorch's float32 where 1 − c² cancels), so float64 is the fair reference."""
    x = {k: v.double() for k, v in _cell_inputs(B, n, seed=B + 1).items()}
    rz, c, h = torch.sigmoid(x["a"]).float().double(), torch.tanh(x["u"]).float().double(), x["h"]
    f32 = lambda t: None if t is None else t.float()  # noqa: E731
    for mask in (None, x["mask"]):
        d = x["d"] if mask is None else x["d"] * mask
        dv = kernels.gru_backward_out(f32(x["d"]), f32(mask), f32(rz), f32(c), f32(h))
        z = rz[:, n:]
        torch.testing.assert_close(dv[:, :n].double(), d * z * (1.0 - c * c), rtol=5e-7, atol=1e-30)
        torch.testing.assert_close(dv[:, 2 * n:].double(), d * (c - h) * (z * (1.0 - z)), rtol=5e-7, atol=1e-30)
        g_bias = torch.full((3 * n,), float("nan"))
        kernels.gru_backward_reset(f32(x["t"]), f32(h), f32(rz), dv, g_bias)
        r = rz[:, :n]
        torch.testing.assert_close(dv[:, n:2 * n].double(), x["t"] * h * (r * (1.0 - r)), rtol=5e-7, atol=1e-30)
        torch.testing.assert_close(g_bias.double(), dv.double().sum(0), rtol=1e-5, atol=1e-6 * B)


def test_gru_kernels_by_hand(kernels) -> None:
    h = torch.tensor([[0.5]])
    rz = torch.tensor([[0.0, 0.0]])  # sigmoid(0) = 1/2 for r and z
    hr = kernels.gru_gates(rz, h)
    assert rz.tolist() == [[0.5, 0.5]] and hr.tolist() == [[0.25]]
    c = torch.tensor([[0.0]])
    out = kernels.gru_output(c, h, rz, torch.tensor([[2.0]]))
    assert c.tolist() == [[0.0]] and out.tolist() == [[0.5]]  # (0.5 + 0.5·(0 − 0.5))·2
    dv = kernels.gru_backward_out(torch.tensor([[1.0]]), None, rz, c, h)
    assert dv[0, 0] == 0.5 and dv[0, 2] == -0.125  # z·(1 − 0²); (0 − 0.5)·0.5·0.5
    g_bias = torch.empty(3)
    kernels.gru_backward_reset(torch.tensor([[2.0]]), h, rz, dv, g_bias)
    assert dv[0, 1] == 0.25 and g_bias.tolist() == [0.5, 0.25, -0.125]  # 2·0.5·0.25


LOSSES = [
    dict(loss="cross-entropy", final_act="softmax"),
    dict(loss="xe_logit", final_act="softmax_logit"),
    dict(loss="bpr-max", final_act="elu-1", bpreg=0.9),
    dict(loss="bpr-max", final_act="elu-0.5", bpreg=1.95),
    dict(loss="bpr-max", final_act="linear", bpreg=0.0),
    dict(loss="bpr-max", final_act="tanh", bpreg=0.3),
]


@pytest.mark.parametrize("n_sample", [0, 700])
@pytest.mark.parametrize("kw", LOSSES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_fused_loss_equals_pytorch_loss(kernels, kw: dict, n_sample: int) -> None:
    """Loss and dL/dscores of the fused kernels against the PyTorch code (itself tested against
    autograd), with two inactive slots masked and scores spread enough to saturate softmaxes."""
    from gru4rec.training.losses import MASK, make_loss_grad

    B = 40
    cfg = Config(batch_size=B, n_sample=n_sample, **kw)
    rng = np.random.default_rng(7)
    x = torch.tensor(rng.normal(scale=4.0, size=(B, B + n_sample)), dtype=torch.float32)
    active = torch.ones(B)
    active[[5, 17]] = 0.0
    col_valid = torch.cat((active, torch.ones(n_sample)))
    n_cols = active.sum() + n_sample
    if cfg.loss != "bpr-max":  # cross-entropy: masked columns come in through the bias
        x = x + (1.0 - col_valid) * MASK
    fused, plain = make_loss_grad(cfg, kernels), make_loss_grad(cfg)
    assert fused is not plain and fused.__name__.endswith("_fused")
    loss_f, grad_f = fused(x.clone(), col_valid, active, n_cols)
    loss_p, grad_p = plain(x.clone(), col_valid, active, n_cols)
    torch.testing.assert_close(loss_f, loss_p, rtol=2e-6, atol=0.0)
    torch.testing.assert_close(grad_f, grad_p, rtol=1e-4, atol=2e-7 * float(grad_p.abs().max()))
    assert float(grad_f[[5, 17]].abs().max()) == 0.0  # inactive rows: no gradient
    assert float(grad_f[:, [5, 17]].abs().max()) == 0.0  # masked columns: none either


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_bpr_max_activates_its_scores_with_torchs_elu(kernels, alpha: float) -> None:
    """With elu_alpha the kernel overwrites the raw scores with elu-A: torch's ELU to a few ulps
    across both branches of its exp(x) - 1 (the polynomial above -0.5, exp below), at the
    boundary, near 0 (where exp(x) - 1 would cancel), far below (-1·A) and above 0 (x itself)."""
    grid = torch.cat((torch.linspace(-0.6, 0.1, 700), torch.tensor([-0.5, -0.4999999, -0.5000001, -1e-7, -3e-4, -1.0, -7.5,
                                                                    -30.0, -90.0, -1e4, 0.0, 2.5])))
    x = grid.repeat(2, 1).contiguous()
    r = x.clone()
    kernels.bpr_max(r, torch.ones(x.shape[1]), torch.ones(2), 0.9, alpha)
    want = torch.nn.functional.elu(x, alpha=alpha)
    assert torch.equal(r[:, -2:], x[:, -2:])  # 0 and above: x itself
    ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert float(((r - want).abs() / ulp).max()) <= 4.0


def test_fused_cross_entropy_by_hand(kernels) -> None:
    """Two rows, three columns: softmax by hand, p_ii and the gradient p − onehot (weights ½)."""
    x = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, -1e30]])
    loss = kernels.cross_entropy(x, torch.tensor([0.5, 0.5]), False)
    e = np.exp([0.0, 1.0, 2.0])
    p0 = e / e.sum()
    want_loss = 0.5 * (-np.log(p0[0] + 1e-24)) + 0.5 * (-np.log(0.5 + 1e-24))
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    np.testing.assert_allclose(x.numpy(), [[0.5 * (p0[0] - 1), 0.5 * p0[1], 0.5 * p0[2]], [0.25, -0.25, 0.0]], rtol=1e-6, atol=1e-9)


def test_bad_arguments_are_refused(kernels) -> None:
    p = torch.zeros(10, 4)
    state = {"acc": torch.zeros(10, 4), "vel": torch.zeros(10, 4)}
    rule = dict(method="adagrad", lr=0.1, momentum=0.2, lmbd=0.0)
    with pytest.raises(ValueError, match="float32"):
        kernels.table_update(p.double(), state, **rule)
    with pytest.raises(ValueError, match="'vel'"):
        kernels.table_update(p, {"acc": state["acc"]}, **rule)
    with pytest.raises(ValueError, match="acc"):
        kernels.table_update(p, {"acc": torch.zeros(10, 5), "vel": state["vel"]}, **rule)
    update = kernels.table_update(p, state, **rule)
    rows = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="g must be"):
        update(rows, torch.zeros(3, 4))  # one gradient row too many
    with pytest.raises(ValueError, match="g must be"):
        update(rows, torch.zeros(4, 2).t())  # not contiguous
    with pytest.raises(ValueError, match="rows must be"):
        update(rows.int(), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="group must"):
        kernels.sum_columns(torch.zeros(2, 3), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match="B ≤ C"):
        kernels.cross_entropy(torch.zeros(3, 2), torch.ones(3), False)
    with pytest.raises(ValueError, match="valid must be"):
        kernels.bpr_max(torch.zeros(2, 3), torch.ones(2), torch.ones(2), 0.0)
    assert float(p.abs().sum()) == 0.0  # nothing was written


def test_moved_table_is_refused(kernels) -> None:
    W = nn.Parameter(torch.zeros(10, 4))
    opt = Optimizer({}, {"W": W}, Config(momentum=0.1), select_backend("cpu", cpu_kernels=True))
    W.data = torch.zeros(10, 4)  # a new storage: the bound addresses are stale
    with pytest.raises(RuntimeError, match="moved"):
        opt.step([], {"W": (torch.tensor([1]), torch.ones(1, 4))})


def test_kernels_only_where_they_apply() -> None:
    W = nn.Parameter(torch.zeros(10, 4, dtype=torch.float64))
    assert Optimizer({}, {"W": W}, Config()).kernels is None  # float64: the PyTorch code
    with pytest.raises(ValueError, match="apply"):
        select_backend("cpu", torch.float64, cpu_kernels=True)
    with pytest.raises(ValueError, match="backend is for"):
        Optimizer({}, {"W": W}, Config(), select_backend("cpu", torch.float32))
    W32 = nn.Parameter(torch.zeros(10, 4))
    assert Optimizer({}, {"W": W32}, Config(), select_backend("cpu", unique_rows=False)).kernels is None


@pytest.mark.parametrize("model", ["layers=16", "layers=12/10,dropout_p_embed=0.2", "constrained_embedding=False,embedding=0",
                                   "constrained_embedding=False,embedding=8,layers=12/10", "hidden_act=relu"])
def test_training_with_and_without_kernels_gives_the_same_losses(kernels, model: str) -> None:
    """Two epochs of the fast step on synthetic sessions, with the fused kernels (optimiser,
    distinct score rows, losses, GRU cells) or the PyTorch code: the same epoch losses and
    weights to float32 round-off, in every embedding mode and with two layers."""
    from gru4rec.data import ItemMap, item_support, sessions_from_events
    from gru4rec.datasets.synthetic import generate
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.training.loop import train_epochs
    from gru4rec.training.trainer import Trainer

    events = generate(n_sessions=300, n_items=120, seed=4)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    for loss in ("cross-entropy", "bpr-max"):
        cfg = Config(loss=loss, batch_size=8, n_sample=16, n_epochs=2, momentum=0.2, dropout_p_hidden=0.2,
                     learning_rate=0.05, final_act="softmax" if loss == "cross-entropy" else "elu-0.5").replace_from_string(model)
        results = []
        for fused in (True, False):
            net = GRU4RecNet(len(support), cfg, generator=torch.Generator().manual_seed(1))
            trainer = Trainer(net, cfg, support, seed=3, backend=select_backend("cpu", cpu_kernels=fused))
            assert trainer.cell.fused == (fused and cfg.hidden_act == "tanh")
            losses = [s.loss for s in train_epochs(trainer, sessions.items, sessions.offsets, progress=False)]
            results.append((losses, net.Wy.detach().clone()))
        np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5, err_msg=loss)
        torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ the step's operations, chosen once

def test_fused_ops_equal_pytorch_ops(kernels) -> None:
    """Every operation of the fast step's two implementations (gru4rec/training/ops.py) on the
    same inputs: the fused CPU kernels give what the PyTorch code gives, to float32 round-off
    where they add in another order, exactly where they do not."""
    from gru4rec.training.ops import CpuKernelOps, TorchOps
    from gru4rec.training.sampling import LogQ

    fused, plain = CpuKernelOps(kernels), TorchOps()
    assert fused.fused and not plain.fused and fused.kernels is kernels and plain.kernels is None
    g = torch.Generator().manual_seed(11)
    by, logq = torch.randn(30, generator=g), LogQ(torch.randn(30, generator=g), torch.randn(30, generator=g))
    cols = torch.randint(0, 30, (17,), generator=g)
    valid = torch.cat((torch.tensor([1.0, 1, 0, 1, 0, 1]), torch.ones(11)))
    for lq, v in ((logq, valid), (logq, None), (None, valid), (None, None)):
        assert torch.equal(fused.column_bias(by, cols, 6, lq, v), plain.column_bias(by, cols, 6, lq, v))
    s, col_rows, bias = torch.randn(5, 9, generator=g), torch.randint(0, 9, (23,), generator=g), torch.randn(23, generator=g)
    assert torch.equal(fused.spread_columns(s, col_rows, bias), plain.spread_columns(s, col_rows, bias))
    grad = torch.randn(5, 23, generator=g)
    torch.testing.assert_close(fused.merge_columns(grad, col_rows, 9), plain.merge_columns(grad, col_rows, 9), rtol=1e-6, atol=1e-6)
    rows = torch.tensor([3, 0, 3, 11, 3])
    for shape in ((12, 5), (12,)):  # a weight table, and a bias table (index_add_ in both)
        table = torch.randn(*shape, generator=g)
        src = torch.randn(*shape[1:], 5, generator=g).t() if len(shape) == 2 else torch.randn(5, generator=g)  # any layout
        a, b = table.clone(), table.clone()
        fused.add_rows(a, rows, src)
        plain.add_rows(b, rows, src)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    mark, slot, arange = torch.zeros(50, dtype=torch.uint8), torch.zeros(50, dtype=torch.int64), torch.arange(50)
    ids = torch.randint(0, 50, (80,), generator=g)
    for n_first in (None, 30, 0):
        (u_f, inv_f, k_f), (u_p, inv_p, k_p) = (ops.unique(ids, mark, slot, arange, n_first) for ops in (fused, plain))
        assert k_f == k_p and torch.equal(u_f[:k_f], u_p[:k_p])  # the first positions' values, ascending
        assert sorted(u_f[k_f:].tolist()) == sorted(u_p[k_p:].tolist())  # the rest (kernel: order of appearance)
        assert torch.equal(u_f[inv_f], ids) and torch.equal(u_p[inv_p], ids) and int(mark.sum()) == 0


@pytest.mark.parametrize("dropout", [False, True])
def test_fused_gru_cell_equals_pytorch_cell(kernels, dropout: bool) -> None:
    """The fast step's GRU cell (gru4rec/training/cell.py), fused and PyTorch: the same layer
    output, gates and candidate forward, the same dL/dv and weight gradients backward."""
    from gru4rec.config.activations import parse_activation
    from gru4rec.training.cell import LayerCache
    from gru4rec.training.ops import CpuKernelOps, TorchOps
    from gru4rec.training.precision import Matmuls

    tanh, mm = parse_activation("tanh"), Matmuls(None, torch.float32)
    fused, plain = CpuKernelOps(kernels).gru_cell(tanh, mm), TorchOps().gru_cell(tanh, mm)
    assert fused.fused and not plain.fused
    B, n = 24, 10
    g = torch.Generator().manual_seed(12)
    v, h = torch.randn(B, 3 * n, generator=g), torch.rand(B, n, generator=g) * 2 - 1
    wrz, wh, d = torch.randn(n, 2 * n, generator=g) * 0.3, torch.randn(n, n, generator=g) * 0.3, torch.randn(B, n, generator=g)
    mask = (torch.rand(B, n, generator=g) >= 0.3).float() / 0.7 if dropout else None
    results = []
    for cell in (fused, plain):
        rz, hr, c, out = cell.forward(v, h, h, wrz, wh, mask)
        grads = torch.empty(n, n), torch.empty(n, 2 * n), torch.empty(3 * n)
        d_v = cell.backward(d, LayerCache(h, None, h, h, wh, hr, rz, c, mask), *grads)
        results.append((rz, hr, c, out, d_v, *grads))
    for name, a, b in zip(("rz", "hr", "c", "out", "d_v", "dWh", "dWrz", "dBh"), *results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_ops_are_chosen_once_by_device_dtype_precision_and_activation(kernels) -> None:
    """select_backend decides kernels or PyTorch from the tables (CPU, float32, unique rows) and
    the switch; the ops then choose the cell (fused: tanh and float32 products) and the loss."""
    from gru4rec.config.activations import parse_activation
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.training.ops import CpuKernelOps, TorchOps
    from gru4rec.training.precision import Matmuls
    from gru4rec.training.trainer import Trainer

    cpu = torch.device("cpu")
    assert isinstance(select_backend(cpu, torch.float32, unique_rows=True).ops, CpuKernelOps)
    assert type(select_backend(cpu, torch.float32, unique_rows=True, cpu_kernels=False).ops) is TorchOps
    assert type(select_backend(cpu, torch.float64, unique_rows=True).ops) is TorchOps
    assert type(select_backend(cpu, torch.float32, unique_rows=False).ops) is TorchOps
    with pytest.raises(ValueError, match="apply"):
        select_backend(cpu, torch.float32, unique_rows=False, cpu_kernels=True)
    ops = CpuKernelOps(kernels)
    assert ops.gru_cell(parse_activation("tanh"), Matmuls(None, torch.float32)).fused
    assert not ops.gru_cell(parse_activation("relu"), Matmuls(None, torch.float32)).fused
    assert not ops.gru_cell(parse_activation("tanh"), Matmuls(torch.bfloat16, torch.float32)).fused
    assert ops.loss_grad(Config(loss="bpr-max", final_act="elu-1")).__name__ == "bpr_max_fused"
    assert ops.loss_grad(Config(loss="top1-max", final_act="tanh")).__name__ == "top1_max"  # no kernel for it
    assert TorchOps().loss_grad(Config(loss="bpr-max", final_act="elu-1")).__name__ == "bpr_max"
    cfg = Config(layers=(8,), batch_size=4, n_sample=4)
    for switch, want in ((None, CpuKernelOps), (False, TorchOps)):
        trainer = Trainer(GRU4RecNet(20, cfg), cfg, np.ones(20, dtype=np.int64), backend=select_backend(cpu, cpu_kernels=switch))
        assert type(trainer.ops) is want and trainer.ops is trainer.optimizer.ops is trainer.backend.ops
        assert trainer.cell.fused == (want is CpuKernelOps)


# ------------------------------------------------------------------ building and loading

def test_build_caches_by_source_and_reuses(tmp_path: Path) -> None:
    if cpu_ops.cpu_kernels() is None:
        pytest.skip("no working C compiler here")
    first = cpu_ops.load_kernels(cache_dir=tmp_path)
    built = list(tmp_path.glob("cpu_kernels-*.so"))
    assert [first.path] == built
    stamp = first.path.stat().st_mtime_ns
    again = cpu_ops.load_kernels(cache_dir=tmp_path)
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp  # not rebuilt
    assert not list(tmp_path.glob(".build-*"))  # no half-written file left behind


def test_missing_compiler_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(cpu_ops.KernelBuildError, match="cannot run the C compiler"):
        cpu_ops.load_kernels(cache_dir=tmp_path, compiler=str(tmp_path / "no-such-cc"))
    assert not list(tmp_path.iterdir())


def test_failing_compiler_names_the_flags(tmp_path: Path) -> None:
    fake = tmp_path / "fake-cc"
    fake.write_text("#!/bin/sh\necho 'fake-cc: error: no luck' >&2\nexit 1\n")
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    with pytest.raises(cpu_ops.KernelBuildError, match="no luck") as info:
        cpu_ops.load_kernels(cache_dir=cache, compiler=str(fake))
    assert "-march=native" in str(info.value) and str(info.value).count("no luck") == len(kernel_build._FLAG_SETS)
    assert not list(cache.iterdir())


def test_without_kernels_training_warns_once_and_uses_pytorch(tmp_path: Path) -> None:
    """A machine where the kernels cannot be built (CC names no compiler, empty cache): one
    warning, and the optimiser runs the PyTorch code."""
    code = (
        "import warnings, torch\n"
        "from torch import nn\n"
        "from gru4rec.config import Config\n"
        "from gru4rec.training.optim import Optimizer\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    opts = [Optimizer({}, {'W': nn.Parameter(torch.zeros(3, 2))}, Config()) for _ in range(2)]\n"
        "print(len(w), opts[0].kernels, opts[1].kernels)\n"
        "print(w[0].message if w else '')\n"
    )
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), GRU4REC_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.splitlines()
    assert out[0] == "1 None None"
    assert "could not be built" in out[1] and "no-such-cc" in out[1] and "same results" in out[1]


def test_kernels_can_be_turned_off() -> None:
    code = "from gru4rec.kernels.cpu import cpu_kernels; print(cpu_kernels())"
    env = dict(os.environ, GRU4REC_CPU_KERNELS="0", PYTHONPATH=str(ROOT))
    with warnings.catch_warnings():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "None" and "could not be built" not in out.stderr


# ------------------------------------------------------------------ the C structures and their ctypes mirrors

def _mirror(name: str, fields: list) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def test_each_c_structure_matches_its_ctypes_mirror_when_loaded(kernels: cpu_ops.CpuKernels) -> None:
    """Loading the library checked rule_t and step_t field by field; C reports every field of each
    (so a field added to C alone is reported too) at the offsets ctypes gives its mirror."""
    assert set(kernels.layouts) == {"rule_t", "step_t"}
    for c_name, (layout, mirror) in kernels.layouts.items():
        table = ctypes.POINTER(cpu_ops._Field)()
        size = ctypes.c_int64()
        n = layout(ctypes.byref(table), ctypes.byref(size))
        assert [table[i].name.decode() for i in range(n)] == [f[0] for f in mirror._fields_], c_name
        assert size.value == ctypes.sizeof(mirror) > 0
        cpu_ops.check_layout(layout, c_name, mirror)


@pytest.mark.parametrize(("c_name", "change", "message"), [
    # a field resized on one side: the first field that differs is named, with both layouts
    ("rule_t", lambda f: [(n, ctypes.c_int32 if n == "width" else t) for n, t in f],
     r"rule_t .* disagree at field 'width': offset 40, 8 bytes in C; offset 40, 4 bytes in the mirror"),
    # two fields swapped
    ("step_t", lambda f: [f[1], f[0], *f[2:]], r"step_t .* disagree at field 'sgemm'"),
    # a field added to the mirror alone, at the end
    ("step_t", lambda f: [*f, ("extra", ctypes.c_void_p)], r"step_t .* disagree at field 'extra': C has no such field"),
    # a field that the mirror lacks (C has it)
    ("rule_t", lambda f: [x for x in f if x[0] != "eps"], r"rule_t .* disagree at field 'eps': the mirror has no such field"),
])
def test_a_mirror_that_differs_from_c_is_one_error_naming_the_structure_and_field(
        kernels: cpu_ops.CpuKernels, c_name: str, change, message: str) -> None:
    layout, mirror = kernels.layouts[c_name]
    wrong = _mirror("Wrong", change(list(mirror._fields_)))
    with pytest.raises(cpu_ops.StructLayoutError, match=message):
        cpu_ops.check_layout(layout, c_name, wrong)


def test_a_structure_of_another_size_is_an_error(kernels: cpu_ops.CpuKernels) -> None:
    """Every field in place, but C's structure larger (a field hidden from the table): still refused."""
    layout, mirror = kernels.layouts["rule_t"]

    def larger(table, size):  # C's table, with a sizeof 8 bytes more than the mirror's
        n = layout(table, size)
        ctypes.cast(size, ctypes.POINTER(ctypes.c_int64))[0] += 8
        return n

    with pytest.raises(cpu_ops.StructLayoutError, match=r"rule_t .* disagree in size: \d+ bytes in C, \d+ in the mirror"):
        cpu_ops.check_layout(larger, "rule_t", mirror)
