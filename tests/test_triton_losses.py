"""The fused Triton losses (gru4rec/kernels/triton_losses.py) against the PyTorch references.

Every loss × final activation is compared with ``_loss_grad`` (the hand-written gradients) on a
small batch with inactive rows, on columns that are not a multiple of the block (so the column
loop and its tail mask run); a few cases are compared with autograd of ``make_loss``. Without a
CUDA device the kernels run in Triton's interpreter on CPU tensors (tests/conftest.py).
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gru4rec.config import Config  # noqa: E402
from gru4rec.config.activations import parse_activation  # noqa: E402
from gru4rec.kernels import triton_losses as tlosses  # noqa: E402
from gru4rec.kernels.triton_support import triton_unavailable  # noqa: E402
from gru4rec.training import losses  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if triton_unavailable(DEVICE) is not None:
    pytest.skip(f"Triton kernels cannot run here: {triton_unavailable(DEVICE)}", allow_module_level=True)

ELEMENTWISE = ("linear", "elu-0.5", "tanh", "relu", "leaky-0.01", "selu-1.0507-1.6733")
B, S = 6, 35  # C = 41 columns: with block 16, three blocks, the last one partial
BLOCK = 16


def _cases() -> list[tuple[str, str, float, float]]:
    """(loss, final_act, smoothing, bpreg) for every variant the kernels have."""
    cases = []
    for loss, act in (("cross-entropy", "softmax"), ("xe_logit", "softmax_logit")):
        for smoothing in (0.0, 0.2):
            cases.append((loss, act, smoothing, 0.0))
    for act in ELEMENTWISE:
        for bpreg in (0.0, 1.95):
            cases.append(("bpr-max", act, 0.0, bpreg))
        for loss in ("top1-max", "bpr", "top1"):
            cases.append((loss, act, 0.0, 1.0))  # bpreg=1 (the default) must be ignored by these
    return cases


def _batch(b: int, s: int, seed: int, inactive: tuple[int, ...] = (1, 4)) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Scores x (B×C, unmasked), col_valid, row_valid and n_cols as the training step builds them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, b + s, generator=gen) * 1.5
    x[:, :b] += torch.eye(b) * 0.8  # positives a little higher, as after some training
    active = torch.ones(b)
    active[list(inactive)] = 0.0
    col_valid = torch.cat((active, torch.ones(s)))  # trainer.train_step
    n_cols = active.sum() + s
    return x.to(DEVICE), col_valid.to(DEVICE), active.to(DEVICE), n_cols.to(DEVICE)


def _config(loss: str, act: str, smoothing: float, bpreg: float, b: int, s: int) -> Config:
    return Config(loss=loss, final_act=act, smoothing=smoothing, bpreg=bpreg, batch_size=b, n_sample=s)


def _kernel_x(config: Config, x: Tensor, col_valid: Tensor) -> Tensor:
    """The scores the loss sees: the cross-entropy losses get MASK in the masked columns (the bias)."""
    if losses.masks_through_bias(config):
        return x + (1.0 - col_valid) * losses.MASK
    return x.clone()


def _fused(config: Config, x: Tensor, col_valid: Tensor, row_valid: Tensor, n_cols: Tensor, *,
           in_place: bool = False, block: int | None = BLOCK) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, grad, per_row) from the kernels; NaN-filled outputs so that unwritten entries show."""
    b = x.shape[0]
    grad = x if in_place else torch.full_like(x, float("nan"))
    per_row = torch.full((b,), float("nan"), device=x.device)
    loss_out = torch.full((), float("nan"), device=x.device)
    tlosses.loss_grad(
        x, col_valid, row_valid, n_cols, loss=config.loss, act=config.final_activation, bpreg=config.bpreg,
        smoothing=config.smoothing, inv_batch=1.0 / config.batch_size, grad=grad, per_row=per_row,
        loss_out=loss_out, block=block,
    )
    return loss_out, grad, per_row


def test_constants_match_the_reference() -> None:
    assert tlosses.EPS == losses.EPS
    assert tlosses.MASK == losses.MASK


@pytest.mark.parametrize(("loss", "act", "smoothing", "bpreg"), _cases())
def test_matches_loss_grad(loss: str, act: str, smoothing: float, bpreg: float) -> None:
    config = _config(loss, act, smoothing, bpreg, B, S)
    x, col_valid, row_valid, n_cols = _batch(B, S, seed=len(loss) * 7 + len(act))
    xk = _kernel_x(config, x, col_valid)
    ref_loss, ref_grad = losses._loss_grad(config)(xk.clone(), col_valid, row_valid, n_cols)
    got_loss, got_grad, per_row = _fused(config, xk, col_valid, row_valid, n_cols)

    torch.testing.assert_close(got_loss, ref_loss, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, ref_grad, rtol=2e-4, atol=2e-6)
    assert torch.all(got_grad[row_valid == 0] == 0)  # inactive rows: no gradient at all
    assert torch.all(per_row[row_valid == 0] == 0)
    assert got_grad[row_valid == 1].abs().sum() > 0  # the active rows' gradient is really there
    torch.testing.assert_close(per_row.sum(), got_loss, rtol=1e-6, atol=0)  # the second kernel's sum


@pytest.mark.parametrize(("loss", "act", "smoothing", "bpreg"), [
    ("cross-entropy", "softmax", 0.2, 0.0),
    ("xe_logit", "softmax_logit", 0.0, 0.0),
    ("bpr-max", "elu-0.5", 0.0, 1.95),
    ("top1-max", "tanh", 0.0, 0.0),
    ("bpr", "selu-1.0507-1.6733", 0.0, 0.0),
    ("top1", "leaky-0.01", 0.0, 0.0),
])
def test_matches_autograd(loss: str, act: str, smoothing: float, bpreg: float) -> None:
    """The gradient equals autograd of make_loss on the unmasked scores (the mask is additive)."""
    config = _config(loss, act, smoothing, bpreg, B, S)
    x, col_valid, row_valid, n_cols = _batch(B, S, seed=11)
    raw = x.clone().requires_grad_(True)
    ref_loss = losses.make_loss(config)(raw, col_valid, row_valid, n_cols)
    ref_loss.backward()
    got_loss, got_grad, _ = _fused(config, _kernel_x(config, x, col_valid), col_valid, row_valid, n_cols)
    torch.testing.assert_close(got_loss, ref_loss.detach(), rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, raw.grad, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize(("loss", "act", "smoothing"), [
    ("cross-entropy", "softmax", 0.0),
    ("cross-entropy", "softmax", 0.2),
    ("xe_logit", "softmax_logit", 0.2),
    ("bpr-max", "relu", 0.0),
    ("top1-max", "linear", 0.0),
    ("bpr", "elu-0.5", 0.0),
    ("top1", "tanh", 0.0),
])
def test_in_place(loss: str, act: str, smoothing: float) -> None:
    """grad may be x itself: each block is read before it is written, the positive first of all."""
    config = _config(loss, act, smoothing, 1.0, B, S)
    x, col_valid, row_valid, n_cols = _batch(B, S, seed=5)
    xk = _kernel_x(config, x, col_valid)
    ref_loss, ref_grad = losses._loss_grad(config)(xk.clone(), col_valid, row_valid, n_cols)
    got_loss, got_grad, _ = _fused(config, xk, col_valid, row_valid, n_cols, in_place=True)
    assert got_grad.data_ptr() == xk.data_ptr()
    torch.testing.assert_close(got_loss, ref_loss, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, ref_grad, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize(("loss", "act"), [("cross-entropy", "softmax"), ("bpr-max", "elu-0.5")])
def test_wide_rows_default_block(loss: str, act: str) -> None:
    """C = 5,001 with the default block (2,048): three blocks per pass, the last one partial."""
    b, s = 5, 4996
    config = _config(loss, act, 0.0, 1.0, b, s)
    x, col_valid, row_valid, n_cols = _batch(b, s, seed=3, inactive=(2,))
    x[0, 4321] = 9.0  # the row's max far from the first block: the running max must rescale
    xk = _kernel_x(config, x, col_valid)
    ref_loss, ref_grad = losses._loss_grad(config)(xk.clone(), col_valid, row_valid, n_cols)
    got_loss, got_grad, _ = _fused(config, xk, col_valid, row_valid, n_cols, block=None)
    torch.testing.assert_close(got_loss, ref_loss, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, ref_grad, rtol=2e-4, atol=1e-7)


# The interpreter's tl.sigmoid is 1/(1 + exp(−x)) in NumPy, which warns as exp(110) overflows to
# inf on its way to the correct 0 (on a GPU the same inf passes silently).
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_masked_block_and_extreme_scores_stay_finite() -> None:
    """A whole block of masked columns (x ≈ −1e30) and large scores: exp underflows, no NaN/inf."""
    b, s = 4, 60
    x, col_valid, row_valid, n_cols = _batch(b, s, seed=9, inactive=())
    col_valid[16:32] = 0.0  # masked samples (not what a step builds, but what the kernels must take)
    n_cols = col_valid.sum()
    x[:, 40] = 60.0  # exp(60) overflows float32 without the max subtracted
    x[0, 0] = -50.0  # a positive far below the max: p ≈ e^-110, where −log(p + ε) differs from −log p
    for loss, act, smoothing in (("cross-entropy", "softmax", 0.2), ("xe_logit", "softmax_logit", 0.2),
                                 ("bpr-max", "linear", 0.0), ("top1-max", "linear", 0.0)):
        config = _config(loss, act, smoothing, 1.0, b, s)
        xk = _kernel_x(config, x, col_valid)
        ref_loss, ref_grad = losses._loss_grad(config)(xk.clone(), col_valid, row_valid, n_cols)
        got_loss, got_grad, _ = _fused(config, xk, col_valid, row_valid, n_cols)
        assert torch.isfinite(got_loss) and torch.isfinite(got_grad).all(), loss
        torch.testing.assert_close(got_loss, ref_loss, rtol=2e-5, atol=1e-6, msg=loss)
        torch.testing.assert_close(got_grad, ref_grad, rtol=2e-4, atol=2e-6, msg=loss)
        assert torch.all(got_grad[:, 16:32] == 0), loss  # masked columns get no gradient


def test_code_tuple_equals_activation() -> None:
    """act given as (code, p0, p1) computes what the Activation does."""
    config = _config("bpr", "elu-0.5", 0.0, 1.0, B, S)
    x, col_valid, row_valid, n_cols = _batch(B, S, seed=2)
    expected_loss, expected_grad, _ = _fused(config, x.clone(), col_valid, row_valid, n_cols)
    grad, per_row, loss_out = torch.empty_like(x), torch.empty(B, device=DEVICE), torch.empty((), device=DEVICE)
    tlosses.loss_grad(x, col_valid, row_valid, n_cols, loss="bpr", act=(4, 0.5, 0.0), bpreg=0.0, smoothing=0.0,
                      inv_batch=1.0 / B, grad=grad, per_row=per_row, loss_out=loss_out, block=BLOCK)
    assert torch.equal(loss_out, expected_loss) and torch.equal(grad, expected_grad)


def test_a_float64_loss_is_the_float32_sum_converted() -> None:
    """loss_out may be float64 (the epoch loop's type): the same per-row sum, stored converted."""
    config = _config("bpr-max", "elu-0.5", 0.0, 1.0, B, S)
    x, col_valid, row_valid, n_cols = _batch(B, S, seed=3)
    expected_loss, _, per_row = _fused(config, x.clone(), col_valid, row_valid, n_cols)
    loss64 = torch.full((), float("nan"), dtype=torch.float64, device=DEVICE)
    tlosses.loss_grad(x.clone(), col_valid, row_valid, n_cols, loss="bpr-max", act=config.final_activation, bpreg=config.bpreg,
                      smoothing=0.0, inv_batch=1.0 / B, grad=torch.empty_like(x), per_row=torch.empty(B, device=DEVICE),
                      loss_out=loss64, block=BLOCK)
    assert loss64.dtype == torch.float64 and float(loss64) == float(expected_loss) == pytest.approx(float(per_row.sum()), rel=1e-6)


def test_bad_inputs_raise() -> None:
    x, col_valid, row_valid, n_cols = _batch(B, S, seed=1)
    elu = parse_activation("elu-0.5")

    def call(**changes: object) -> None:
        args: dict[str, object] = dict(
            x=x, col_valid=col_valid, row_valid=row_valid, n_cols=n_cols, loss="bpr-max", act=elu, bpreg=1.0,
            smoothing=0.0, inv_batch=1.0 / B, grad=torch.empty_like(x), per_row=torch.empty(B, device=DEVICE),
            loss_out=torch.empty((), device=DEVICE),
        )
        args.update(changes)
        tensors = [args.pop(k) for k in ("x", "col_valid", "row_valid", "n_cols")]
        tlosses.loss_grad(*tensors, **args)  # type: ignore[arg-type]

    bad: list[tuple[dict[str, object], str]] = [
        ({"loss": "hinge"}, "unknown loss"),
        ({"x": x[0]}, "B×C"),
        ({"x": x[:, :3]}, "C >= B"),
        ({"x": x.double()}, "float32"),
        ({"x": torch.randn(S + B, B, device=DEVICE).t()}, "contiguous"),
        ({"col_valid": col_valid[:-1]}, "col_valid must have shape"),
        ({"row_valid": row_valid.double()}, "row_valid must be float32"),
        ({"n_cols": n_cols.reshape(1)}, "n_cols must have shape"),
        ({"grad": torch.empty(B, S, device=DEVICE)}, "grad must have shape"),
        ({"per_row": torch.empty(B + 1, device=DEVICE)}, "per_row must have shape"),
        ({"loss_out": torch.empty(1, device=DEVICE)}, "loss_out must have shape"),
        ({"smoothing": 0.1}, "cross-entropy losses only"),
        ({"loss": "xe_logit", "smoothing": 1.0}, "smoothing"),
        ({"bpreg": -1.0}, "bpreg"),
        ({"inv_batch": 0.0}, "inv_batch"),
        ({"act": None}, "final activation"),
        ({"act": parse_activation("softmax")}, "elementwise"),
        ({"act": (9, 1.0, 0.0)}, "activation code"),
        ({"block": 24}, "power of two"),
    ]
    if torch.cuda.is_available():
        bad.append(({"per_row": torch.empty(B)}, "per_row is on"))
    for changes, message in bad:
        with pytest.raises(ValueError, match=message):
            call(**changes)
