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
