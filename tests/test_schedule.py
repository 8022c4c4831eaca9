"""Session-parallel schedule (docs/behaviour.md §3) against a plain reference simulation and a hand-made case."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_reference as ref
from gru4rec.training.batching import build_schedule, schedule_positions

torch.set_num_threads(1)


def offsets_of(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def reference_positions(offsets: np.ndarray, batch_size: int, n_sample: int) -> np.ndarray:
    steps = ref.reference_schedule(offsets, batch_size, n_sample)
    pos = np.full((len(steps), batch_size), -1, dtype=np.int64)
    for t, step in enumerate(steps):
        for slot, inp, tgt, _ in step:
            assert tgt == inp + 1
            pos[t, slot] = inp
    return pos


def test_reference_simulation_hand_case() -> None:
    """The reference itself on a case worked out by hand.

    Sessions (event indices): s0 = 0,1,2; s1 = 3 (length 1: no step); s2 = 4,5; s3 = 6..9. B = 2.
    step 0: slot0 0→1 (reset), slot1 4→5 (reset; s1 skipped)
    step 1: slot0 1→2, slot1 6→7 (reset: s2 ended, s3 takes slot 1)
    step 2: slot1 7→8 (s0 ended, nothing left: slot 0 inactive, batch shrinks to 1)
    step 3: slot1 8→9; then nothing is active.
    With n_sample = 0 the epoch stops after step 1 (a single row has no negative).
    """
    off = offsets_of([3, 1, 2, 4])
    expected = [
        [(0, 0, 1, True), (1, 4, 5, True)],
        [(0, 1, 2, False), (1, 6, 7, True)],
        [(1, 7, 8, False)],
        [(1, 8, 9, False)],
    ]
    assert ref.reference_schedule(off, 2, 5) == expected
    assert ref.reference_schedule(off, 2, 0) == expected[:2]
    assert ref.reference_schedule(off, 1, 0) == []


def test_hand_case_engine() -> None:
    off = offsets_of([3, 1, 2, 4])
    np.testing.assert_array_equal(schedule_positions(off, 2, 5), [[0, 4], [1, 6], [-1, 7], [-1, 8]])
    np.testing.assert_array_equal(schedule_positions(off, 2, 0), [[0, 4], [1, 6]])


RNG_LENGTHS = [int(x) for x in np.random.default_rng(11).integers(1, 9, 40)]
LENGTH_SETS = {
    "single_len2": [2],
    "single_len1": [1],
    "all_len1": [1, 1, 1],
    "mixed": [1, 2, 5, 1, 3, 7, 2, 1, 1, 4],
    "equal": [5, 5, 5, 5, 5, 5],
    "long_tail": [2, 2, 2, 30, 2, 2],
    "many": RNG_LENGTHS,
}


@pytest.mark.parametrize("n_sample", [0, 4])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("name", list(LENGTH_SETS))
def test_schedule_matches_reference(name: str, batch_size: int, n_sample: int) -> None:
    off = offsets_of(LENGTH_SETS[name])
    expected = reference_positions(off, batch_size, n_sample)
    got = schedule_positions(off, batch_size, n_sample)
    assert got.dtype == np.int64
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n_sample", [0, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 50])
def test_build_schedule_items_targets_resets(batch_size: int, n_sample: int) -> None:
    lengths = LENGTH_SETS["mixed"] + RNG_LENGTHS[:15]
    off = offsets_of(lengths)
    rng = np.random.default_rng(2)
    items = rng.integers(0, 1000, int(off[-1]))
    steps = ref.reference_schedule(off, batch_size, n_sample)
    sch = build_schedule(items, off, batch_size, n_sample, "cpu")
    assert sch.n_steps == len(steps)
    inputs, targets = sch.inputs.numpy(), sch.targets.numpy()
    active, reset = sch.active.numpy() > 0, sch.keep.numpy()[:, :, 0] == 0
    assert sch.n_events == sum(len(s) for s in steps) == sum(n - 1 for n in lengths if n >= 2) - (
        0 if n_sample > 0 else _dropped_events(off, batch_size))
    for t, step in enumerate(steps):
        exp_active = np.zeros(batch_size, dtype=bool)
        for slot, i, j, rs in step:
            exp_active[slot] = True
            assert inputs[t, slot] == items[i] and targets[t, slot] == items[j]
            assert reset[t, slot] == rs, (t, slot)
        np.testing.assert_array_equal(active[t], exp_active)
        # Inactive slots carry the first active slot's items and never reset (docs/behaviour.md §3: they do not exist).
        first = int(np.argmax(exp_active))
        assert (inputs[t, ~exp_active] == inputs[t, first]).all() and (targets[t, ~exp_active] == targets[t, first]).all()
        assert not reset[t, ~exp_active].any()
        assert not reset[t, ~exp_active].any()
        assert sch.n_active[t] == len(step)
        # inactive slots carry some valid item (the training step masks them; that they update
        # no row is checked in test_step_reference.test_inactive_slot_items_are_not_updated)
        assert set(inputs[t, ~exp_active].tolist()) <= set(items.tolist())
        assert set(targets[t, ~exp_active].tolist()) <= set(items.tolist())


def _dropped_events(off: np.ndarray, batch_size: int) -> int:
    """Events the n_sample == 0 stop rule leaves untrained (from the reference)."""
    full = ref.reference_schedule(off, batch_size, 1)
    cut = ref.reference_schedule(off, batch_size, 0)
    return sum(len(s) for s in full) - sum(len(s) for s in cut)


def test_empty_and_all_short() -> None:
    assert schedule_positions(offsets_of([1, 1]), 4, 2).shape == (0, 4)
    assert schedule_positions(np.array([0], dtype=np.int64), 3, 2).shape == (0, 3)
