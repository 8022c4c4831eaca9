"""Negative sampler (docs/behaviour.md §4): frequencies ∝ support^alpha, store redrawn when used up."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_reference as ref
from gru4rec.training.sampling import SampleStore

torch.set_num_threads(1)

SUPPORT = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 4, 7, 60, 300, 1], dtype=np.int64)
N_DRAWS_ROWS = 300
N_SAMPLE = 1000


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def draw_counts(alpha: float, seed: int = 123) -> np.ndarray:
    store = SampleStore(SUPPORT, alpha, N_SAMPLE, 50_000, "cpu", generator=torch.Generator().manual_seed(seed))
    # clone: a row may be a view into the store, which is redrawn (possibly in place) when used up
    rows = [store.next().clone() for _ in range(N_DRAWS_ROWS)]  # 300 rows, the store holds 50: 6 redraws
    ids = torch.cat(rows).numpy()
    assert ids.min() >= 0 and ids.max() < len(SUPPORT)
    return np.bincount(ids, minlength=len(SUPPORT))


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_frequencies_follow_support_power_alpha(alpha: float) -> None:
    counts = draw_counts(alpha)
    stat = chi_square(counts, ref.sample_probabilities(SUPPORT, alpha))
    # 19 degrees of freedom: mean 19, sd 6.2. P(stat > 90) < 1e-10.
    assert stat < 90, stat
    # ... and the test has power: a wrong alpha is rejected by a wide margin.
    for wrong in (alpha - 0.15, alpha + 0.15):
        if wrong >= 0:
            assert chi_square(counts, ref.sample_probabilities(SUPPORT, wrong)) > 1000, wrong


def test_store_redrawn_when_used_up() -> None:
    n_items = 1000
    store = SampleStore(np.ones(n_items, dtype=np.int64), 0.0, 3, 10, "cpu",
                        generator=torch.Generator().manual_seed(0))  # 10 // 3 = 3 rows per store
    rows = [store.next().clone() for _ in range(10)]
    assert all(r.shape == (3,) and r.dtype == torch.int64 for r in rows)
    flat = [tuple(r.tolist()) for r in rows]
    # 30 draws from 1000 items: duplicate rows would mean the store was replayed, not redrawn
    assert len(set(flat)) == 10
    assert len(set(torch.cat(rows).tolist())) > 20


def test_store_smaller_than_one_row_draws_every_step() -> None:
    store = SampleStore(np.ones(500, dtype=np.int64), 0.5, 8, 3, "cpu", generator=torch.Generator().manual_seed(1))
    rows = [tuple(store.next().tolist()) for _ in range(5)]
    assert len(set(rows)) == 5 and all(len(r) == 8 for r in rows)


def test_seeded_stream_reproducible() -> None:
    def stream(seed: int) -> list[list[int]]:
        st = SampleStore(SUPPORT, 0.5, 7, 20, "cpu", generator=torch.Generator().manual_seed(seed))
        return [st.next().tolist() for _ in range(9)]

    assert stream(5) == stream(5)
    assert stream(5) != stream(6)


def test_zero_support_items_never_drawn_with_positive_alpha() -> None:
    supp = np.array([0, 5, 0, 1, 10], dtype=np.int64)
    store = SampleStore(supp, 1.0, 500, 5000, "cpu", generator=torch.Generator().manual_seed(3))
    ids = torch.cat([store.next().clone() for _ in range(20)]).numpy()
    counts = np.bincount(ids, minlength=5)
    assert counts[0] == 0 and counts[2] == 0
    assert chi_square(counts[[1, 3, 4]], np.array([5, 1, 10]) / 16) < 60


# --------------------------------------------------------------------------- the store's stream


def reference_store(support: np.ndarray, alpha: float, n_rows: int, n_sample: int, seed: int) -> torch.Tensor:
    """The store as one uniform draw of all its numbers, binary-searched (the definition)."""
    cdf = torch.as_tensor(ref_cdf(support, alpha))
    u = torch.rand(n_rows, n_sample, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return torch.searchsorted(cdf, u, right=True)


def ref_cdf(support: np.ndarray, alpha: float) -> np.ndarray:
    w = np.asarray(support, dtype=np.float64) ** alpha
    cdf = np.cumsum(w) / w.sum()
    cdf[-1] = 1.0
    return cdf


@pytest.mark.parametrize("search", ["torch", "kernels"])
def test_chunked_store_is_the_one_call_stream(search: str) -> None:
    """The CPU draws its uniform numbers a chunk at a time: the store and its redraw are exactly
    those of one draw of all of them (the generator's stream did not change), with either lookup."""
    from gru4rec.kernels.cpu import cpu_kernels
    from gru4rec.training.sampling import DRAW_CHUNK, torch_cdf_search

    kernels = cpu_kernels()
    if search == "kernels" and kernels is None:
        pytest.skip("the fused CPU kernels cannot be built here")
    factory = torch_cdf_search if search == "torch" else kernels.inverse_cdf  # type: ignore[union-attr]
    n_sample = 1000
    n_rows = (2 * DRAW_CHUNK + 123) // n_sample  # three chunks, the last one partial
    store = SampleStore(SUPPORT, 0.5, n_sample, n_rows * n_sample, "cpu", generator=torch.Generator().manual_seed(9), search=factory)
    both = reference_store(SUPPORT, 0.5, 2 * n_rows, n_sample, 9)  # the first draw, then the redraw
    first = torch.stack([store.next().clone() for _ in range(n_rows)])
    second = torch.stack([store.next().clone() for _ in range(n_rows)])
    assert store.n_redraws == 1
    assert torch.equal(first, both[:n_rows]) and torch.equal(second, both[n_rows:])


def test_guided_search_is_searchsorted() -> None:
    """The kernels' guide-table lookup gives searchsorted(cdf, u, right=True) exactly: on ties
    (zero-support items), at the cdf's own values, at 0, just below 1, at the guide's boundaries
    k/n and their neighbours, and on catalogues of 1 and 2 items."""
    from gru4rec.kernels.cpu import cpu_kernels

    kernels = cpu_kernels()
    if kernels is None:
        pytest.skip("the fused CPU kernels cannot be built here")
    rng = np.random.default_rng(4)
    supports = [np.array([3]), np.array([0, 2]), np.array([1, 0, 0, 0, 5, 0, 2]), rng.zipf(1.3, 5000) * (rng.random(5000) > 0.3), SUPPORT]
    for support in supports:
        cdf = torch.as_tensor(ref_cdf(support, 0.7))
        search = kernels.inverse_cdf(cdf)
        n_guide = search.guide.numel()
        k = torch.arange(n_guide + 1, dtype=torch.float64) / n_guide
        zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        edges = torch.cat((cdf, k, torch.nextafter(cdf, zero), torch.nextafter(k, one), torch.nextafter(k, zero)))
        u = torch.cat((edges[(edges >= 0) & (edges < 1)], torch.tensor([0.0, np.nextafter(1.0, 0.0)], dtype=torch.float64),
                       torch.rand(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(2))))
        out = torch.empty(u.numel(), dtype=torch.int64)
        search(u, out)
        expected = torch.searchsorted(cdf, u, right=True)
        assert torch.equal(out, expected), support[:10]
        # a guide entry off by some steps (a rounding of u·n or k/n) costs steps, never the answer
        guide = search.guide
        for wrong in (torch.zeros_like(guide), (guide + 3).clamp(max=cdf.numel()), guide.flip(0).contiguous()):
            search.guide = wrong
            search(u, out)
            assert torch.equal(out, expected), support[:10]
        search.guide = guide
    with pytest.raises(ValueError, match="u must be a contiguous float64"):
        search(u.float(), out)
    with pytest.raises(ValueError, match="out must be a contiguous int64"):
        search(u, out[:-1])
