"""The engine's exact top-k (gru4rec.inference.scoring): the int8 kernel's bounds against float32 and
float64 scores, and the certified top-k against a brute-force NumPy top-k (with exclusions,
uncertified rows, big batches); the flat clicks the exclusions come in (gru4rec.inference.clicks)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gru4rec.inference.clicks import Clicks
from gru4rec.inference.scoring import CertifiedTopK, Float32TopK, make_topk
from gru4rec.kernels.build import KernelBuildError
from gru4rec.kernels.cpu_features import cpu_flags
from gru4rec.kernels.int8_scores import Int8Kernels, Int8Table, int8_kernels, load_int8_kernels

torch.set_num_threads(1)

kernels, why_not = int8_kernels()
needs_kernel = pytest.mark.skipif(kernels is None, reason=f"the int8 kernel cannot be built here: {why_not}")

_COMMON = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]
#: The kernel's product code for other instruction sets than this CPU's best, built on purpose:
#: every path must compute the same integers and hence the same certified answers.
_PATHS = {"avx2": ["-mavx2", "-mfma"], "scalar": []}


@pytest.fixture(scope="module", params=["native", "avx2", "scalar"])
def built(request: pytest.FixtureRequest) -> Int8Kernels:
    """The kernels as this machine builds them by default, and with the AVX2 and the plain C
    products (where the CPU can run them)."""
    if kernels is None:
        pytest.skip(f"the int8 kernel cannot be built here: {why_not}")
    if request.param == "native":
        return kernels
    if request.param == "avx2" and "avx2" not in cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    try:
        built = load_int8_kernels(flag_sets=(_COMMON + _PATHS[request.param],))
    except KernelBuildError as exc:
        pytest.skip(f"cannot build the {request.param} path: {exc}")
    assert built.simd == request.param
    return built


def trained_like(n: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An item matrix whose scores have a heavy upper tail, as a trained model's do: queries
    are close to a few items' rows (plus noise); rows have different norms; a bias."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, width, generator=g) * (0.5 + torch.rand(n, 1, generator=g)) * 0.1
    b = torch.randn(n, generator=g) * 0.05
    anchors = torch.randint(0, n, (6, 2), generator=g)
    x = torch.tanh(3 * (w[anchors[:, 0]] + w[anchors[:, 1]]) + 0.3 * torch.randn(6, width, generator=g))
    return w, b, x


def numpy_topk(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, k: int, exclude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Brute force in float64: every item's score, exclusions removed, sorted."""
    scores = (x.double().numpy() @ w.double().numpy().T + b.double().numpy()).ravel()
    scores[exclude] = -np.inf
    order = np.argsort(-scores, kind="stable")[:k]
    return order, scores[order]


@pytest.mark.parametrize("width", [64, 37])  # 37: columns padded to a whole group of 4
@pytest.mark.parametrize("batch", [1, 3, 6, 17])  # 17: rows in 3 groups (6 + 6 + 5 on AVX-512)
def test_bounds_hold_for_every_item(built: Int8Kernels, width: int, batch: int) -> None:
    """900 items: the last block of 16 is padding for 12 of its slots."""
    g = torch.Generator().manual_seed(width + batch)
    w = torch.randn(900, width, generator=g) * torch.rand(900, 1, generator=g)
    w[5] = 0.0  # an all-zero row (scale 1, residual 0)
    b = torch.randn(900, generator=g)
    x = torch.randn(batch, width, generator=g) * 3
    x[0, :] = 0.0  # an all-zero query
    table = Int8Table(built, w, b)
    m = 40
    idx, upper = table.candidates(x, m)
    assert idx.shape == (batch, m) and bool((idx >= 0).all())
    assert all(len(set(row.tolist())) == m for row in idx)  # m distinct items per row
    ref32 = torch.addmm(b, x, w.t())  # what recommend() computes
    ref64 = (x.double() @ w.double().t() + b.double()).float()
    outside = torch.ones_like(ref32, dtype=torch.bool).scatter_(1, idx, False)
    for ref in (ref32, ref64):
        assert bool((ref.gather(1, idx) <= upper).all())
        worst_outside = torch.where(outside, ref, torch.full_like(ref, -torch.inf)).max(dim=1).values
        assert bool((worst_outside <= upper.min(dim=1).values).all())
    # The candidates are the items with the largest upper bounds: the true top few are among them.
    assert all(set(ref64[r].topk(3).indices.tolist()) <= set(idx[r].tolist()) for r in range(1, batch))
    score, lower = table.rescore(x, idx)
    np.testing.assert_allclose(score.numpy(), ref64.gather(1, idx).numpy(), rtol=1e-5, atol=1e-5)
    assert bool((lower <= ref32.gather(1, idx)).all()) and bool((lower <= ref64.gather(1, idx)).all())


def numpy_upper_bounds(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> np.ndarray:
    """The bound of int8_scores.c, computed independently in float64 from its definition: rows
    quantised to 8 bits (scale max|w|/127), queries to 7 (scale max|x|/64), the exact integer
    products, the Cauchy-Schwarz terms and float32's rounding allowance."""
    w64, x64, b64 = w.double().numpy(), x.double().numpy(), b.double().numpy()
    scale = torch.where(w.abs().amax(dim=1) > 0, w.abs().amax(dim=1) / 127.0, 1.0)  # float32, as stored
    q = torch.round(w / scale[:, None]).clamp(-127, 127).double().numpy()
    c = scale.double().numpy()
    r, nqh, nw = (np.linalg.norm(v, axis=1) for v in (w64 - c[:, None] * q, c[:, None] * q, w64))
    L = w.shape[1]
    G = (L + 2) * 2.0**-24 / (1 - (L + 2) * 2.0**-24)
    out = []
    for xb in x64:
        a = np.abs(xb).max() / 64 if np.abs(xb).max() > 0 else 1.0
        p = np.clip(np.rint(xb / a), -64, 64)
        f = xb - a * p
        P = q @ p  # exact: integers below 2^53
        delta = np.linalg.norm(a * p) * r + np.linalg.norm(f) * (nqh + r) + G * (np.abs(b64) + np.linalg.norm(xb) * nw)
        out.append(a * c * P + b64 + delta * (1 + 1e-6))
    return np.asarray(out)


def test_upper_bounds_equal_a_numpy_reimplementation(built: Int8Kernels) -> None:
    """Every term of the bound, not only its validity: a bound that dropped or halved a term
    would still hold on most data (here the smallest term, float32's allowance, is ~7e-5; the
    norms are stored rounded up to float32, hence 1e-6). All scores negative (bias -10): the table's padding items,
    whose bound is 0, must still never be returned."""
    g = torch.Generator().manual_seed(4)
    n, width = 901, 40
    w = torch.randn(n, width, generator=g) * torch.rand(n, 1, generator=g)
    b = -10.0 - torch.rand(n, generator=g)
    x = torch.randn(5, width, generator=g)
    table = Int8Table(built, w, b)
    idx, upper = table.candidates(x, 50)
    assert bool((idx >= 0).all()) and bool((idx < n).all())
    want = numpy_upper_bounds(w, b, x)
    np.testing.assert_allclose(upper.double().numpy(), np.take_along_axis(want, idx.numpy(), axis=1), rtol=0, atol=1e-6)
    # and they are the 50 largest of all items' bounds
    np.testing.assert_allclose(np.sort(upper.double().numpy(), axis=1), np.sort(want, axis=1)[:, -50:], rtol=0, atol=1e-6)


def test_a_row_is_certified_when_k_candidates_are_proven_above_the_rest(built: Int8Kernels) -> None:
    """The rule from its definition, with candidates() and rescore(): with c candidates whose
    lower bound is above the smallest candidate upper bound, k = c is certified and k = c + 1
    is not."""
    w, b, x = trained_like(3000, 48, 7)
    table = Int8Table(built, w, b)
    m = 64
    idx, upper = table.candidates(x, m)
    _, lower = table.rescore(x, idx)
    proven = (lower > upper.min(dim=1, keepdim=True).values).sum(dim=1).tolist()
    assert all(0 < c < m for c in proven)
    none = Clicks.none(len(proven))
    assert table.topk(x, proven, none.items, none.offsets, m).certified.all()
    assert not table.topk(x, [c + 1 for c in proven], none.items, none.offsets, m).certified.any()


def test_equal_scores_are_listed_by_item_index(built: Int8Kernels) -> None:
    """Items with identical rows and biases have identical exact scores: the answer lists the
    smaller index first, wherever the candidates' order put them."""
    w, b, x = trained_like(2000, 32, 11)
    best = int(torch.addmm(b, x[:1], w.t()).argmax())
    w, b = w.clone(), b.clone()
    for twin in (1500, 7, 900):  # copies of the best item, before and after it
        w[twin], b[twin] = w[best], b[best]
    rows = Int8Table(built, w, b).topk(x[:1], [4], np.zeros(0, np.int64), np.zeros(2, np.int64), 64)
    assert rows.certified.all()
    assert rows.indices[0].tolist() == sorted([best, 1500, 7, 900])


@needs_kernel
def test_int8_table_rejects_bad_inputs() -> None:
    w = torch.randn(50, 8)
    with pytest.raises(ValueError, match="non-finite"):
        Int8Table(kernels, torch.where(torch.arange(50)[:, None] == 3, torch.nan, w), torch.zeros(50))
    table = Int8Table(kernels, w, torch.zeros(50))
    with pytest.raises(ValueError, match="8 columns"):
        table.candidates(torch.randn(2, 9), 5)
    with pytest.raises(ValueError, match="m must be between 1 and 50"):
        table.candidates(torch.randn(2, 8), 51)
    with pytest.raises(ValueError, match="outside"):
        table.rescore(torch.randn(1, 8), torch.tensor([[50]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_certified_topk_equals_brute_force(built: Int8Kernels, seed: int) -> None:
    w, b, x = trained_like(3000, 48, seed)
    scorer = CertifiedTopK(Int8Table(built, w, b), Float32TopK.linear(w, b), n_candidates=64, max_batch=8)
    rng = np.random.default_rng(seed)
    ks = [1, 5, 20, 7, 3, 10]
    exclude = [rng.choice(3000, size=n, replace=False) for n in (0, 3, 0, 10, 1, 0)]
    # The true top items excluded in row 1: the answer must skip them.
    exclude[1] = numpy_topk(w, b, x[1:2], 3, np.zeros(0, np.int64))[0].ravel()
    got = scorer(x, ks, Clicks.of_rows(exclude))
    for row, (k, ex) in enumerate(zip(ks, exclude)):
        order, scores = numpy_topk(w, b, x[row:row + 1], k, ex)
        np.testing.assert_array_equal(got.indices[row, :k], order.ravel())
        np.testing.assert_allclose(got.scores[row, :k], scores.ravel(), rtol=1e-5, atol=1e-5)
    assert scorer.counts["certified"] == 6 and scorer.counts["float32"] == 0


@needs_kernel
def test_rows_that_cannot_be_certified_are_scored_in_float32() -> None:
    """Row 0 has a heavy-tailed score distribution (certified); row 1 is a zero query, for which
    every score is its bias, and the biases are equal beyond the k-th: ties at the boundary
    can never be certified. Row 2 asks for more items than fit (k > candidates left after
    exclusions)."""
    w, b, x = trained_like(2000, 32, 5)
    b = b.clone()
    b[:] = 0.0
    b[:4] = torch.tensor([3.0, 2.0, 1.0, 0.5])
    x = torch.cat([x[:1], torch.zeros(2, 32)])
    scorer = CertifiedTopK(Int8Table(kernels, w, b), Float32TopK.linear(w, b), n_candidates=32, max_batch=8)
    exclude = [np.zeros(0, np.int64), np.zeros(0, np.int64), np.arange(4, 40)]
    got = scorer(x, [10, 6, 10], Clicks.of_rows(exclude))
    assert scorer.counts == {"certified": 1, "float32": 2}
    # The float32 path's answer: the 4 biased items first, then ties in torch.topk's order.
    ref = torch.addmm(b, x, w.t())
    ref[2, 4:40] = -torch.inf
    for row, k in enumerate([10, 6, 10]):
        top = torch.topk(ref[row], k)
        np.testing.assert_allclose(got.scores[row, :k], top.values.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.indices[1, :4], [0, 1, 2, 3])
    np.testing.assert_array_equal(got.indices[2, :4], [0, 1, 2, 3])
    assert not set(got.indices[2, :10].tolist()) & set(range(4, 40))


@needs_kernel
def test_large_batches_use_the_float32_product() -> None:
    w, b, _ = trained_like(1500, 16, 3)
    x = torch.randn(12, 16)
    scorer = CertifiedTopK(Int8Table(kernels, w, b), Float32TopK.linear(w, b), n_candidates=32, max_batch=8)
    got = scorer(x, [5] * 12, Clicks.none(12))
    assert scorer.counts == {"certified": 0, "float32": 12}
    for row in range(12):
        np.testing.assert_array_equal(got.indices[row, :5], numpy_topk(w, b, x[row:row + 1], 5, np.zeros(0, np.int64))[0].ravel())


def test_float32_topk_with_exclusions_against_numpy() -> None:
    w, b, x = trained_like(400, 24, 9)
    exclude = [np.array([3, 7]), np.zeros(0, np.int64), np.arange(0, 400, 2), np.zeros(0, np.int64), np.array([1]), np.array([0])]
    got = Float32TopK.linear(w, b)(x, [4, 4, 9, 1, 2, 3], Clicks.of_rows(exclude))
    for row, (k, ex) in enumerate(zip([4, 4, 9, 1, 2, 3], exclude)):
        order, scores = numpy_topk(w, b, x[row:row + 1], k, ex)
        np.testing.assert_array_equal(got.indices[row, :k], order.ravel())
        np.testing.assert_allclose(got.scores[row, :k], scores.ravel(), rtol=1e-5, atol=1e-6)


class _Linear:
    """The scoring part of a session model whose scores are ``out·Wyᵀ + By``."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, linear: bool = True) -> None:
        self.w, self.b, self.linear = w, b, linear

    def scores(self, out: torch.Tensor, buffer: torch.Tensor | None = None) -> torch.Tensor:
        return torch.addmm(self.b, out, self.w.t())

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return (self.w, self.b) if self.linear else None


def test_make_topk_chooses_and_refuses() -> None:
    small = _Linear(torch.randn(300, 16), torch.zeros(300))
    assert make_topk(small, "auto").name == "float32"  # cache-sized: no int8 copy
    assert make_topk(small, "float32").name == "float32"
    with pytest.raises(ValueError, match="scoring must be one of"):
        make_topk(small, "fast")
    with pytest.raises(ValueError, match="not larger than the candidates"):
        make_topk(small, "int8", n_candidates=400)
    big = _Linear(torch.randn(1 << 14, 64), torch.zeros(1 << 14))
    with pytest.raises(ValueError, match="has no output layer"):  # a baseline's scores: float32 only
        make_topk(_Linear(big.w, big.b, linear=False), "int8")
    assert make_topk(_Linear(big.w, big.b, linear=False), "auto").name == "float32"
    if kernels is not None:
        assert make_topk(small, "int8", n_candidates=16).name == "int8"
        assert make_topk(big, "auto").name == "int8"


def test_clicks_against_per_row_arrays() -> None:
    """The flat clicks' rows, ages, row selections and row masks against the same done one row
    array at a time."""
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 50, n) for n in (3, 0, 1, 5, 0, 2)]
    clicks = Clicks.of_rows(rows)
    assert clicks.n_rows == 6 and clicks.lengths.tolist() == [3, 0, 1, 5, 0, 2]
    np.testing.assert_array_equal(clicks.rows(), np.concatenate([[r] * len(a) for r, a in enumerate(rows)]))
    np.testing.assert_array_equal(clicks.ages(), np.concatenate([np.arange(len(a))[::-1] for a in rows]))
    pick = np.array([3, 0, 4, 3])
    taken = clicks.take(pick)
    for j, r in enumerate(pick):
        np.testing.assert_array_equal(taken.items[taken.offsets[j]:taken.offsets[j + 1]], rows[r])
    keep = np.array([True, False, False, True, True, False])
    kept = clicks.where(keep)
    for r, a in enumerate(rows):
        np.testing.assert_array_equal(kept.items[kept.offsets[r]:kept.offsets[r + 1]], a if keep[r] else [])
    window = Clicks.window(clicks.items, clicks.offsets, 2, 5)
    for j, r in enumerate(range(2, 5)):
        np.testing.assert_array_equal(window.items[window.offsets[j]:window.offsets[j + 1]], rows[r])
    assert Clicks.none(4).lengths.tolist() == [0, 0, 0, 0]
