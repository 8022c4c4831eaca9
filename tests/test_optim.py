"""Optimisers (docs/behaviour.md §6): the lazy sparse Adagrad update with repeated indices against a hand
computation, and every ``adapt`` method (with momentum, lmbd, grad_cap) against the NumPy reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import numpy_reference as ref
from gru4rec.config import Config
from gru4rec.training.backend import select_backend
from gru4rec.training.optim import Optimizer

torch.set_num_threads(1)
EPS = 1e-6

P0 = [[0.1, 0.2], [0.3, -0.4], [0.5, 0.6], [-0.7, 0.8]]


def make(table: list[list[float]], cfg: Config, dense: list[list[float]] | None = None) -> tuple[nn.Parameter, nn.Parameter, Optimizer]:
    W = nn.Parameter(torch.tensor(table, dtype=torch.float64))
    D = nn.Parameter(torch.tensor(dense if dense is not None else [[0.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    return W, D, Optimizer({"D": D}, {"W": W}, cfg)


def sparse(rows: list[int], grads: list[list[float]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {"W": (torch.tensor(rows), torch.tensor(grads, dtype=torch.float64))}


def zero_dense() -> list[torch.Tensor]:
    return [torch.zeros(2, 2, dtype=torch.float64)]


def test_sparse_adagrad_repeated_rows_by_hand() -> None:
    """Rows [2, 0, 2]: row 2's two gradients are summed first, then ONE Adagrad step per row."""
    W, D, opt = make(P0, Config(learning_rate=0.1, momentum=0.0))
    with torch.no_grad():
        opt.step(zero_dense(), sparse([2, 0, 2], [[1.0, -2.0], [0.3, 0.4], [0.5, 0.5]]))
    # row 0: g = (0.3, 0.4), acc = (0.09, 0.16)
    # row 2: g = (1.0 + 0.5, -2.0 + 0.5) = (1.5, -1.5), acc = (2.25, 2.25)
    expected = [
        [0.1 - 0.1 * 0.3 / math.sqrt(0.09 + EPS), 0.2 - 0.1 * 0.4 / math.sqrt(0.16 + EPS)],
        [0.3, -0.4],  # untouched
        [0.5 - 0.1 * 1.5 / math.sqrt(2.25 + EPS), 0.6 + 0.1 * 1.5 / math.sqrt(2.25 + EPS)],
        [-0.7, 0.8],  # untouched
    ]
    np.testing.assert_allclose(W.detach().numpy(), expected, rtol=1e-12, atol=1e-15)
    acc = opt.state_dict()["W.acc"].numpy()
    np.testing.assert_allclose(acc, [[0.09, 0.16], [0, 0], [2.25, 2.25], [0, 0]], rtol=1e-12)


def test_sparse_adagrad_momentum_lmbd_lazy_by_hand() -> None:
    """Momentum 0.5, lmbd 0.01, two steps; row 2 is not used in step 2, so its velocity does not
    decay and it does not move (lazy state)."""
    lr, mu, lam = 0.1, 0.5, 0.01
    W, D, opt = make(P0, Config(learning_rate=lr, momentum=mu, lmbd=lam))
    with torch.no_grad():
        opt.step(zero_dense(), sparse([2, 0, 2], [[1.0, -2.0], [0.3, 0.4], [0.5, 0.5]]))
        opt.step(zero_dense(), sparse([0], [[0.1, -0.1]]))

    def one(p: float, g: float) -> tuple[float, float, float]:
        acc = g * g
        v = -lr * (g / math.sqrt(acc + EPS) + lam * p)
        return p + v, acc, v

    # row 0, step 1 then step 2
    p00, a00, v00 = one(0.1, 0.3)
    p01, a01, v01 = one(0.2, 0.4)
    a00b, a01b = a00 + 0.01, a01 + 0.01
    v00b = mu * v00 - lr * (0.1 / math.sqrt(a00b + EPS) + lam * p00)
    v01b = mu * v01 - lr * (-0.1 / math.sqrt(a01b + EPS) + lam * p01)
    # row 2, step 1 only
    p20, a20, v20 = one(0.5, 1.5)
    p21, a21, v21 = one(0.6, -1.5)
    expected_p = [[p00 + v00b, p01 + v01b], [0.3, -0.4], [p20, p21], [-0.7, 0.8]]
    expected_v = [[v00b, v01b], [0, 0], [v20, v21], [0, 0]]
    expected_a = [[a00b, a01b], [0, 0], [a20, a21], [0, 0]]
    state = opt.state_dict()
    np.testing.assert_allclose(W.detach().numpy(), expected_p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(state["W.vel"].numpy(), expected_v, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(state["W.acc"].numpy(), expected_a, rtol=1e-12, atol=1e-15)
    # dense parameter with zero gradient and zero value: acc 0, ĝ 0, p stays 0
    assert float(D.detach().abs().sum()) == 0.0


def test_grad_cap_global_norm_by_hand() -> None:
    """Dense g = [[3,0],[0,0]], sparse rows [1, 1] with (0, 2) each → summed row 1 = (0, 4);
    global norm sqrt(9 + 16) = 5; grad_cap 1 scales everything by 0.2. (Counting the duplicate
    rows separately would give sqrt(9 + 4 + 4).)"""
    W, D, opt = make(P0, Config(adapt="sgd", learning_rate=1.0, grad_cap=1.0))
    with torch.no_grad():
        opt.step([torch.tensor([[3.0, 0.0], [0.0, 0.0]], dtype=torch.float64)],
                 sparse([1, 1], [[0.0, 2.0], [0.0, 2.0]]))
    np.testing.assert_allclose(D.detach().numpy(), [[-0.6, 0.0], [0.0, 0.0]], rtol=1e-12, atol=1e-15)
    exp = np.array(P0)
    exp[1] = [0.3, -0.4 - 0.8]
    np.testing.assert_allclose(W.detach().numpy(), exp, rtol=1e-12, atol=1e-15)


def test_grad_cap_inactive_below_cap() -> None:
    W, D, opt = make(P0, Config(adapt="sgd", learning_rate=1.0, grad_cap=5.01))
    with torch.no_grad():
        opt.step([torch.tensor([[3.0, 0.0], [0.0, 0.0]], dtype=torch.float64)], sparse([1, 1], [[0.0, 2.0], [0.0, 2.0]]))
    np.testing.assert_allclose(D.detach().numpy(), [[-3.0, 0.0], [0.0, 0.0]], rtol=1e-12)


# ------------------------------------------------------------------ every method vs reference

METHODS = [
    dict(adapt="adagrad"),
    dict(adapt="adagrad", momentum=0.3),
    dict(adapt="adagrad", momentum=0.3, lmbd=0.05, grad_cap=0.5),
    dict(adapt="adagrad", lmbd=0.1),
    dict(adapt="rmsprop", adapt_params=(0.8,)),
    dict(adapt="rmsprop", adapt_params=(0.8,), momentum=0.2, lmbd=0.02),
    dict(adapt="adadelta", adapt_params=(0.9,)),
    dict(adapt="adadelta", adapt_params=(0.9,), momentum=0.4),
    dict(adapt="adam", adapt_params=(0.8, 0.95)),
    dict(adapt="adam", adapt_params=(0.9, 0.999), lmbd=0.05),
    dict(adapt="sgd"),
    dict(adapt="sgd", momentum=0.6, lmbd=0.1, grad_cap=0.7),
]


@pytest.mark.parametrize("kw", METHODS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_method_vs_reference(kw: dict) -> None:
    rng = np.random.default_rng(4)
    cfg = Config(learning_rate=0.07, **kw)
    params = {"A": rng.normal(size=(3, 4)), "b": rng.normal(size=5), "W": rng.normal(size=(6, 3)), "By": rng.normal(size=6)}
    dense_names, sparse_names = ["A", "b"], ["W", "By"]
    tp = {k: nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    opt = Optimizer({k: tp[k] for k in dense_names}, {k: tp[k] for k in sparse_names}, cfg)
    ocfg = ref.OptConfig(adapt=cfg.adapt, learning_rate=cfg.learning_rate, momentum=cfg.momentum, lmbd=cfg.lmbd,
                         grad_cap=cfg.grad_cap, adapt_params=cfg.resolved_adapt_params,
                         adam_eps=1e-6)  # docs/behaviour.md §6 does not fix Adam's ε; the optimiser documents 1e-6
    state = ref.OptState.zeros(params)
    row_sets = [[1, 4, 1, 1, 0], [4, 5], [2, 1, 2]]  # row 0 used in step 1 only, row 3 never
    for step, rows in enumerate(row_sets):
        dense_g = {k: rng.normal(size=params[k].shape) for k in dense_names}
        sg = {k: rng.normal(size=(len(rows),) + params[k].shape[1:]) for k in sparse_names}
        with torch.no_grad():
            opt.step([torch.from_numpy(dense_g[k]) for k in dense_names],
                     {k: (torch.tensor(rows), torch.from_numpy(sg[k])) for k in sparse_names})
        full = dict(dense_g)
        for k in sparse_names:
            g = np.zeros_like(params[k])
            np.add.at(g, np.array(rows), sg[k])
            full[k] = g
        params, state = ref.optimizer_step(params, full, state, {k: np.unique(rows) for k in sparse_names}, ocfg)
        for k in params:
            np.testing.assert_allclose(tp[k].detach().numpy(), params[k], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{k} after step {step + 1}")
    sd = opt.state_dict()
    for k in params:
        if cfg.momentum > 0:
            np.testing.assert_allclose(sd[f"{k}.vel"].numpy(), state.vel[k], rtol=1e-10, atol=1e-12)
        if cfg.adapt != "sgd":
            np.testing.assert_allclose(sd[f"{k}.acc"].numpy(), state.acc[k], rtol=1e-10, atol=1e-12)
        if cfg.adapt == "adadelta":
            np.testing.assert_allclose(sd[f"{k}.dacc"].numpy(), state.acc2[k], rtol=1e-10, atol=1e-12)
        if cfg.adapt == "adam":
            np.testing.assert_allclose(sd[f"{k}.m"].numpy(), state.acc2[k], rtol=1e-10, atol=1e-12)
    # row 3 of the sparse tables was never used: value and state untouched
    np.testing.assert_array_equal(tp["W"].detach().numpy()[3], params["W"][3])
    if cfg.adapt != "sgd":
        assert float(sd["W.acc"][3].abs().sum()) == 0.0


@pytest.mark.parametrize("kernels", [False, None], ids=["pytorch", "kernels-if-built"])
def test_unique_rows_grouped_by_position(kernels: bool | None) -> None:
    """Optimizer.unique: the distinct values of the first n_first positions first (ascending),
    then those found only after them; inverse maps every position to its value's row."""
    W = nn.Parameter(torch.zeros(50, 3))
    opt = Optimizer({}, {"W": W}, Config(), select_backend("cpu", cpu_kernels=kernels))
    rng = np.random.default_rng(9)
    for n, n_first in ((1, 1), (40, 40), (40, 25), (40, 0), (200, 120)):
        rows = torch.tensor(rng.integers(0, 50, size=n))
        uniq, inverse, k = opt.unique(rows, n_first)
        head = np.unique(rows[:n_first].numpy())
        assert k == len(head) and uniq[:k].tolist() == head.tolist()
        assert sorted(uniq[k:].tolist()) == sorted(set(rows[n_first:].tolist()) - set(head.tolist()))
        assert torch.equal(uniq[inverse], rows)
        assert int(opt._mark.sum()) == 0  # the scratch table is left clean


def test_duplicate_rows_with_a_non_contiguous_gradient_update_like_a_contiguous_one() -> None:
    """Summing duplicate rows (fused where the kernels apply) takes gradients of any layout."""
    rows = torch.tensor([2, 0, 2, 5])
    g = torch.arange(24, dtype=torch.float32).reshape(3, 8).t()[:, :3]  # 8×3 view, not contiguous
    tables = []
    for grad in (g[:4], g[:4].contiguous()):
        W = nn.Parameter(torch.ones(6, 3))
        Optimizer({}, {"W": W}, Config(momentum=0.1)).step([], {"W": (rows, grad)})
        tables.append(W.detach().clone())
    assert not g[:4].is_contiguous()
    torch.testing.assert_close(tables[0], tables[1], rtol=0, atol=0)
    assert not torch.equal(tables[0], torch.ones(6, 3))
