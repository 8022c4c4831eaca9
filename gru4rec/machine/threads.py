"""How many threads torch (and the fused CPU kernels, which share its OpenMP runtime) should use.

torch's own default is the number of CPUs in the process's affinity mask; inside a container
with a CPU quota (cgroup ``cpu.max``, or ``cpu.cfs_quota_us`` in cgroup v1) that can be many
more threads than the process may run at once, and every OpenMP barrier of a training step then
waits for threads the kernel is not scheduling: training runs many times slower. The default
here is the number of CPUs this process may actually use — the affinity mask, capped by the
cgroup quota (:func:`gru4rec.machine.cpus.available_cpus`) — or ``OMP_NUM_THREADS`` when the user set it.

That default cannot know about *other* processes, and no fixed setting is the fastest
everywhere (docs/speed-history.md, "Threads under contention"): the OpenMP runtime's own wait
policy — an idle thread spins a while before it sleeps — is the fastest on a quiet machine, but
beside one busy process the spinning threads take the cores the working ones need and an epoch
runs 3-20 times slower; making idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``) protects a
busy machine but makes a quiet one slower than a single thread. The wait policy is read once,
when the runtime loads; the thread count can change at any moment, and with one thread nothing
spins. So gru4rec leaves the wait policy alone and, unless the count is fixed (``--threads N``,
``threads=N``, ``OMP_NUM_THREADS``), chooses it online: :class:`ThreadChoice` times a few hundred
steps (at most half a second) at each candidate (one thread and the CPUs available), keeps the
faster, and measures again when the steps stay slower (and, less and less often, when they do
not), so a machine that becomes busy ends at one thread and one that becomes quiet goes back to
all of them. Training (:mod:`gru4rec.training.loop`), evaluation and the server's batcher each run
their own choice; :func:`online_choice` hands one out where the count is not fixed. A workload
too short to compare (an evaluation of a few seconds) asks whether the machine is busy instead:
a collapse seen by another choice of the same run in the last minute, or other processes using
half a CPU or more since the last look (:class:`gru4rec.machine.cpus.LoadMeter`, from ``/proc/stat``).

What the choices remember — the decisions, a collapse just seen, the last look at the load,
whether the count is fixed — lives in a :class:`ThreadMemory` owned by one run, never in this
module: :func:`using_threads` (``fit``, each command of the command line) makes one for its
``with`` block, current in that thread's context only (a :class:`contextvars.ContextVar`), and
the choices made inside (training, its validations) share it; an evaluation or a server worker
made outside any run gets its own. A program that trains in one thread and serves in another
shares nothing between the two, and ``fit`` leaves nothing behind. While an
evaluation runs one thread with more CPUs available (:attr:`ThreadChoice.row_parts`), it splits
its rows into ranges run side by side on Python threads (:class:`RowWorkers`): they wait for each
other asleep, which is what the passive policy's OpenMP threads do — a busy machine's scheduler
gives such threads their share of the CPUs, where one thread gets less and spinning ones collapse.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gru4rec.machine.cpus import LoadMeter, available_cpus

__all__ = ["RowWorkers", "ThreadChoice", "ThreadDecision", "ThreadMemory", "current_memory", "default_threads", "last_decision",
           "online_choice", "set_threads", "threads_fixed", "using_threads"]

log = logging.getLogger(__name__)

#: The thread count fixed by :func:`set_threads` called outside any run (the caller asked for it:
#: process-wide, as torch's thread count is), or None. Inside a run its :class:`ThreadMemory` holds it.
_fixed: int | None = None


#: Other processes using this many of this process's CPUs make the machine busy (a short
#: workload then holds one thread).
BUSY_LOAD = 0.5
#: A short workload that began before its run had a load figure looks again after this many seconds
#: of its work (the load meter's window).
LOOK_AGAIN_S = 0.2


def _env_threads() -> int | None:
    """``OMP_NUM_THREADS`` when it is set to a positive integer, else None."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is set to a positive integer, else :func:`available_cpus`."""
    env = _env_threads()
    return env if env is not None else available_cpus()


def threads_fixed() -> int | None:
    """The thread count the caller fixed (:func:`set_threads` or :func:`using_threads` with a
    number — the current run's, else the process's — or ``OMP_NUM_THREADS``), or None:
    :func:`online_choice` chooses it."""
    memory = _memory.get()
    fixed = memory.fixed if memory is not None else _fixed
    return fixed if fixed is not None else _env_threads()


def _check_threads(threads: int | None) -> int:
    """``threads`` checked (a positive integer or None), and the count it stands for."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    return default_threads() if threads is None else threads


def _set_torch_threads(n: int) -> None:
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    log.debug("torch uses %d thread(s) (%d CPU(s) available to this process)", n, available_cpus())


def set_threads(threads: int | None = None) -> int:
    """Make torch use ``threads`` threads and fix the count there — in the current run (inside
    :func:`using_threads`), else in the process; None: :func:`default_threads`, from which
    :func:`online_choice` may go down to one thread (unless ``OMP_NUM_THREADS`` fixes it).
    Returns the number set."""
    global _fixed
    n = _check_threads(threads)
    memory = _memory.get()
    if memory is not None:
        memory.fixed = threads
    else:
        _fixed = threads
    _set_torch_threads(n)
    return n


@contextlib.contextmanager
def using_threads(threads: int | None = None, *, memory: ThreadMemory | None = None) -> Iterator[int]:
    """Run the ``with`` block as one run on ``threads`` threads (None: :func:`default_threads`,
    chosen online), then put torch's previous count back.

    The block's thread choices share a :class:`ThreadMemory`: ``memory`` where given (a later
    stage of a run entered before), else the enclosing run's where there is one (its fixed count
    is ``threads`` for the block, then as it was), else a fresh one, current in this context only
    and forgotten when the block ends."""
    import torch

    n = _check_threads(threads)
    outer = _memory.get()
    memory = memory if memory is not None else outer if outer is not None else ThreadMemory()
    fixed_before = memory.fixed
    before = torch.get_num_threads()
    token = _memory.set(memory)
    try:
        memory.fixed = threads
        _set_torch_threads(n)
        yield n
    finally:
        memory.fixed = fixed_before
        _memory.reset(token)
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class ThreadDecision:
    """What a :class:`ThreadChoice` settled on: ``threads``, and the seconds per unit of work
    (a training step, an evaluated or served row) it measured at each candidate in its latest
    comparison (empty when the count was fixed, ``online`` False)."""

    workload: str
    threads: int
    online: bool
    seconds: dict[int, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """The JSON form of the run folder (``ms`` per unit of work, by thread count)."""
        return {"workload": self.workload, "threads": self.threads, "chosen": "online" if self.online else "fixed",
                "ms": {str(n): round(s * 1e3, 4) for n, s in sorted(self.seconds.items())}}


#: A count this many times slower per unit than one thread has collapsed: the machine is busy (on the
#: 2-core host, rsc15 steps at 2 threads measured 0.8-1.45x the time of 1 thread on a quiet machine
#: and 1.56-4x beside one busy process).
COLLAPSE = 1.5
#: Seconds for which a collapse found by one choice holds for a new one (its first comparison is skipped).
BUSY_MEMORY_S = 60.0
#: A comparison measures a candidate for at most this many seconds (and at least MIN_TRIAL_UNITS units):
#: a wide configuration's steps take tens of milliseconds (DIGINETICA's: 19 ms at 2 threads, ~30 at one),
#: and a few hundred of them at a slower count would cost seconds per comparison.
TRIAL_SECONDS = 0.5
MIN_TRIAL_UNITS = 5
#: Windows in a row this much slower than the recent ones that make a held count compare again.
SLOW_WINDOWS = 2
#: ... at most this many, after comparisons that such windows started found the held count still the
#: fastest (the host slowed every count alike: the comparison was wasted), until one switches.
MAX_SLOW_WINDOWS = 8
#: A window this many times slower than the recent ones counts towards SLOW_WINDOWS whatever the
#: back-off: a collapse (beside a busy process, spinning threads run 3-20x slower) is answered at
#: once; the quiet host's own swings (2.2x: benchmarks/README.md, "Round 8") wait.
SEVERE = 3.0


class ThreadMemory:
    """What the thread choices of one run share, and nothing outside it: a training run and the
    validations inside it, one evaluation, one server worker.

    ``fixed``: the count the run's caller fixed (None: chosen online); :attr:`decisions`: each
    workload's latest :class:`ThreadDecision` (a new choice of a workload the run has already
    decided starts from that count and only verifies it later); :attr:`busy_until`: until when
    (``time.monotonic``) a comparison of the run found the machine busy; :meth:`others_load`:
    the run's own :class:`~gru4rec.machine.cpus.LoadMeter` (``load`` replaces it: tests)."""

    def __init__(self, *, fixed: int | None = None, load: Callable[[], float | None] | None = None) -> None:
        self.fixed = fixed
        self.decisions: dict[str, ThreadDecision] = {}
        self.busy_until = 0.0
        self._load = load
        self._meter = LoadMeter() if load is None else None

    def others_load(self, *, wait: bool = True) -> float | None:
        """CPUs other processes kept busy since the run's last look (:class:`~gru4rec.machine.cpus.LoadMeter`;
        ``wait=False``: None instead of waiting when the run has no figure yet)."""
        if self._meter is not None:
            return self._meter.others_load(wait=wait)
        return self._load() if self._load is not None else None


#: The current run's memory, per context (thread, task): set by :func:`using_threads` for its block.
_memory: contextvars.ContextVar[ThreadMemory | None] = contextvars.ContextVar("gru4rec_thread_memory", default=None)


def current_memory() -> ThreadMemory | None:
    """The :class:`ThreadMemory` of the run this code runs in (inside :func:`using_threads`), or None."""
    return _memory.get()


def last_decision(workload: str) -> ThreadDecision | None:
    """The latest decision of the current run's :class:`ThreadChoice` for ``workload``
    ('training', 'evaluation', 'serving'), or None when none has run (or outside a run)."""
    memory = _memory.get()
    return memory.decisions.get(workload) if memory is not None else None


class ThreadChoice:
    """The faster of some thread counts, chosen from the measured time of the work itself.

    The caller reports every unit of work — a training step, an evaluation batch, a served batch —
    with :meth:`observe` (its seconds, and how much work it was); the choice sets torch's thread
    count between two of them. Use it as ``with choice:``: inside, torch runs the choice's current
    count; on leaving, the count from before comes back (validation between two epochs runs its
    own choice). The rounds:

    1. *compare*: each candidate in turn (fewest threads first: one thread never collapses)
       runs ``trial_steps`` units, or ``trial_seconds`` (at least :data:`MIN_TRIAL_UNITS` units),
       after ``warmup_steps`` that do not count (a switch wakes threads); a later candidate stops
       early once it has spent — warm-up included — the time the fastest so far needed for all
       of its units, or after :data:`MIN_TRIAL_UNITS` units at twice its time per unit — on a busy
       machine a spinning thread count is many times slower, and a few steps show it. The count with the least time per unit of work is
       kept (logged once at INFO).
    2. *hold*: windows of ``trial_steps`` units at the kept count. Two windows in a row
       ``slowdown`` times slower than the median of the last 8 at this count compare again — one
       slow window is the scheduler's noise beside busy processes, and comparing at every one
       cost a third of the time there; so does every ``recheck_windows``-th window while the kept
       count is not the most threads, the interval doubling (to ``max_recheck_windows``) each time
       the comparison keeps the count, so that a machine that became quiet is noticed and a steady
       one is barely disturbed. Holding the most threads there is no periodic re-check: what it
       could find, a machine that became busy, shows as slow windows (spinning threads beside busy
       processes run many times slower), and on a quiet machine every re-check was a loss.

    A comparison started by slow windows runs the other counts, and the second slow window stands
    for the kept count — unless another count beat it: then the kept count is measured afresh
    (it stops early, as any candidate, once it has spent the winner's time), since a slowdown of a
    moment that has passed would else hand the run to a slower count until the next re-check (the
    cost of the default in short runs, issue 50). Such a comparison that keeps the count was
    wasted — the host slowed every count alike — and the next one then waits for twice as many
    slow windows in a row (up to :data:`MAX_SLOW_WINDOWS`; a window :data:`SEVERE` times slower
    still counts at once, a collapse is not kept waiting), until a comparison switches.

    A comparison that finds the most threads :data:`COLLAPSE` times slower than one (the machine
    is busy: waiting threads spin on cores others need) is remembered in the run's
    :class:`ThreadMemory` for :data:`BUSY_MEMORY_S` seconds: a choice made meanwhile starts
    holding one thread instead of comparing. A choice of a workload that the run has decided
    before (each validation after the first, a second ``train_epochs`` of the run) starts holding
    that count — the likely winner, whose window then bounds the others' time — and verifies it
    after its first window, instead of a first comparison that starts at one thread.

    ``compare_first=False`` (a short workload: an evaluation of a few seconds) holds one count
    and never compares: the most threads on a quiet machine, one thread on a busy one — busy
    after a collapse the run remembers, or when its load reading (:meth:`ThreadMemory.others_load`) says other
    processes used :data:`BUSY_LOAD` CPUs or more since the last look. A run too young to have a
    load figure does not wait for one: the workload starts at the most threads and looks once after
    :data:`LOOK_AGAIN_S` seconds of its work.

    ``memory``: the run's :class:`ThreadMemory` (default: a fresh one of this choice alone).
    ``apply(n)`` sets the thread count (default: ``torch.set_num_threads``), ``current()``
    reads it (``torch.get_num_threads``), ``clock()`` tells the time (``time.monotonic``) and
    ``load()`` replaces the memory's load reading; tests pass their own, with made-up timings.
    With one candidate nothing is measured: the count is fixed.
    """

    def __init__(self, candidates: Sequence[int], *, workload: str = "training", trial_steps: int = 200,
                 trial_seconds: float = TRIAL_SECONDS, warmup_steps: int = 5, slowdown: float = 1.25,
                 recheck_windows: int = 8, max_recheck_windows: int = 256, compare_first: bool = True,
                 apply: Callable[[int], None] | None = None,
                 current: Callable[[], int] | None = None, clock: Callable[[], float] = time.monotonic,
                 load: Callable[[], float | None] | None = None, memory: ThreadMemory | None = None) -> None:
        counts = sorted(set(candidates))
        if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
            raise ValueError(f"candidates must be positive integers, got {list(candidates)!r}")
        if trial_steps < 1 or trial_seconds <= 0 or warmup_steps < 0 or slowdown <= 1.0 or \
                not 1 <= recheck_windows <= max_recheck_windows:
            raise ValueError("ThreadChoice needs trial_steps >= 1, trial_seconds > 0, warmup_steps >= 0, slowdown > 1 "
                             "and 1 <= recheck_windows <= max_recheck_windows")
        self.candidates = counts
        self.workload = workload
        self.memory = memory if memory is not None else ThreadMemory(load=load)
        """The run's memory, shared with its other choices."""
        self.trial_steps, self.trial_seconds, self.warmup_steps, self.slowdown = trial_steps, trial_seconds, warmup_steps, slowdown
        self.first_recheck, self.max_recheck = recheck_windows, max_recheck_windows
        self._apply = apply if apply is not None else _torch_set_threads
        self._clock = clock
        self._current = current if current is not None else _torch_get_threads
        self.threads = counts[-1]
        """The count this choice runs now (during a comparison: the one being measured)."""
        self.chosen: int | None = None
        """The count kept by the latest comparison (None before the first one ends)."""
        self.comparisons = 0
        """How many comparisons have ended."""
        self._comparing = len(counts) > 1
        self._order: list[int] = list(counts)
        self._results: dict[int, float] = {}
        self._budget = math.inf  # seconds the fastest candidate so far took for its units
        self._recent: deque[float] = deque(maxlen=8)  # seconds per unit of the latest windows at the kept count
        self._slow_windows = self._severe_windows = 0  # windows in a row slower (SEVERE times slower) than the recent ones
        self._slow_needed = SLOW_WINDOWS  # slow windows in a row that start a comparison (grows after wasted ones)
        self._held_rate: float | None = None  # a comparison started by slow windows: the kept count's last window
        self._verify: int | None = None  # ... and the kept count, measured afresh if another count beat that window
        self._recheck = recheck_windows
        self._windows = 0
        self._outer: list[int] = []
        self._holds = not compare_first  # a short workload's count: held, never compared
        self._skip = 0
        self._warm_seconds, self._warm_units = 0.0, 0  # the current candidate's warm-up so far
        self._seconds = self._work = 0.0
        self._units = 0
        busy = clock() < self.memory.busy_until
        self._look_after = math.inf  # seconds of held work after which a short workload looks at the load again
        if len(counts) > 1 and not compare_first and not busy:
            # No waiting for the run's first load figure (a fresh run's meter has none for 0.2 s: every
            # evaluation on its own would wait that long): the most threads until one comes.
            seen = load() if load is not None else self.memory.others_load(wait=False)
            busy = seen is not None and seen >= BUSY_LOAD
            if seen is None and load is None:
                self._look_after = LOOK_AGAIN_S
        known = self.memory.decisions.get(workload)
        if len(counts) == 1:
            self.chosen = counts[0]
        elif compare_first and not busy and known is not None and known.online and known.threads in counts and known.seconds:
            # The run decided this workload before: start from its count, verified after one window.
            self.threads = self.chosen = known.threads
            self._results = dict(known.seconds)
            self._comparing = False
            self._recheck = 1
        elif busy or not compare_first:
            # Another choice of this run just saw the larger counts collapse, or other processes
            # keep the CPUs busy: a short workload (an evaluation) would spend much of its time
            # re-learning that. A workload too short to compare holds the most threads on a quiet
            # machine (the fastest there).
            self.threads = self.chosen = counts[0] if busy else counts[-1]
            self._comparing = False
        else:  # the first comparison starts at one thread, set on entering ``with``
            self.threads = counts[0]
            self._skip = warmup_steps
        self.memory.decisions[workload] = self.decision()

    @property
    def row_parts(self) -> int:
        """Into how many row ranges a workload whose rows are independent (an evaluation's
        scores and ranks) should split its operations, run side by side by :class:`RowWorkers`:
        the most candidate threads while the choice runs one OpenMP thread, else 1. Python
        threads that each run one OpenMP thread wait for each other asleep, never spinning, so a
        busy machine gives them the CPU share that two sleeping OpenMP threads get."""
        return self.candidates[-1] if self.threads == 1 and len(self.candidates) > 1 else 1

    # ------------------------------------------------------------------ the caller's side

    def __enter__(self) -> ThreadChoice:
        self._outer.append(self._current())
        if self._outer[-1] != self.threads:
            self._apply(self.threads)
        return self

    def __exit__(self, *exc: object) -> None:
        before = self._outer.pop()
        if self._current() != before:
            self._apply(before)

    def observe(self, seconds: float, work: float = 1.0) -> None:
        """Count one unit of work that took ``seconds`` (``work``: its size, e.g. rows, when the
        units differ); may change the thread count for the next one."""
        if len(self.candidates) == 1:
            return
        if self._holds:
            self._look_after -= seconds
            if self._look_after <= 0:
                self._look_again()
            return
        if self._skip:
            self._skip -= 1
            self._warm_seconds += seconds
            self._warm_units += 1
            if self._comparing and self._warm_seconds >= self._budget:
                # the warm-up alone took the fastest count's whole trial (a collapsing count: one
                # step of 2 spinning threads beside busy processes measured 200 ms): it is measured
                self._seconds, self._work, self._units = self._warm_seconds, float(self._warm_units), self._warm_units
                self._measured(False)
            return
        self._seconds += seconds
        self._work += work
        self._units += 1
        if self._comparing:
            full = self._units >= self.trial_steps or (self._seconds >= self.trial_seconds and self._units >= MIN_TRIAL_UNITS)
            if full or self._seconds >= self._budget or (self._units >= MIN_TRIAL_UNITS and
                                                         self._seconds > 2.0 * min(self._results.values(), default=math.inf) * self._work):
                self._measured(full)
        elif self._units >= self.trial_steps:
            self._window_done()

    def decision(self) -> ThreadDecision:
        """The latest decision (before the first comparison ends: the count being measured)."""
        return ThreadDecision(self.workload, self.chosen if self.chosen is not None else self.threads,
                              online=len(self.candidates) > 1, seconds=dict(self._results))

    # ------------------------------------------------------------------ the rounds

    def _look_again(self) -> None:
        """A short workload that had no load figure when it began has run a while: one look (no
        waiting now), and one thread if other processes keep the CPUs busy."""
        self._look_after = math.inf
        seen = self.memory.others_load(wait=False)
        if seen is not None and seen >= BUSY_LOAD and self.threads != self.candidates[0]:
            self._begin(self.candidates[0], warm=False)
            self.chosen = self.threads
            self.memory.decisions[self.workload] = self.decision()

    def _begin(self, n: int, *, warm: bool = True) -> None:
        """Start measuring ``n`` threads (a fresh window)."""
        if n != self.threads or self._current() != n:
            self._apply(n)
        self.threads = n
        self._skip = self.warmup_steps if warm else 0
        self._warm_seconds, self._warm_units = 0.0, 0
        self._seconds = self._work = 0.0
        self._units = 0

    def _measured(self, full: bool) -> None:
        """The candidate being compared has its time (``full``: all of its trial, not stopped
        early): on to the next one, or decide."""
        rate = self._seconds / self._work if self._work > 0 else math.inf
        self._results[self.threads] = rate
        if full and rate <= min(self._results.values()):
            self._budget = self._seconds
        self._order.pop(0)
        if not self._order and self._verify is not None:
            kept, self._verify = self._verify, None
            assert self._held_rate is not None
            if min(self._results.values()) < self._held_rate:
                self._order = [kept]  # another count beat the slow window: was it the moment, or the count?
            else:
                self._results[kept] = self._held_rate  # the slow window stands for the kept count
        if self._order:
            self._begin(self._order[0])
        else:
            self._decide()

    def _decide(self) -> None:
        best = min(self._results, key=lambda n: (self._results[n], -n))
        one, most = self._results.get(self.candidates[0]), self._results.get(self.candidates[-1])
        if one is not None and most is not None:
            self.memory.busy_until = self._clock() + BUSY_MEMORY_S if most >= COLLAPSE * one else 0.0
        before = self.chosen
        self.chosen = best
        self.comparisons += 1
        self._comparing = False
        self._recent.clear()
        self._recent.append(self._results[best])
        if before != best:
            self._slow_needed = SLOW_WINDOWS
        elif self._held_rate is not None:  # started by slow windows, and the count stays: wasted
            self._slow_needed = min(2 * self._slow_needed, MAX_SLOW_WINDOWS)
        self._held_rate = None
        self._slow_windows = self._severe_windows = 0
        self._windows = 0
        # (a verified count of an earlier choice, re-checked after one window: the usual interval from here)
        again = before != best or self._recheck < self.first_recheck
        self._recheck = self.first_recheck if again else min(2 * self._recheck, self.max_recheck)
        self.memory.decisions[self.workload] = self.decision()
        measured = ", ".join(f"{n}: {s * 1e3:.3g} ms" for n, s in sorted(self._results.items()))
        if before is None:
            # A collapse (2 threads many times slower) looks like a fault to a reader: say what it is.
            busy = " — other processes keep the CPUs busy, and waiting threads spin on them" if self.memory.busy_until else ""
            log.info("%s runs on %d thread(s), the faster here (per unit of work %s)%s", self.workload, best, measured, busy)
        elif before != best:
            log.debug("%s now runs on %d thread(s) instead of %d (per unit of work %s)", self.workload, best, before, measured)
        self._begin(best, warm=best != self.threads)

    def _window_done(self) -> None:
        """A window at the kept count ended: compare again when it was slow or a re-check is due."""
        rate = self._seconds / self._work if self._work > 0 else math.inf
        self._windows += 1
        median = statistics.median(self._recent) if self._recent else math.inf
        self._slow_windows = self._slow_windows + 1 if rate > median * self.slowdown else 0
        self._severe_windows = self._severe_windows + 1 if rate > median * SEVERE else 0
        self._recent.append(rate)
        slow = self._slow_windows >= self._slow_needed or self._severe_windows >= SLOW_WINDOWS
        # A periodic re-check looks for a machine that became quiet. Holding the most threads there
        # is nothing to find — a machine that became busy shows as slow windows, spinning threads
        # beside busy processes being many times slower — and each re-check cost short runs time
        # (issue 50 item 8); only a count taken over from an earlier choice of the run is verified.
        verifying = self._recheck < self.first_recheck
        due = self._windows >= self._recheck and (self.chosen != self.candidates[-1] or verifying)
        if slow or due:
            assert self.chosen is not None
            self._comparing = True
            self._budget = self._seconds
            self._order = [n for n in self.candidates if n != self.chosen]
            if slow:  # the kept count is measured afresh if another count beats this window (_measured)
                self._results, self._held_rate, self._verify = {}, rate, self.chosen
            else:
                self._results = {self.chosen: rate}  # this window stands for the kept count
            self._begin(self._order[0])
        else:
            self._begin(self.threads, warm=False)


def _torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _torch_get_threads() -> int:
    import torch

    return torch.get_num_threads()


def online_choice(workload: str, *, trial_steps: int = 200, warmup_steps: int = 5, compare_first: bool = True,
                  memory: ThreadMemory | None = None) -> ThreadChoice:
    """The :class:`ThreadChoice` of one workload ('training', 'evaluation', 'serving'): between
    one thread and torch's count now (after :func:`set_threads`: the CPUs this process may use),
    or that count alone where the caller fixed it (:func:`threads_fixed`). ``memory``: the run's
    (default: the current run's, :func:`current_memory`, else a fresh one of this choice alone)."""
    import torch

    fixed = threads_fixed()
    now = torch.get_num_threads()
    candidates = [now] if fixed is not None or now == 1 else [1, now]
    return ThreadChoice(candidates, workload=workload, trial_steps=trial_steps, warmup_steps=warmup_steps,
                        compare_first=compare_first, memory=memory if memory is not None else _memory.get())


class RowWorkers:
    """Row ranges of one operation run side by side on Python threads (torch releases the GIL
    inside its operations): the calling thread takes the first range, ``parts − 1`` pooled
    threads the others, and :meth:`run` returns when all are done. Used where torch runs one
    OpenMP thread on a busy machine (:attr:`ThreadChoice.row_parts`): beside 2 busy processes on
    2 cores, a B×N score product and its rank counts ran at 52-53k rows/s on one thread, 75-81k
    on two row ranges and 76-82k on two passive OpenMP threads; quiet, at 146k against 153-157k
    for two spinning OpenMP threads (docs/speed-history.md, "Threads under contention")."""

    def __init__(self, parts: int) -> None:
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 2:
            raise ValueError(f"RowWorkers needs at least 2 parts, got {parts!r}")
        self.parts = parts
        self._pool = ThreadPoolExecutor(parts - 1, thread_name_prefix="gru4rec-rows")

    def ranges(self, n: int) -> list[tuple[int, int]]:
        """``n`` rows in :attr:`parts` contiguous ranges, as even as can be (empty ones left out)."""
        bounds = [n * i // self.parts for i in range(self.parts + 1)]
        return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]

    def run(self, fn: Callable[[int, int, int], object], n: int) -> None:
        """``fn(part, lo, hi)`` for each range of ``n`` rows (``part``: its number, e.g. for a
        per-part buffer), side by side; the first error is raised once all have ended."""
        ranges = self.ranges(n)
        futures = [self._pool.submit(fn, i, lo, hi) for i, (lo, hi) in enumerate(ranges) if i > 0]
        try:
            if ranges:
                fn(0, *ranges[0])
        finally:
            for future in futures:
                future.exception()  # wait for every part, even after an error in this one
        for future in futures:
            future.result()

    def close(self) -> None:
        """Stop the pooled threads."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> RowWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
