"""Row ranges run side by side on Python threads (gru4rec.machine.threads.RowWorkers) and their use by the
evaluation on a busy machine: the ranges cover every row once, run at the same time, pass errors
on, and an evaluation that scores and ranks in row ranges gives exactly the ranks of one that
does not."""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from gru4rec import GRU4Rec
from gru4rec.datasets.synthetic import generate
from gru4rec.evaluation import evaluate
from gru4rec.machine import cpus, threads
from gru4rec.machine.threads import RowWorkers


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_the_ranges_cover_every_row_once_and_evenly(parts: int) -> None:
    with RowWorkers(parts) as workers:
        for n in [0, 1, 2, 3, 5, 7, 64, 101]:
            ranges = workers.ranges(n)
            rows = [r for lo, hi in ranges for r in range(lo, hi)]
            assert rows == list(range(n)), (parts, n)
            assert len(ranges) <= parts and all(hi > lo for lo, hi in ranges)
            sizes = [hi - lo for lo, hi in ranges]
            assert not sizes or max(sizes) - min(sizes) <= 1


def test_the_parts_run_side_by_side_and_the_caller_takes_the_first() -> None:
    barrier = threading.Barrier(2, timeout=10)  # breaks unless both parts are running at once
    seen: list[tuple[int, int, int, str]] = []

    def part(i: int, lo: int, hi: int) -> None:
        barrier.wait()
        seen.append((i, lo, hi, threading.current_thread().name))

    with RowWorkers(2) as workers:
        workers.run(part, 10)
    assert sorted(s[:3] for s in seen) == [(0, 0, 5), (1, 5, 10)]
    names = {s[0]: s[3] for s in seen}
    assert names[0] == threading.current_thread().name and names[1].startswith("gru4rec-rows")


@pytest.mark.parametrize("failing", [0, 1])
def test_an_error_is_raised_once_every_part_has_ended(failing: int) -> None:
    done: list[int] = []

    def part(i: int, lo: int, hi: int) -> None:
        if i == failing:
            raise ValueError(f"part {i} failed")
        time.sleep(0.05)
        done.append(i)

    with RowWorkers(2) as workers, pytest.raises(ValueError, match=f"part {failing} failed"):
        workers.run(part, 4)
    assert done == [1 - failing]  # the other part finished before the error came out


def test_row_workers_need_two_parts() -> None:
    with pytest.raises(ValueError, match="at least 2 parts"):
        RowWorkers(1)


@pytest.mark.parametrize(("mode", "boost"), [("standard", 0.0), ("conservative", 0.0), ("median", 0.0), ("standard", 0.7)])
def test_a_busy_evaluation_ranks_in_row_ranges_with_the_same_results(mode: str, boost: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    model = GRU4Rec("layers=16,n_sample=32,n_epochs=1,batch_size=16,sample_store_size=320", device="cpu", threads=1)
    events = generate(n_sessions=700, n_items=300, seed=3)
    sessions = events["SessionId"].unique()
    model.fit(events[events["SessionId"].isin(sessions[:400])], progress=False)
    test = events[events["SessionId"].isin(sessions[400:])]
    if boost:
        model = model.with_repeat_boost(boost)  # the boost's additions between the split scores and ranks
    split: list[int] = []
    run = RowWorkers.run

    def counting(self: RowWorkers, fn, n: int) -> None:  # type: ignore[no-untyped-def]
        split.append(n)
        run(self, fn, n)

    monkeypatch.setattr(RowWorkers, "run", counting)

    monkeypatch.setattr(cpus.LoadMeter, "others_load", lambda self, *args, **kwargs: 0.0)
    chosen: list[int] = []

    def result(busy: bool):  # type: ignore[no-untyped-def]
        with threads.using_threads(None):
            run = threads.current_memory()
            assert run is not None
            run.busy_until = 1e18 if busy else 0.0  # a collapse just seen by the run: one OpenMP thread
            evaluated = evaluate(model, test, cutoffs=(1, 5, 20), mode=mode, batch_size=128, return_ranks=True)
            chosen.append(run.decisions["evaluation"].threads)
            return evaluated

    quiet = result(busy=False)
    assert split == [] and chosen == [2]
    busy = result(busy=True)
    assert chosen == [2, 1]
    assert len(split) >= 6 and min(split) >= 64  # the step, the scores and the ranks of every step with 64 rows or more
    assert np.array_equal(busy.ranks, quiet.ranks)
    assert busy.recall == quiet.recall and busy.mrr == quiet.mrr and busy.coverage == quiet.coverage


def test_a_fixed_thread_count_never_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed count (``--threads N``) is exactly that many threads: even on a busy machine no row
    ranges run beside them."""
    made: list[int] = []
    real_init = RowWorkers.__init__

    def init(self: RowWorkers, parts: int) -> None:
        made.append(parts)
        real_init(self, parts)

    monkeypatch.setattr(RowWorkers, "__init__", init)
    real_memory = threads.ThreadMemory.__init__

    def busy_memory(self: threads.ThreadMemory, **options: Any) -> None:
        real_memory(self, **options)
        self.busy_until = 1e18  # a collapse just seen by every run: an online choice holds one thread

    monkeypatch.setattr(threads.ThreadMemory, "__init__", busy_memory)
    events = generate(n_sessions=300, n_items=100, seed=5)
    sessions = events["SessionId"].unique()
    model = GRU4Rec("layers=8,n_sample=16,n_epochs=1,batch_size=16,sample_store_size=160", device="cpu", threads=1)
    model.fit(events[events["SessionId"].isin(sessions[:200])], progress=False)
    for fixed in (1, 2):
        with threads.using_threads(fixed):
            evaluate(model, events[events["SessionId"].isin(sessions[200:])], batch_size=128)
    assert made == []
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with threads.using_threads(None):  # chosen online: the same evaluation splits
        evaluate(model, events[events["SessionId"].isin(sessions[200:])], batch_size=128)
    assert made == [2]
