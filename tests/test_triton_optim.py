"""The Triton optimiser kernels (gru4rec/kernels/triton_optim.py) against the PyTorch optimiser of
gru4rec/training/optim.py (the ``torch`` backend with scratch rows): parameters and every state table
after a few steps, duplicate rows within and across the parts of a table, clipping, the scratch
and owner tables left zero, untouched rows left bitwise alone, and bad inputs refused.

Without a CUDA device the kernels run in Triton's interpreter (tests/conftest.py) on CPU tensors.
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from gru4rec.config import Config  # noqa: E402
from gru4rec.kernels.triton_support import triton_unavailable  # noqa: E402
from gru4rec.training.backend import Backend, select_backend  # noqa: E402
from gru4rec.training.optim import EPS, Optimizer  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if triton_unavailable(DEVICE):
    pytest.skip(f"Triton kernels unavailable: {triton_unavailable(DEVICE)}", allow_module_level=True)

from gru4rec.kernels import triton_optim as to  # noqa: E402

N_ROWS = 50
METHODS = ["sgd", "adagrad", "rmsprop", "adadelta", "adam"]
STATE_KEYS = ("acc", "dacc", "m", "vel")


@pytest.fixture
def on_device() -> Iterator[None]:
    """The tensors a test makes are on the kernels' device (the CPU under the interpreter)."""
    previous = torch.get_default_device()
    torch.set_default_device(DEVICE)
    try:
        yield
    finally:
        torch.set_default_device(previous)


def _torch_backend() -> Backend:
    """The reference: the PyTorch rules, duplicates summed through scratch tables as on a GPU."""
    return select_backend("cpu", unique_rows=False, cpu_kernels=False, fused_gpu=False)


def _config(method: str, momentum: float, lmbd: float, grad_cap: float) -> Config:
    return Config(adapt=method, momentum=momentum, lmbd=lmbd, grad_cap=grad_cap, learning_rate=0.05)


@dataclass
class Case:
    """The same parameters and gradients twice: for the reference optimiser and for the kernels."""

    config: Config
    width: int
    dense: dict[str, Tensor]
    sparse: dict[str, Tensor]
    #: per step: (dense gradients, {table: [(rows, g), ...]})
    steps: list[tuple[list[Tensor], dict[str, list[tuple[Tensor, Tensor]]]]] = field(default_factory=list)


def _case(method: str, momentum: float, lmbd: float, grad_cap: float, width: int, *, n_steps: int = 3, seed: int = 0,
          k_wy: tuple[int, int] = (64, 48), k_by: int = 40, high: int = 20) -> Case:
    """Dense parameters of 47 elements; ``Wy`` (N×width) in two parts and ``By`` (N) in one, the
    rows drawn from [0, high) so that they repeat, within a part and across the two."""
    gen = torch.Generator().manual_seed(seed)
    dense = {"W": torch.randn(3, 5, generator=gen) * 0.1, "b": torch.randn(32, generator=gen) * 0.1}
    sparse = {"Wy": torch.randn(N_ROWS, width, generator=gen) * 0.1, "By": torch.randn(N_ROWS, generator=gen) * 0.1}
    case = Case(_config(method, momentum, lmbd, grad_cap), width, dense, sparse)
    for _ in range(n_steps):
        g_dense = [torch.randn(p.shape, generator=gen) for p in dense.values()]
        parts = {
            "Wy": [(torch.randint(0, high, (k,), generator=gen), torch.randn(k, width, generator=gen)) for k in k_wy],
            "By": [(torch.randint(0, high, (k_by,), generator=gen), torch.randn(k_by, generator=gen))],
        }
        case.steps.append((g_dense, parts))
    return case


def _reference(case: Case) -> Optimizer:
    """The PyTorch optimiser after the case's steps (on clones)."""
    dense = {k: nn.Parameter(v.clone(), requires_grad=False) for k, v in case.dense.items()}
    sparse = {k: nn.Parameter(v.clone(), requires_grad=False) for k, v in case.sparse.items()}
    opt = Optimizer(dense, sparse, case.config, _torch_backend())
    for g_dense, parts in case.steps:
        opt.step([g.clone() for g in g_dense], {name: [(r.clone(), g.clone()) for r, g in ps] for name, ps in parts.items()})
    return opt


@dataclass
class Fused:
    """The kernels' side: the tables, their state, scratch and owner tables, and the bound updates."""

    flat: Tensor
    tables: dict[str, Tensor]
    state: dict[str, dict[str, Tensor | None]]
    scratch: dict[str, Tensor]
    owner: dict[str, Tensor]
    t: Tensor
    sq_total: Tensor
    dense_update: to.TritonDenseUpdate
    table_updates: dict[str, to.TritonTableUpdate]
    norms: list[float] = field(default_factory=list)


def _rule(config: Config) -> dict[str, float | str]:
    """The optimiser's constants as the reference derives them from the config."""
    method, params = config.adapt, config.resolved_adapt_params
    return dict(
        method=method, lr=1.0 if method == "adadelta" else config.learning_rate, momentum=config.momentum, lmbd=config.lmbd,
        decay=params[1] if method == "adam" else (params[0] if method in ("rmsprop", "adadelta") else 0.0),
        beta1=params[0] if method == "adam" else 0.0, eps=EPS, grad_cap=config.grad_cap,
    )


def _fused(case: Case) -> Fused:
    rule = _rule(case.config)

    def new_state(p: Tensor) -> dict[str, Tensor | None]:
        keys = to.UpdateRule(**rule).state_keys  # type: ignore[arg-type]
        return {k: (torch.zeros_like(p) if k in keys else None) for k in STATE_KEYS}

    flat = torch.cat([p.reshape(-1) for p in case.dense.values()]).to(DEVICE)
    tables = {k: v.clone().to(DEVICE) for k, v in case.sparse.items()}
    state = {"dense": new_state(flat), **{k: new_state(p) for k, p in tables.items()}}
    scratch = {k: torch.zeros_like(p) for k, p in tables.items()}
    owner = {k: torch.zeros(p.shape[0], dtype=torch.int32, device=DEVICE) for k, p in tables.items()}
    return Fused(
        flat, tables, state, scratch, owner,
        t=torch.zeros((), device=DEVICE), sq_total=torch.zeros((), device=DEVICE),
        dense_update=to.TritonDenseUpdate(flat, state["dense"], **rule),  # type: ignore[arg-type]
        table_updates={k: to.TritonTableUpdate(p, state[k], scratch[k], owner[k], **rule) for k, p in tables.items()},  # type: ignore[arg-type]
    )


def _fused_step(f: Fused, g_dense: list[Tensor], parts: dict[str, list[tuple[Tensor, Tensor]]], rule: to.UpdateRule) -> None:
    """One step as the fused GPU path runs it: scatter every part, the norms, update every part."""
    g_flat = torch.cat([g.reshape(-1) for g in g_dense]).to(DEVICE)
    parts = {name: [(r.to(DEVICE), g.to(DEVICE)) for r, g in ps] for name, ps in parts.items()}
    if rule.method == "adam":
        f.t += 1
    for name, ps in parts.items():
        offset = 0
        for rows, g in ps:
            f.table_updates[name].scatter(rows, g, offset)
            offset += rows.shape[0]
    sq = f.sq_total if rule.grad_cap > 0 else None
    if sq is not None:
        f.sq_total.zero_()
        f.dense_update.add_sq_norm(g_flat, f.sq_total)
        for name, ps in parts.items():
            offset = 0
            for rows, _ in ps:
                f.table_updates[name].add_sq_norm(rows, f.sq_total, offset)
                offset += rows.shape[0]
        f.norms.append(float(f.sq_total.sqrt()))
    t = f.t if rule.method == "adam" else None
    for name, ps in parts.items():
        offset = 0
        for rows, _ in ps:
            f.table_updates[name].update(rows, offset, t, sq)
            offset += rows.shape[0]
    f.dense_update.update(g_flat, t, sq)


def _run_fused(case: Case) -> Fused:
    f = _fused(case)
    rule = to.UpdateRule(**_rule(case.config))  # type: ignore[arg-type]
    for g_dense, parts in case.steps:
        _fused_step(f, g_dense, parts, rule)
        for name in f.tables:  # left zero after every step
            assert not f.scratch[name].any(), f"{name}: scratch not zero after the step"
            assert not f.owner[name].any(), f"{name}: owner not zero after the step"
    return f


def _close(actual: Tensor, expected: Tensor, what: str) -> None:
    """Equal to float32 rounding, relative to the table's magnitude (its state tables range from
    1e-7, adadelta's dacc, to 10, a sum of squares)."""
    scale = float(expected.abs().max()) if expected.numel() else 1.0
    torch.testing.assert_close(actual.cpu(), expected, rtol=2e-5, atol=2e-6 * scale, msg=lambda m: f"{what}: {m}")


def _compare(f: Fused, opt: Optimizer) -> None:
    _close(f.flat, opt.flat, "dense parameters")
    for name, p in opt.sparse.items():
        _close(f.tables[name], p.detach(), f"{name}")
    for name in ("dense", *opt.sparse):
        ref = opt.state[name]
        for key in STATE_KEYS:
            expected, actual = getattr(ref, key), f.state[name][key]
            assert (expected is None) == (actual is None), f"{name}.{key}: present in one implementation only"
            if expected is not None:
                assert actual is not None and expected.abs().max() > 0, f"{name}.{key} never moved"
                _close(actual, expected, f"{name}.{key}")


def _touched(case: Case, name: str) -> Tensor:
    rows = torch.cat([r for _, parts in case.steps for r, _ in parts[name]])
    mask = torch.zeros(N_ROWS, dtype=torch.bool)
    mask[rows] = True
    return mask


# ---------------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("grad_cap", [0.0, 1.0])
@pytest.mark.parametrize("lmbd", [0.0, 0.01])
@pytest.mark.parametrize("momentum", [0.0, 0.4])
@pytest.mark.parametrize("method", METHODS)
def test_matches_the_pytorch_optimiser(method: str, momentum: float, lmbd: float, grad_cap: float) -> None:
    case = _case(method, momentum, lmbd, grad_cap, width=7)
    opt = _reference(case)
    f = _run_fused(case)
    _compare(f, opt)
    if grad_cap > 0:  # the cap must bind, or the clipping would go untested
        assert min(f.norms) > 2 * grad_cap
    for name, p0 in case.sparse.items():  # rows no step used: bitwise as they were, state untouched
        untouched = ~_touched(case, name)
        assert untouched.sum() >= 20
        assert torch.equal(f.tables[name].cpu()[untouched], p0[untouched])
        for key, st in f.state[name].items():
            if st is not None:
                assert not st.cpu()[untouched].any(), f"{name}.{key} moved at rows no step used"


@pytest.mark.parametrize(
    "method, width, k_wy, k_by, grad_cap",
    [
        ("adam", 33, (64, 48), 40, 1.0),  # several programs per part (16 positions a tile)
        ("adadelta", 33, (64, 48), 300, 1.0),  # By: several programs of 128 positions
        ("rmsprop", 200, (24, 16), 40, 1.0),  # rows wider than one column chunk (128)
        ("adagrad", 1, (64, 48), 40, 1.0),  # Wy of width 1 as an N×1 table
        ("sgd", 7, (64, 48), 40, 1e4),  # a cap above the norm: the scale is 1, not cap / norm
    ],
)
def test_matches_the_pytorch_optimiser_at_other_widths(method: str, width: int, k_wy: tuple[int, int], k_by: int, grad_cap: float) -> None:
    case = _case(method, 0.4, 0.01, grad_cap, width, k_wy=k_wy, k_by=k_by, seed=1)
    f = _run_fused(case)
    _compare(f, _reference(case))
    assert (min(f.norms) > 2 * grad_cap) == (grad_cap < 10)


def test_adam_bias_corrections_late_in_training() -> None:
    """t read from the device: 1 − β^t at a large t, where β2^t is far from 1."""
    case = _case("adam", 0.0, 0.0, 0.0, 7, n_steps=2, seed=2)
    dense = {k: nn.Parameter(v.clone(), requires_grad=False) for k, v in case.dense.items()}
    sparse = {k: nn.Parameter(v.clone(), requires_grad=False) for k, v in case.sparse.items()}
    opt = Optimizer(dense, sparse, case.config, _torch_backend())
    opt.t.fill_(2999.0)
    f = _fused(case)
    f.t.fill_(2999.0)
    rule = to.UpdateRule(**_rule(case.config))  # type: ignore[arg-type]
    for g_dense, parts in case.steps:
        opt.step([g.clone() for g in g_dense], {n: [(r.clone(), g.clone()) for r, g in ps] for n, ps in parts.items()})
        _fused_step(f, g_dense, parts, rule)
    assert float(f.t) == 3001.0
    _compare(f, opt)


@pytest.mark.usefixtures("on_device")
def test_offsets_make_a_row_in_two_parts_count_once() -> None:
    """A row in both parts of a table is owned by one position, the last, when the second part's
    positions are numbered after the first's; numbered from 0 again, position 0 of each part
    owns row 3, and the norm counts the row twice."""
    rows, g = torch.tensor([3]), torch.tensor([[3.0, 4.0]])  # ‖2·g‖² = 100
    for offset, expected in ((1, 100.0), (0, 200.0)):
        upd = _sgd_table(5, 2)
        sq = torch.zeros(())
        upd.scatter(rows, g, 0)
        upd.scatter(rows, g, offset)
        upd.add_sq_norm(rows, sq, 0)
        upd.add_sq_norm(rows, sq, offset)
        assert float(sq) == expected


def _sgd_table(n: int, width: int) -> to.TritonTableUpdate:
    """The update of an n×width table of zeros (sgd: no state), with zeroed scratch and owner tables."""
    return to.TritonTableUpdate(torch.zeros(n, width), {}, torch.zeros(n, width), torch.zeros(n, dtype=torch.int32),
                                method="sgd", lr=0.1)


# ---------------------------------------------------------------------------------------- one step by hand


def test_one_clipped_adam_step_by_hand() -> None:
    """One adam step with clipping through the bound updates, call by call: the squared norm of
    the step is the dense gradient's plus every summed row's, the dense gradient is left as it
    was, the tables end as the reference's and the scratch and owner tables zero again."""
    case = _case("adam", 0.4, 0.01, 1.0, 7, n_steps=1, seed=3)
    opt = _reference(case)
    f = _fused(case)
    g_dense, parts = case.steps[0]
    g_flat = torch.cat([g.reshape(-1) for g in g_dense]).to(DEVICE)
    summed = {name: torch.zeros_like(p) for name, p in case.sparse.items()}  # on the CPU
    for name, ps in parts.items():
        for rows, g in ps:
            summed[name].index_add_(0, rows, g)
    expected_sq = (g_flat.cpu() ** 2).sum() + sum((s**2).sum() for s in summed.values())
    parts = {name: [(r.to(DEVICE), g.to(DEVICE)) for r, g in ps] for name, ps in parts.items()}
    f.t += 1
    for name, ps in parts.items():
        offset = 0
        for rows, g in ps:
            f.table_updates[name].scatter(rows, g, offset)
            offset += rows.shape[0]
    f.dense_update.add_sq_norm(g_flat, f.sq_total)
    for name, ps in parts.items():
        offset = 0
        for rows, _ in ps:
            f.table_updates[name].add_sq_norm(rows, f.sq_total, offset)
            offset += rows.shape[0]
    torch.testing.assert_close(f.sq_total.cpu(), expected_sq, rtol=1e-5, atol=0.0)
    for name, ps in parts.items():
        offset = 0
        for rows, _ in ps:
            f.table_updates[name].update(rows, offset, f.t, f.sq_total)
            offset += rows.shape[0]
    before = g_flat.clone()
    f.dense_update.update(g_flat, f.t, f.sq_total)
    assert torch.equal(g_flat, before), "the dense gradient is left unchanged"
    _compare(f, opt)
    for name in f.tables:
        assert not f.scratch[name].any() and not f.owner[name].any()


@pytest.mark.usefixtures("on_device")
def test_scatter_sums_duplicates_and_names_the_last_position() -> None:
    rows = torch.tensor([3, 1, 3, 3, 0, 1])
    g = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    upd = _sgd_table(5, 2)
    upd.scatter(rows, g, offset=10)
    expected = torch.zeros(5, 2).index_add_(0, rows, g)
    assert torch.equal(upd.scratch, expected)
    assert upd.owner.tolist() == [15, 16, 0, 14, 0]  # offset + last position + 1; 0: no position


def test_rows_out_of_range_are_skipped() -> None:
    """A row outside [0, N) cannot be refused without a host sync: its position is skipped (no
    write outside the tables: each is a view into a buffer with a guard row on either side), and
    the valid positions are updated as the reference updates them alone."""
    p0 = torch.randn(N_ROWS, 7)
    rows = torch.tensor([-1, 4, N_ROWS, 4, 9, N_ROWS + 100])
    g = torch.randn(6, 7)
    keep = (rows >= 0) & (rows < N_ROWS)

    def guarded(t: Tensor) -> tuple[Tensor, Tensor]:
        buf = torch.full((t.shape[0] + 2, *t.shape[1:]), 7, dtype=t.dtype, device=DEVICE)
        buf[1:-1] = t.to(DEVICE)
        return buf, buf[1:-1]

    (p_buf, p), (acc_buf, acc) = guarded(p0), guarded(torch.zeros_like(p0))
    (s_buf, scratch), (o_buf, owner) = guarded(torch.zeros_like(p0)), guarded(torch.zeros(N_ROWS, dtype=torch.int32))
    upd = to.TritonTableUpdate(p, {"acc": acc}, scratch, owner, method="adagrad", lr=0.05)
    upd.scatter(rows.to(DEVICE), g.to(DEVICE))
    upd.update(rows.to(DEVICE))
    for buf in (p_buf, acc_buf, s_buf, o_buf):
        assert (buf[0] == 7).all() and (buf[-1] == 7).all(), "a write outside the table"
    ref_p = nn.Parameter(p0.clone(), requires_grad=False)
    opt = Optimizer({}, {"Wy": ref_p}, Config(adapt="adagrad", learning_rate=0.05), _torch_backend())
    opt.step([], {"Wy": (rows[keep], g[keep])})
    _close(p, ref_p.detach(), "Wy")
    _close(acc, opt.state["Wy"].acc, "Wy.acc")  # type: ignore[arg-type]
    assert not scratch.any() and not owner.any()


@pytest.mark.usefixtures("on_device")
def test_empty_rows_and_empty_buffer_are_no_ops() -> None:
    p = torch.randn(N_ROWS, 3)
    before = p.clone()
    upd = to.TritonTableUpdate(p, {}, torch.zeros_like(p), torch.zeros(N_ROWS, dtype=torch.int32), method="sgd", lr=0.1)
    empty = torch.zeros(0, dtype=torch.int64)
    upd.scatter(empty, torch.zeros(0, 3))
    upd.update(empty)
    assert torch.equal(p, before)
    flat = torch.zeros(0)
    to.TritonDenseUpdate(flat, {}, method="sgd", lr=0.1).update(torch.zeros(0))


# ---------------------------------------------------------------------------------------- checks


def _bound(method: str = "adam", grad_cap: float = 1.0, momentum: float = 0.4) -> tuple[to.TritonTableUpdate, Tensor]:
    p = torch.randn(N_ROWS, 7)
    state = {k: torch.zeros_like(p) for k in STATE_KEYS}
    upd = to.TritonTableUpdate(p, state, torch.zeros_like(p), torch.zeros(N_ROWS, dtype=torch.int32), method=method, lr=0.1,
                               momentum=momentum, decay=0.999, beta1=0.9, grad_cap=grad_cap)
    return upd, p


def test_bad_rules_raise() -> None:
    with pytest.raises(ValueError, match="unknown optimiser method"):
        to.UpdateRule("adamw", 0.1)
    with pytest.raises(ValueError, match="grad_cap"):
        to.UpdateRule("sgd", 0.1, grad_cap=-1.0)
    with pytest.raises(ValueError, match="finite"):
        to.UpdateRule("sgd", float("nan"))
    with pytest.raises(ValueError, match="decay"):
        to.UpdateRule("adam", 0.1, decay=1.0, beta1=0.9)


@pytest.mark.usefixtures("on_device")
def test_bad_tables_raise() -> None:
    p = torch.randn(N_ROWS, 7)
    owner = torch.zeros(N_ROWS, dtype=torch.int32)
    full = {k: torch.zeros_like(p) for k in STATE_KEYS}
    kw = dict(method="adam", lr=0.1, decay=0.999, beta1=0.9)
    with pytest.raises(ValueError, match="needs the state table 'm'"):
        to.TritonTableUpdate(p, {"acc": torch.zeros_like(p)}, torch.zeros_like(p), owner, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs the state table 'vel'"):
        to.TritonTableUpdate(p, {"acc": full["acc"]}, torch.zeros_like(p), owner, method="adagrad", lr=0.1, momentum=0.5)
    with pytest.raises(ValueError, match="acc"):
        to.TritonTableUpdate(p, {**full, "acc": torch.zeros(N_ROWS, 6)}, torch.zeros_like(p), owner, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scratch"):
        to.TritonTableUpdate(p, full, torch.zeros(N_ROWS, 7, dtype=torch.float64), owner, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scratch"):
        to.TritonTableUpdate(p, full, p, owner, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="owner"):
        to.TritonTableUpdate(p, full, torch.zeros_like(p), owner.long(), **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="owner"):
        to.TritonTableUpdate(p, full, torch.zeros_like(p), owner[:-1], **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="contiguous float32"):
        to.TritonTableUpdate(p.t(), full, torch.zeros_like(p), owner, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-D or 2-D"):
        to.TritonTableUpdate(p.reshape(5, 10, 7), full, torch.zeros_like(p), owner, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be the parameter"):
        to.TritonDenseUpdate(p, {"acc": p}, method="adagrad", lr=0.1)


@pytest.mark.usefixtures("on_device")
def test_bad_step_inputs_raise() -> None:
    upd, _ = _bound()
    rows, g = torch.randint(0, 20, (8,)), torch.randn(8, 7)
    sq, t = torch.zeros(()), torch.ones(())
    with pytest.raises(ValueError, match="rows"):
        upd.scatter(rows.float(), g)
    with pytest.raises(ValueError, match="rows"):
        upd.scatter(rows.reshape(2, 4), g)
    with pytest.raises(ValueError, match="g must have 56 elements"):
        upd.scatter(rows, torch.randn(8, 6))
    with pytest.raises(ValueError, match="one gradient row per position"):
        upd.scatter(rows, torch.randn(7, 8))
    with pytest.raises(ValueError, match="contiguous float32"):
        upd.scatter(rows, g.double())
    with pytest.raises(ValueError, match="contiguous float32"):
        upd.scatter(rows, torch.randn(7, 8).t())
    with pytest.raises(ValueError, match="offset"):
        upd.scatter(rows, g, -1)
    with pytest.raises(ValueError, match="int32"):
        upd.scatter(rows, g, 2**31 - 4)
    with pytest.raises(ValueError, match="t .*step count"):
        upd.update(rows, 0, None, sq)
    with pytest.raises(ValueError, match="t .*step count"):
        upd.update(rows, 0, torch.ones(1), sq)
    with pytest.raises(ValueError, match="sq_total"):
        upd.update(rows, 0, t, None)
    with pytest.raises(ValueError, match="sq_total"):
        upd.add_sq_norm(rows, torch.zeros((), dtype=torch.float64))
    dense = to.TritonDenseUpdate(torch.zeros(10), {"acc": torch.zeros(10)}, method="adagrad", lr=0.1, grad_cap=1.0)
    with pytest.raises(ValueError, match="g must have 10 elements"):
        dense.update(torch.zeros(9), None, sq)
    with pytest.raises(ValueError, match="sq_total"):
        dense.update(torch.zeros(10))
    with pytest.raises(ValueError, match="sq_total"):
        to.dense_sq_norm(torch.zeros(10), torch.zeros(1))
    with pytest.raises(ValueError, match="owner"):
        to.TritonTableUpdate(torch.zeros(N_ROWS, 7), {}, torch.zeros(N_ROWS, 7), torch.zeros(N_ROWS - 1, dtype=torch.int32),
                             method="sgd", lr=0.1)
    assert not upd.scratch.any() and not upd.owner.any(), "a refused call launched nothing"


def test_importing_gru4rec_does_not_import_the_kernels() -> None:
    code = "import sys, gru4rec, gru4rec.kernels, gru4rec.training.optim; assert 'gru4rec.kernels.triton_optim' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("method, momentum, grad_cap", [("adagrad", 0.4, 0.0), ("adam", 0.0, 0.5), ("rmsprop", 0.3, 0.5)])
def test_a_riding_bias_table_updates_like_its_own_launches(method: str, momentum: float, grad_cap: float) -> None:
    """By carried in the launches of the Wy part with the same rows (scatter, norm, update) ends
    where By's own scatter, norm and update end — parameters, state, and clean scratch tables."""
    gen = torch.Generator().manual_seed(3)
    n, w, k = 30, 7, 50
    rule = dict(method=method, lr=0.1, momentum=momentum, lmbd=0.0, decay=0.9 if method != "adam" else 0.99,
                beta1=0.9 if method == "adam" else 0.0, grad_cap=grad_cap)
    results = []
    for riding in (False, True):
        wy, by = torch.randn(n, w, generator=torch.Generator().manual_seed(1)), torch.randn(n, generator=torch.Generator().manual_seed(2))
        keys = to.UpdateRule(**rule).state_keys
        tables = {}
        for name, p in (("Wy", wy), ("By", by)):
            state = {key: torch.zeros_like(p).to(DEVICE) for key in keys}
            tables[name] = to.TritonTableUpdate(p.to(DEVICE), state, torch.zeros_like(p).to(DEVICE),
                                                torch.zeros(n, dtype=torch.int32, device=DEVICE), **rule)
        t, sq = torch.zeros((), device=DEVICE), torch.zeros((), device=DEVICE)
        gen.manual_seed(4)
        for _ in range(2):
            rows = torch.randint(0, 12, (k,), generator=gen).to(DEVICE)
            g_wy, g_by = torch.randn(k, w, generator=gen).to(DEVICE), torch.randn(k, generator=gen).to(DEVICE)
            t += 1
            sq.zero_()
            if riding:
                tables["Wy"].scatter(rows, g_wy, 0, (tables["By"], g_by))
                tables["Wy"].add_sq_norm(rows, sq, 0, tables["By"])
                tables["Wy"].update(rows, 0, t, sq, tables["By"])
            else:
                tables["Wy"].scatter(rows, g_wy)
                tables["By"].scatter(rows, g_by)
                tables["Wy"].add_sq_norm(rows, sq)
                tables["By"].add_sq_norm(rows, sq)
                tables["Wy"].update(rows, 0, t, sq)
                tables["By"].update(rows, 0, t, sq)
        results.append(
            {
                f"{name}.{key}": v.cpu()
                for name, tab in tables.items()
                for key, v in [("p", tab.p), ("scratch", tab.scratch)] + list(tab.state.items())
            }
        )
        assert int(tables["Wy"].owner.abs().sum()) == 0
    for key, value in results[0].items():
        torch.testing.assert_close(results[1][key], value, rtol=1e-6, atol=1e-7, msg=lambda m, key=key: f"{key}: {m}")
    assert not torch.equal(results[1]["By.p"], torch.randn(n, generator=torch.Generator().manual_seed(2)))  # By did change
    with pytest.raises(ValueError, match="bias table"):
        tables["Wy"].update(rows, 0, t, sq, tables["Wy"])


@pytest.mark.parametrize("method, momentum, grad_cap", [("adagrad", 0.4, 0.0), ("adam", 0.2, 0.5)])
def test_two_parts_in_one_launch_update_like_two_launches(method: str, momentum: float, grad_cap: float) -> None:
    """Shared mode's Wy: the input rows' part and the score columns' part (with By riding on the
    second) in one scatter and one update launch end where one launch per part ends; a By row
    that only the first part has (an input item never scored) is left untouched, momentum or not."""
    gen = torch.Generator().manual_seed(5)
    n, w = 30, 7
    rule = dict(method=method, lr=0.1, momentum=momentum, lmbd=0.0, decay=0.99 if method == "adam" else 0.0,
                beta1=0.9 if method == "adam" else 0.0, grad_cap=grad_cap)
    rows1 = torch.tensor([25, 3, 26, 3, 7])  # 25 and 26 only here
    results = []
    for combined in (False, True):
        tables = {}
        for name, p in (("Wy", torch.randn(n, w, generator=torch.Generator().manual_seed(1))),
                        ("By", torch.randn(n, generator=torch.Generator().manual_seed(2)))):
            state = {key: torch.ones_like(p).to(DEVICE) * 0.1 for key in to.UpdateRule(**rule).state_keys}
            tables[name] = to.TritonTableUpdate(p.to(DEVICE), state, torch.zeros_like(p).to(DEVICE),
                                                torch.zeros(n, dtype=torch.int32, device=DEVICE), **rule)
        wy, by = tables["Wy"], tables["By"]
        t, sq = torch.zeros((), device=DEVICE), torch.zeros((), device=DEVICE)
        gen.manual_seed(6)
        for _ in range(2):
            rows2 = torch.randint(0, 12, (40,), generator=gen)
            g1, g2, g_b = torch.randn(5, w, generator=gen), torch.randn(40, w, generator=gen), torch.randn(40, generator=gen)
            r1, r2, g1, g2, g_b = (x.to(DEVICE) for x in (rows1, rows2, g1, g2, g_b))
            t += 1
            sq.zero_()
            if combined:
                wy.scatter(r1, g1, 0, (by, g_b), (r2, g2))
                wy.add_sq_norm(r1, sq, 0, by, r2)
                wy.update(r1, 0, t, sq, by, r2)
            else:
                wy.scatter(r1, g1, 0)
                wy.scatter(r2, g2, 5, (by, g_b))
                wy.add_sq_norm(r1, sq, 0)
                wy.add_sq_norm(r2, sq, 5, by)
                wy.update(r1, 0, t, sq)
                wy.update(r2, 5, t, sq, by)
        results.append(
            {
                f"{name}.{key}": v.cpu()
                for name, tab in tables.items()
                for key, v in [("p", tab.p), ("scratch", tab.scratch)] + list(tab.state.items())
            }
        )
        assert int(wy.owner.abs().sum()) == 0
    for key, value in results[0].items():
        torch.testing.assert_close(results[1][key], value, rtol=1e-6, atol=1e-7, msg=lambda m, key=key: f"{key}: {m}")
    by0 = torch.randn(n, generator=torch.Generator().manual_seed(2))
    assert torch.equal(results[1]["By.p"][[25, 26]], by0[[25, 26]])  # By rows of input-only items: untouched
    assert not torch.equal(results[1]["By.p"][3], by0[3])
