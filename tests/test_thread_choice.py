"""The online thread-count choice (gru4rec/machine/threads.py ThreadChoice) from made-up step timings, and
its use by training, evaluation and the run folder: fixed counts (``threads=N``, ``--threads``,
``OMP_NUM_THREADS``) are never changed. No timing is measured here: the steps' times are given."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.datasets.synthetic import generate, write_synthetic
from gru4rec.evaluation import evaluator
from gru4rec.machine import cpus, threads
from gru4rec.tracking.runs import epoch_record
from gru4rec.training import loop
from test_threads import record_threads_in_training

TINY = "layers=8,n_sample=16,n_epochs=2,batch_size=8,sample_store_size=160"


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs on a machine that is not busy (no other process's load seen). (Nothing is
    remembered from one test to the next: a run's choices share its own ThreadMemory.)"""
    monkeypatch.setattr(cpus.LoadMeter, "others_load", lambda self, *args, **kwargs: 0.0)


class FakeMachine:
    """A thread count and the time one step takes at each count (changeable mid-run), in units of
    1/1024 s, which add up without rounding."""

    def __init__(self, ms: dict[int, float], threads: int = 2) -> None:
        self.ms = dict(ms)
        self.threads = threads
        self.steps_at: dict[int, int] = {}

    def apply(self, n: int) -> None:
        self.threads = n

    def current(self) -> int:
        return self.threads

    def choice(self, candidates: list[int], **options: Any) -> threads.ThreadChoice:
        options.setdefault("load", lambda: 0.0)
        return threads.ThreadChoice(candidates, workload="test", apply=self.apply, current=self.current, **options)

    def run(self, choice: threads.ThreadChoice, steps: int) -> None:
        for _ in range(steps):
            self.steps_at[self.threads] = self.steps_at.get(self.threads, 0) + 1
            choice.observe(self.ms[self.threads] / 1024)


@pytest.mark.parametrize(("ms", "want"), [({1: 2.0, 2: 1.0}, 2), ({1: 1.0, 2: 1.5}, 1), ({1: 1.0, 2: 20.0}, 1)])
def test_the_faster_of_two_counts_is_kept(ms: dict[int, float], want: int) -> None:
    machine = FakeMachine(ms, threads=2)
    choice = machine.choice([2, 1], trial_steps=40, warmup_steps=3)
    with choice:
        assert machine.threads == 1  # one thread first: it never collapses, and bounds the others' time
        machine.run(choice, 2 * (40 + 3))
        assert choice.chosen == want and machine.threads == want and choice.comparisons == 1
        machine.run(choice, 40)  # holding: no new comparison while the times stay
        assert choice.comparisons == 1 and machine.threads == want
    assert machine.threads == 2  # the count from before the ``with``
    decision = choice.memory.decisions["test"]
    assert decision == choice.decision() and decision.threads == want and decision.online
    assert decision.seconds == pytest.approx({n: t / 1024 for n, t in ms.items()})
    assert decision.as_dict()["chosen"] == "online"
    assert decision.as_dict()["ms"] == pytest.approx({"1": ms[1] * 1e3 / 1024, "2": ms[2] * 1e3 / 1024}, abs=1e-4)
    if ms[2] >= 2 * ms[1]:  # a collapsing count stops once it has spent one thread's 40 steps' time,
        assert machine.steps_at[2] == 2  # its warm-up included: 2 of its 3 warm-up steps here


def test_a_slowdown_compares_again_and_switches_then_a_quiet_machine_is_noticed() -> None:
    machine = FakeMachine({1: 2.0, 2: 1.0})
    choice = machine.choice([1, 2], trial_steps=20, warmup_steps=2, recheck_windows=3, max_recheck_windows=12)
    with choice:
        machine.run(choice, 2 * 22)
        assert choice.chosen == 2 and choice.comparisons == 1
        machine.ms = {1: 2.2, 2: 30.0}  # another process takes a core: spinning at 2 threads collapses
        before = dict(machine.steps_at)
        machine.run(choice, 20)  # one slow window could be the scheduler's noise: no comparison yet
        assert choice.comparisons == 1 and machine.threads == 2
        machine.run(choice, 20 + 22 + 2)  # the second slow window in a row, one thread's measurement, 2 threads' again
        assert choice.chosen == 1 and machine.threads == 1 and choice.comparisons == 2
        # one thread beat the slow window, so 2 threads are measured afresh: they stop at their warm-up,
        # which took one thread's whole trial (a collapse is not a moment's slowdown)
        assert machine.steps_at[2] - before[2] == 40 + 2
        machine.ms = {1: 2.2, 2: 1.1}  # quiet again: found at the next re-check (3 windows at 1 thread,
        machine.run(choice, 2 + 3 * 20 + 22 + 1)  # after its warm-up: the count came back from 2 threads)
        assert choice.chosen == 2 and choice.comparisons == 3


def test_single_slow_windows_of_a_noisy_machine_do_not_compare_again() -> None:
    machine = FakeMachine({1: 2.0, 2: 1.0})
    choice = machine.choice([1, 2], trial_steps=10, warmup_steps=0, recheck_windows=64, max_recheck_windows=64)
    with choice:
        machine.run(choice, 20)
        assert choice.comparisons == 1 and machine.threads == 2
        for window in range(40):  # every other window 1.6x slower (beside busy processes: the scheduler)
            machine.ms = {1: 2.0, 2: 1.6 if window % 2 else 1.0}
            machine.run(choice, 10)
        assert choice.comparisons == 1 and machine.steps_at[1] == 10


def test_rechecks_of_a_steady_machine_grow_rarer() -> None:
    """Holding one thread (the faster on this machine), the choice re-checks whether the machine
    became quiet, less and less often."""
    machine = FakeMachine({1: 1.0, 2: 2.0})
    choice = machine.choice([1, 2], trial_steps=10, warmup_steps=0, recheck_windows=2, max_recheck_windows=8)
    at: list[int] = []
    with choice:
        for step in range(1, 400):
            machine.run(choice, 1)
            if choice.comparisons > len(at):
                at.append(step)
    # the first comparison: 10 steps at 1 thread (10 ms), then 2 threads until they spent that (5
    # steps); each re-check runs 2 threads until the window's time is spent (5 steps) and comes
    # after 2, 4, 8, 8... windows of 10
    assert at[:5] == [15, 15 + 20 + 5, 40 + 40 + 5, 85 + 80 + 5, 170 + 80 + 5]
    assert choice.chosen == 1


def test_holding_the_most_threads_a_steady_machine_is_not_rechecked() -> None:
    """Issue 50 item 8: on a quiet machine the most threads win, and periodic re-checks (one
    thread for a window, each a short run's loss) can find nothing there: a machine that becomes
    busy shows as slow windows instead (test_after_the_back_off_a_busy_machine_still_ends_at_one_thread)."""
    machine = FakeMachine({1: 2.0, 2: 1.0})
    choice = machine.choice([1, 2], trial_steps=10, warmup_steps=0, recheck_windows=2, max_recheck_windows=8)
    with choice:
        machine.run(choice, 1000)
    assert choice.chosen == 2 and choice.comparisons == 1
    assert machine.steps_at[1] == 10  # the first comparison's one-thread trial alone


def test_a_slowdown_of_a_moment_does_not_hand_the_run_to_a_slower_count() -> None:
    """Issue 50 item 8: two slow windows at 2 threads — the host's own swing, over by the time one
    thread is measured — must not make the run hold one thread until the next re-check: the kept
    count is measured afresh once one thread beats its slow window."""
    machine = FakeMachine({1: 1.5, 2: 1.0})
    choice = machine.choice([1, 2], trial_steps=20, warmup_steps=2, recheck_windows=64, max_recheck_windows=64)
    with choice:
        machine.run(choice, 2 * 22)
        assert choice.chosen == 2 and choice.comparisons == 1
        machine.ms = {1: 1.5, 2: 2.5}  # two windows of every 2-thread step 2.5x slower ...
        machine.run(choice, 40)
        machine.ms = {1: 1.5, 2: 1.0}  # ... and the moment has passed
        ones = machine.steps_at[1]
        machine.run(choice, 22 + 22 + 200)
    assert choice.chosen == 2 and choice.comparisons == 2
    assert machine.steps_at[1] - ones == 22  # one thread's measurement, not the 64 windows until the next re-check
    assert choice.decision().seconds == pytest.approx({1: 1.5 / 1024, 2: 1.0 / 1024})  # the fresh measurements


def swinging(machine: FakeMachine, choice: threads.ThreadChoice, swings: int) -> None:
    """``swings`` times: every count 2x slower for 25 steps (2.5 windows of 10), then 200 steps
    at the usual speed."""
    usual = dict(machine.ms)
    for _ in range(swings):
        machine.ms = {n: 2 * t for n, t in usual.items()}
        machine.run(choice, 25)
        machine.ms = dict(usual)
        machine.run(choice, 200)


def test_comparisons_that_find_every_count_slowed_alike_grow_rarer() -> None:
    """Issue 50 item 8: the host slows every count alike for a few windows at a time; the first such
    swing compares again (and keeps 2 threads), the later ones wait for more slow windows in a row
    than they last, instead of running one thread at every swing."""
    machine = FakeMachine({1: 1.5, 2: 1.0})
    choice = machine.choice([1, 2], trial_steps=10, warmup_steps=0, recheck_windows=1000, max_recheck_windows=1000)
    with choice:
        machine.run(choice, 20)
        swinging(machine, choice, 10)
    assert choice.chosen == 2 and choice.comparisons == 2  # the first comparison and the first swing's
    # the first comparison's 10 steps, then the swing's until it had spent the slow window's time
    # (5 slowed steps, 4 after the swing): the kept count's window stood, nothing measured afresh
    assert machine.steps_at[1] == 10 + 9


@pytest.mark.parametrize(("busy", "windows"), [({1: 1.8, 2: 2.9}, 4), ({1: 2.2, 2: 30.0}, 2)])
def test_after_the_back_off_a_busy_machine_still_ends_at_one_thread(busy: dict[int, float], windows: int) -> None:
    """Issue 50 item 8 keeps the busy behaviour: after swings that backed the slow-window trigger
    off, a machine that becomes busy still ends at one thread — a collapse of 2.9x (beside one busy
    process: 1.6x one thread's time) after the backed-off 4 slow windows, one of 30x after 2."""
    machine = FakeMachine({1: 1.5, 2: 1.0})
    choice = machine.choice([1, 2], trial_steps=10, warmup_steps=0, recheck_windows=1000, max_recheck_windows=1000)
    with choice:
        machine.run(choice, 20)
        swinging(machine, choice, 3)
        assert choice.chosen == 2 and choice.comparisons == 2
        machine.ms = dict(busy)
        steps = 0
        while choice.comparisons == 2 and steps < 1000:
            machine.run(choice, 1)
            steps += 1
        assert choice.chosen == 1 and machine.threads == 1
    # the slow windows (the first one partly slow: the swings left the window 6 steps in), one thread's
    # 10 steps, and 2 threads measured afresh until they spent one thread's time (or 5 steps at twice it)
    assert windows * 10 <= steps <= (windows + 1) * 10 + 10 + 7
    assert choice.memory.busy_until > 0  # remembered: the run's next choices start at one thread


def test_a_run_that_decided_before_starts_from_that_count_and_verifies_it() -> None:
    """Issue 50 item 8: a choice of a workload the run has decided before (a validation after the
    first) starts at that count and verifies it after one window — one thread then stops once it
    has spent that window's time — instead of a first comparison that starts at one thread."""
    run = threads.ThreadMemory(load=lambda: 0.0)
    machine = FakeMachine({1: 1.5, 2: 1.0})
    first = machine.choice([1, 2], trial_steps=10, warmup_steps=0, memory=run)
    with first:
        machine.run(first, 20)
    assert first.chosen == 2 and machine.steps_at == {1: 10, 2: 10}
    machine.steps_at.clear()
    second = machine.choice([1, 2], trial_steps=10, warmup_steps=0, memory=run)
    with second:
        assert machine.threads == 2 and second.chosen == 2
        machine.run(second, 10 + 7)
        assert second.comparisons == 1 and second.chosen == 2 and machine.steps_at == {2: 10, 1: 7}
        machine.run(second, 7 * 10)  # then the usual interval: no re-check before the 8th window
        assert second.comparisons == 1
    assert run.decisions["test"] == second.decision()


def test_a_collapse_seen_by_one_choice_starts_the_next_at_one_thread() -> None:
    now = [100.0]
    machine = FakeMachine({1: 1.0, 2: 4.0})
    run = threads.ThreadMemory(load=lambda: 0.0)  # one run's choices share what they saw
    first = machine.choice([1, 2], trial_steps=10, warmup_steps=0, clock=lambda: now[0], memory=run)
    with first:
        machine.run(first, 30)
    assert first.chosen == 1 and machine.steps_at[2] == 3  # 2 threads spent 1 thread's 10 steps' time
    second = machine.choice([1, 2], trial_steps=10, warmup_steps=0, clock=lambda: now[0], memory=run)
    with second:
        machine.run(second, 15)  # an evaluation right after: holds one thread, no comparison
    assert second.chosen == 1 and second.comparisons == 0 and machine.steps_at[2] == 3
    short = machine.choice([1, 2], trial_steps=10, warmup_steps=0, compare_first=False, clock=lambda: now[0], memory=run)
    with short:  # too short to compare, but a collapse was just seen: one thread
        machine.run(short, 5)
    assert short.chosen == 1 and machine.steps_at[2] == 3
    now[0] += threads.BUSY_MEMORY_S + 1  # long after: compare again
    machine.ms = {1: 1.0, 2: 1.25}  # slower, not collapsed: nothing is remembered
    third = machine.choice([1, 2], trial_steps=10, warmup_steps=0, clock=lambda: now[0], memory=run)
    with third:
        machine.run(third, 25)
    assert third.comparisons == 1 and machine.steps_at[2] > 3
    fourth = machine.choice([1, 2], trial_steps=10, warmup_steps=0, clock=lambda: now[0], memory=run)
    with fourth:
        machine.run(fourth, 25)
    assert fourth.comparisons == 1
    short = machine.choice([1, 2], trial_steps=10, warmup_steps=0, compare_first=False, clock=lambda: now[0], memory=run)
    with short:  # too short to compare on a machine that is not busy: the most threads
        assert machine.threads == 2
        machine.run(short, 5)
    assert short.chosen == 2 and short.comparisons == 0
    elsewhere = machine.choice([1, 2], trial_steps=10, warmup_steps=0, clock=lambda: now[0])
    assert elsewhere.memory is not run and elsewhere.memory.decisions == {"test": elsewhere.decision()}


def test_a_comparison_of_slow_steps_is_bounded_by_time_not_by_steps() -> None:
    # a wide configuration: ~0.2 s a step at one thread; 200 steps each would take a minute
    machine = FakeMachine({1: 200.0, 2: 100.0})
    choice = machine.choice([1, 2], trial_steps=200, trial_seconds=0.5, warmup_steps=1)
    with choice:
        machine.run(choice, 1 + threads.MIN_TRIAL_UNITS + 1 + 6)
    # one thread: 5 steps (the fewest; 0.98 s); two threads: past 0.5 s at the 6th step
    assert machine.steps_at == {1: 1 + threads.MIN_TRIAL_UNITS, 2: 1 + 6}
    assert choice.chosen == 2 and choice.comparisons == 1


@pytest.mark.parametrize(("load", "remembered", "want"), [(0.0, False, 2), (None, False, 2), (0.4, False, 2),
                                                          (0.5, False, 1), (1.7, False, 1), (0.0, True, 1)])
def test_a_short_workload_holds_one_thread_on_a_busy_machine_and_never_compares(
        load: float | None, remembered: bool, want: int, monkeypatch: pytest.MonkeyPatch) -> None:
    run = threads.ThreadMemory(load=lambda: load)
    if remembered:
        run.busy_until = 1e9
    machine = FakeMachine({1: 1.0, 2: 1.0}, threads=1)
    short = machine.choice([1, 2], trial_steps=3, warmup_steps=0, compare_first=False, load=lambda: load, memory=run)
    with short:
        assert machine.threads == want and short.chosen == want
        machine.ms = {1: 50.0, 2: 50.0}  # much slower windows: still no comparison (a short workload holds)
        machine.run(short, 30)
    assert short.comparisons == 0 and machine.steps_at == {want: 30}
    # a long workload after a collapse holds one thread, and compares later; without one it compares first
    long = machine.choice([1, 2], load=lambda: load, memory=run)
    assert long.chosen == (1 if remembered else None)


@pytest.mark.parametrize(("later", "want"), [(1.7, 1), (0.0, 2), (None, 2)])
def test_a_short_workload_of_a_new_run_does_not_wait_for_the_load_and_looks_once_later(later: float | None, want: int) -> None:
    """A run with no load figure yet (its meter is younger than its window): the short workload starts
    at the most threads at once — a standalone evaluation would else wait 0.2 s for one — and looks
    once after LOOK_AGAIN_S seconds of its work, holding one thread from there if the machine is busy."""
    looks: list[float | None] = [None, later, 3.0]
    run = threads.ThreadMemory(load=lambda: looks.pop(0))
    machine = FakeMachine({1: 10.0, 2: 10.0})  # 10/1024 s a unit: LOOK_AGAIN_S is the 21st unit
    short = machine.choice([1, 2], trial_steps=3, warmup_steps=0, compare_first=False, memory=run, load=None)
    with short:
        assert machine.threads == 2 and len(looks) == 2
        machine.run(short, 20)
        assert len(looks) == 2 and machine.threads == 2
        machine.run(short, 1)  # past LOOK_AGAIN_S: the one look
        assert len(looks) == 1 and machine.threads == want and short.chosen == want
        machine.run(short, 100)
    assert len(looks) == 1 and short.comparisons == 0
    assert machine.steps_at == ({2: 121} if want == 2 else {2: 21, 1: 100})
    assert run.decisions["test"].threads == want


#: LoadMeter.others_load as gru4rec.machine.cpus defines it (the autouse fixture stubs it).
REAL_OTHERS_LOAD = cpus.LoadMeter.others_load


def test_others_load_is_the_cpus_busy_time_less_this_processs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import types

    mask = sorted(os.sched_getaffinity(0))
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")

    def write(busy_ticks: int, outside: int) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice: idle and iowait are not work
        lines = ["cpu  1 1 1 1 1 1 1 1 0 0"]
        lines += [f"cpu{c} {busy_ticks} 0 0 {10 ** 6 + busy_ticks} 77 0 0 0 0 0" for c in mask]
        lines.append(f"cpu{max(mask) + 1} {outside} 0 0 5 0 0 0 0 0")  # outside the mask: not counted
        stat.write_text("\n".join(lines) + "\nintr 1 2 3\n")

    clock, own = [10.0], [3.0]
    monkeypatch.setattr(cpus, "_PROC_STAT", stat)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(cpus, "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
    monkeypatch.setattr(os, "times", lambda: types.SimpleNamespace(user=own[0], system=0.5))
    write(100, 0)
    meter = cpus.LoadMeter()
    assert REAL_OTHERS_LOAD(cpus.LoadMeter(), 0.2) is not None  # another meter's look moves nothing of this one's
    slept.clear()
    clock[0] = 10.0
    # 0.05 s after the meter was made, with no window measured yet: asked not to wait, it says nothing
    # yet; else it waits for the rest of one (this process alone ran)
    clock[0] += 0.05
    own[0] += 0.05 * len(mask)
    write(100 + round(0.05 * tick), 10 ** 6)
    assert REAL_OTHERS_LOAD(meter, 0.2, wait=False) is None and slept == []
    assert REAL_OTHERS_LOAD(meter, 0.2) == pytest.approx(0.0, abs=1e-9)
    assert slept == [pytest.approx(0.15)]
    # 2 s later every CPU of the mask has been busy 1.5 s more, 1 s of it this process's: others used 1.5n - 1 CPU-s
    clock[0] += 2.0
    own[0] += 1.0
    write(100 + round(0.05 * tick) + round(1.5 * tick), 10 ** 6)
    busy = (1.5 * len(mask) - 1.0) / 2.0
    assert REAL_OTHERS_LOAD(meter, 0.2) == pytest.approx(busy)
    # 0.05 s later (only this process ran): too short a window, so the last figure, without waiting ...
    clock[0] += 0.05
    own[0] += 0.05 * len(mask)
    write(100 + round(0.05 * tick) + round(1.55 * tick), 10 ** 6)
    assert REAL_OTHERS_LOAD(meter, 0.2) == pytest.approx(busy)
    assert len(slept) == 1
    # ... and the window grows on: 1 s later the 1.05 s since the last figure, this process's own work only
    clock[0] += 1.0
    assert REAL_OTHERS_LOAD(meter, 0.2) == pytest.approx(0.0, abs=1e-9)
    assert len(slept) == 1
    monkeypatch.setattr(cpus, "_PROC_STAT", tmp_path / "missing")
    clock[0] += 1.0
    assert REAL_OTHERS_LOAD(meter, 0.2) is None


def test_one_candidate_is_a_fixed_count() -> None:
    machine = FakeMachine({3: 1.0}, threads=3)
    choice = machine.choice([3])
    with choice:
        machine.ms = {3: 50.0}
        machine.run(choice, 1000)
    assert machine.steps_at == {3: 1000} and choice.comparisons == 0
    assert choice.memory.decisions["test"] == threads.ThreadDecision("test", 3, online=False)
    with pytest.raises(ValueError, match="positive integers"):
        threads.ThreadChoice([])
    with pytest.raises(ValueError, match="positive integers"):
        threads.ThreadChoice([0, 2])


def test_online_choice_only_where_the_count_is_not_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with threads.using_threads(None):
        assert threads.threads_fixed() is None
        assert threads.online_choice("x").candidates == [1, 2]
        with threads.using_threads(3):
            assert threads.threads_fixed() == 3 and threads.online_choice("x").candidates == [3]
        assert threads.threads_fixed() is None
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert threads.threads_fixed() == 2 and threads.online_choice("x").candidates == [2]


def small_choices(module: Any, monkeypatch: pytest.MonkeyPatch) -> list[threads.ThreadChoice]:
    """Make ``module``'s online choices measure 3 steps per count (and keep them)."""
    made: list[threads.ThreadChoice] = []

    def online_choice(workload: str, **_: Any) -> threads.ThreadChoice:
        choice = threads.online_choice(workload, trial_steps=3, warmup_steps=0)
        made.append(choice)
        return choice

    monkeypatch.setattr(module, "online_choice", online_choice)
    return made


def test_training_chooses_its_threads_unless_they_are_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    made = small_choices(loop, monkeypatch)
    seen = record_threads_in_training(monkeypatch)
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    events = generate(n_sessions=80, n_items=20, seed=1)
    records: list[dict[str, Any]] = []
    before = torch.get_num_threads()
    GRU4Rec(TINY, device="cpu").fit(events, progress=False, callback=lambda info: records.append(epoch_record(info)))
    assert torch.get_num_threads() == before
    (choice,) = made
    assert choice.candidates == [1, 2] and choice.comparisons >= 1  # told every step: it compared both
    assert seen[:4] == [1, 1, 1, 2]  # one thread first, then two
    assert records[-1]["threads"] == choice.memory.decisions["training"].as_dict()  # the latest comparison that ended
    assert threads.last_decision("training") is None  # the run's memory went with the run
    assert records[-1]["threads"]["chosen"] == "online" and set(records[-1]["threads"]["ms"]) == {"1", "2"}
    made.clear()
    seen.clear()
    records.clear()
    GRU4Rec(TINY, device="cpu", threads=2).fit(events, progress=False, callback=lambda info: records.append(epoch_record(info)))
    assert set(seen) == {2} and made[0].candidates == [2]
    assert records[-1]["threads"] == {"workload": "training", "threads": 2, "chosen": "fixed", "ms": {}}


def test_evaluation_chooses_its_threads_unless_they_are_fixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gru4rec.evaluation import evaluate

    made = small_choices(evaluator, monkeypatch)
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    data = write_synthetic(tmp_path / "d", n_sessions=300, n_items=30, seed=2, test_days=6)
    model = GRU4Rec(TINY, device="cpu", threads=1).fit(data["train_full"], progress=False)
    before = torch.get_num_threads()
    with threads.using_threads(None):  # the default: 2 threads here, chosen online
        chosen = evaluate(model, data["test"], batch_size=4)
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    (choice,) = made
    assert choice.candidates == [1, 2] and choice.comparisons >= 1
    with threads.using_threads(2):
        fixed = evaluate(model, data["test"], batch_size=4)
    assert made[1].candidates == [2] and made[1].comparisons == 0
    # the thread count does not change the ranks
    assert chosen.recall == fixed.recall and chosen.mrr == pytest.approx(fixed.mrr, rel=1e-6)


def test_the_server_worker_chooses_its_threads_from_the_batches() -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import threading

    from gru4rec.inference import Engine
    from gru4rec.serve.batcher import Job, MicroBatcher
    from gru4rec.serve.state import MemoryStore

    events = generate(n_sessions=80, n_items=20, seed=1)
    model = GRU4Rec(TINY, device="cpu", threads=1).fit(events, progress=False)
    engine = Engine(model)
    applied: list[tuple[int, str]] = []
    observed: list[float] = []
    machine = FakeMachine({1: 1.0, 2: 1.0}, threads=2)

    def apply(n: int) -> None:
        applied.append((n, threading.current_thread().name))
        machine.apply(n)

    class Recording(threads.ThreadChoice):
        def observe(self, seconds: float, work: float = 1.0) -> None:
            observed.append(work)
            super().observe(seconds, work)

    choice = Recording([1, 2], workload="serving", trial_steps=1, warmup_steps=0, apply=apply, current=machine.current)
    batcher = MicroBatcher(engine, MemoryStore(max_sessions=100, ttl_s=600.0), max_batch=3, threads=choice)
    ids = model.item_map.to_list()
    futures = [batcher.submit(Job("event", f"s{i % 5}", engine.index_of([ids[i]])[0], 3)) for i in range(10)]
    futures.append(batcher.submit(Job("delete", "s0")))
    batcher.start()
    for future in futures:
        future.result(timeout=30)
    batcher.stop()
    # entered on the worker thread (torch's count is per thread), told each batch's rows, left as it found it
    assert applied and {name for _, name in applied} == {"gru4rec-batcher"} and applied[0][0] == 1
    assert sum(observed) == 10 and max(observed) <= 3 and choice.comparisons >= 1
    assert machine.threads == 2


def test_the_first_decision_says_when_the_cpus_are_busy(caplog: pytest.LogCaptureFixture) -> None:
    """A newcomer read '1: 0.211 ms, 2: 71.8 ms' as a fault: the line says what a collapse is."""
    note = "other processes keep the CPUs busy"
    for ms, busy in (({1: 1.0, 2: 40.0}, True), ({1: 2.0, 2: 1.0}, False)):
        caplog.clear()
        machine = FakeMachine(ms)
        choice = machine.choice([1, 2], trial_steps=10, warmup_steps=0, memory=threads.ThreadMemory(load=lambda: 0.0))
        with caplog.at_level(logging.INFO, logger="gru4rec"), choice:
            machine.run(choice, 30)
        lines = [r.getMessage() for r in caplog.records if "runs on" in r.getMessage()]
        assert len(lines) == 1 and (note in lines[0]) == busy, lines
