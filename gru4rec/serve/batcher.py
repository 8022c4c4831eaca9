"""The micro-batcher: requests from the event loop, one worker thread doing the model's work.

Requests are queued in arrival order. The worker takes the first one waiting, then every other
one that has arrived (waiting up to ``window_s`` for more, if set) up to ``max_batch``, and runs
them as one batch: the sessions' states in one store call, one :meth:`Engine.run` (one GRU step
per position and one scoring product for all rows), the new states in one store call, then each
request's future gets its answer. While a batch runs, the next one fills up, so batches grow with
the load and a lone request never waits for company.

A batch holds at most one request per session: a second click of a session (or its DELETE) waits
for the next batch, and so does everything after it for that session, so a session's clicks are
applied in arrival order. Torch releases the GIL in its kernels, so the event loop keeps serving
while the worker computes. A failing batch fails its own requests and nothing else: the worker
lives on.

**Each click once.** What a click does to its session — its ``seq`` applied, answered again
from the stored answer, or refused; a compare-and-set refusal run again or given up — is decided
by :mod:`gru4rec.serve.protocol`, without side effects; the batcher acts on the decision and
answers the job. The new states are written with a compare-and-set
(:meth:`SessionStore.compare_and_set`): a session that another replica changed since this batch
read it is not overwritten — its click goes back to the front of the queue and runs again, on the
state read afresh, in the next batch (the rest of the batch is answered at once); after
:data:`MAX_ATTEMPTS` runs it fails with :class:`StateConflict` (a 503). A click that names its
position in the session (``Job.seq``) is idempotent (see :mod:`~gru4rec.serve.protocol`).

A new model (:meth:`MicroBatcher.swap`, from :mod:`gru4rec.serve.reload`) takes over between
two batches, on the worker thread: no batch sees two models. A request indexed its items with
the model current when it arrived (``Job.engine``); if another model answers it, its items are
mapped again by id, and the answer names the model that gave it (``JobResult.engine``).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gru4rec.inference import Answer, Engine, Work
from gru4rec.machine.threads import ThreadChoice
from gru4rec.serve.protocol import MAX_ATTEMPTS, Replay, SeqMismatch, StateConflict, after_refusal, place, read_session, written_value
from gru4rec.serve.state import SessionStore, StoreUnavailable, cas_prefix

__all__ = ["Job", "JobResult", "MAX_ATTEMPTS", "MicroBatcher", "Overloaded", "SeqMismatch", "ShuttingDown", "StateConflict"]

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """More requests are waiting than the queue holds."""


class ShuttingDown(RuntimeError):
    """The server is stopping; the request was not run."""


@dataclass
class Job:
    """One request for the worker: ``kind`` 'recommend' (stateless: ``items`` from a zero
    state), 'event' (``items`` added to session ``session``) or 'delete'."""

    kind: Literal["recommend", "event", "delete"]
    session: str | None = None
    items: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    k: int = 20
    exclude_seen: bool = False
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    #: The model whose indices ``items`` are (None: whichever runs the job).
    engine: Engine | None = None
    #: An event's position in its session, 1 for the first click (None: not idempotent).
    seq: int | None = None
    #: Runs refused by the compare-and-set so far.
    attempts: int = 0
    #: The clicks' times (unix seconds, one per item of ``items``): what a model with click
    #: context computes their context from (None: the clock when the batch runs).
    times: np.ndarray | None = None


@dataclass
class JobResult:
    """What a job's future resolves to: the answer (None for a delete), whether the session
    was new (an event for a session not held) or existed (a delete that removed one)."""

    answer: Answer | None
    new_session: bool = False
    existed: bool = False
    #: The model that answered (its ids name the answer's item indices).
    engine: Engine | None = None
    #: The event was a retry of the session's last click: answered again, not applied.
    replayed: bool = False


@dataclass
class _Swap:
    """A queued model change: ``engine`` replaces the current one between two batches; the
    sessions' states are kept when ``keep_sessions``, else the store moves to ``namespace``."""

    engine: Engine
    keep_sessions: bool
    namespace: str
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class MicroBatcher:
    """Runs :class:`Job`\\ s in batches on one worker thread (see the module docstring).

    ``on_batch(size)`` is called after each batch (metrics). ``threads``: the worker's online
    thread-count choice (:func:`gru4rec.machine.threads.online_choice`), told each batch's model time.
    """

    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        *,
        max_batch: int = 64,
        window_s: float = 0.0,
        max_queue: int = 4096,
        on_batch: Callable[[int], Any] | None = None,
        threads: ThreadChoice | None = None,
    ) -> None:
        self.engine, self.store = engine, store
        self.max_batch, self.window_s = max_batch, window_s
        # Unbounded, so that stop()'s sentinel never blocks; submit() enforces max_queue.
        self._queue: queue.Queue[Job | _Swap | None] = queue.Queue()
        self.max_queue = max_queue
        self._deferred: collections.deque[Job] = collections.deque()
        self._on_batch = on_batch
        self._threads = threads
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: Clicks answered again (``replayed``), runs refused by the compare-and-set
        #: (``retried``), clicks that failed after :data:`MAX_ATTEMPTS` (``gave_up``).
        self.counts = {"replayed": 0, "retried": 0, "gave_up": 0}

    # ------------------------------------------------------------------ event-loop side

    def start(self) -> None:
        """Start the worker thread."""
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gru4rec-batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Let the worker finish what is queued, then stop it; anything left fails with
        :class:`ShuttingDown`."""
        self._stopping = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            self._thread = None
        for job in [*self._deferred, *_drain(self._queue)]:
            if isinstance(job, _Swap):
                job.done.set_exception(ShuttingDown("the server is shutting down"))
            elif job is not None and not job.future.done():
                _settle(job, ShuttingDown("the server is shutting down"))
        self._deferred.clear()

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue ``job`` (before :meth:`start` too: it runs once the worker starts); its future
        resolves to a :class:`JobResult`. Raises :class:`Overloaded` when the queue is full,
        :class:`ShuttingDown` after :meth:`stop`."""
        if self._stopping:
            raise ShuttingDown("the server is shutting down")
        if self._queue.qsize() >= self.max_queue:
            raise Overloaded(f"{self.max_queue} requests are already waiting")
        self._queue.put_nowait(job)
        return job.future

    def swap(self, engine: Engine, *, keep_sessions: bool, namespace: str) -> concurrent.futures.Future:
        """Serve ``engine`` from the next batch on (see the module docstring); the future resolves
        once the worker has switched. ``keep_sessions``: the sessions' states stay valid
        (:meth:`Engine.keeps_states_of`); otherwise the store moves to ``namespace`` and every
        session starts afresh."""
        if self._stopping:
            raise ShuttingDown("the server is shutting down")
        change = _Swap(engine, keep_sessions, namespace)
        if self._thread is None:  # not started (or stopped): nothing runs, switch now
            self._apply(change)
        else:
            self._queue.put_nowait(change)
        return change.done

    def _apply(self, change: _Swap) -> None:
        if not change.keep_sessions:
            self.store.use_namespace(change.namespace)
        self.engine = change.engine
        change.done.set_result(change.engine)

    @property
    def waiting(self) -> int:
        """Requests queued and not yet taken by the worker."""
        return self._queue.qsize() + len(self._deferred)

    # ------------------------------------------------------------------ worker side

    def _loop(self) -> None:
        # torch's thread count is the worker thread's own: the choice is made here, not at start-up
        with self._threads if self._threads is not None else contextlib.nullcontext():
            self._serve()

    def _serve(self) -> None:
        while True:
            got = self._next_batch()
            if got is None:
                return
            batch, change = got
            if batch:
                try:
                    self._run(batch)
                except Exception as exc:  # noqa: BLE001 - a bad batch must not kill the worker
                    if isinstance(exc, StoreUnavailable):
                        log.warning("%s; %d request(s) failed", exc, len(batch))
                    else:
                        log.exception("a batch of %d request(s) failed", len(batch))
                    for job in batch:
                        if not job.future.done():
                            _settle(job, exc)
                if self._on_batch is not None:
                    self._on_batch(len(batch))
            if change is not None:  # between two batches: the one taken before it ran on the old model
                try:
                    self._apply(change)
                except Exception as exc:  # noqa: BLE001 - e.g. the store failed: keep the old model
                    log.warning("the model change failed (%s); the previous model keeps serving", exc)
                    change.done.set_exception(exc)

    def _next_batch(self) -> tuple[list[Job], _Swap | None] | None:
        """Up to ``max_batch`` jobs, at most one per session, oldest first, and the model change
        that came after them (if one did); None to stop."""
        taken: list[Job] = []
        sessions: set[str] = set()
        held_back: list[Job] = []
        stop = False

        def offer(job: Job) -> None:
            if job.session is not None and job.session in sessions:
                held_back.append(job)  # the session's earlier job is in this batch
            elif len(taken) < self.max_batch:
                taken.append(job)
                if job.session is not None:
                    sessions.add(job.session)
            else:
                held_back.append(job)
            if job.session is not None:
                sessions.add(job.session)  # later jobs of a held-back session wait too

        while self._deferred:
            offer(self._deferred.popleft())
        if not taken:
            first = self._queue.get()
            if first is None:
                return None
            if isinstance(first, _Swap):
                return taken, first  # nothing taken, so nothing held back either
            offer(first)
        change: _Swap | None = None
        deadline = time.monotonic() + self.window_s
        while len(taken) < self.max_batch:
            try:
                wait = deadline - time.monotonic()
                job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stop = True
                break
            if isinstance(job, _Swap):  # this batch is the last of the old model
                change = job
                break
            offer(job)
        self._deferred.extend(held_back)
        if stop:
            self._queue.put(None)  # seen again once the held-back jobs have run
        return taken, change

    def _run(self, batch: list[Job]) -> None:
        deletes = [job for job in batch if job.kind == "delete"]
        engine = self.engine
        for job in deletes:
            _settle(job, JobResult(None, existed=self.store.delete(job.session or ""), engine=engine))
        jobs = [job for job in batch if job.kind != "delete"]
        if not jobs:
            return
        keys = [job.session or "" for job in jobs if job.kind == "event"]
        stored = dict(zip(keys, self.store.get_many(keys))) if keys else {}
        runs: list[tuple[Job, Work, bytes | None, int]] = []  # job, its work, the prefix read, its new position
        for job in jobs:
            items, times = job.items, job.times
            if job.engine is not None and job.engine is not engine and len(items):
                # indexed by the previous model: map again by id (an id it lacks is skipped, with its time)
                ids = [job.engine.item_ids[i] for i in items.tolist()]
                items, _ = engine.index_of(ids)
                if times is not None and len(items) != len(times):
                    times = times[engine.known(ids)]
            if job.kind == "recommend":
                runs.append((job, Work(None, items, job.k, job.exclude_seen, times), None, 0))
                continue
            session_id = job.session or ""
            raw = stored.get(session_id)
            session = read_session(raw, engine.hidden_size, session_id)
            try:
                step = place(session_id, job.seq, _last_item(items), session)
            except SeqMismatch as exc:
                _settle(job, exc)
                continue
            if isinstance(step, Replay):  # the session's last click sent again: its stored answer, no step
                self.counts["replayed"] += 1
                _settle(job, JobResult(step.answer, new_session=step.started, engine=engine, replayed=True))
                continue
            state = None if session is None else session.state
            runs.append((job, Work(state, items, job.k, job.exclude_seen, times), None if raw is None else cas_prefix(raw),
                         step.position))
        if not runs:
            return
        started = time.perf_counter()
        answers = engine.run([work for _, work, _, _ in runs])
        if self._threads is not None:  # the model's work only (per row): the store's round trips are not the CPU's
            self._threads.observe(time.perf_counter() - started, len(runs))
        writes, written = [], []
        for (job, work, read, position), answer in zip(runs, answers):
            if job.kind == "event":
                value = written_value(position, _last_item(work.items), answer, started=work.state is None)
                writes.append((job.session or "", read, value))
                written.append(job)
        refused = set(self.store.compare_and_set(writes)) if writes else set()
        again = [written[i] for i in sorted(refused)]
        for job in again:
            job.attempts += 1
            self.counts["retried"] += 1
        retried = {id(job) for job in again}  # by identity: a Job's == compares its arrays
        for (job, work, _, _), answer in zip(runs, answers):
            if id(job) not in retried:
                _settle(job, JobResult(answer, new_session=job.kind == "event" and work.state is None, engine=engine))
        for job in reversed(again):  # first in the next batch, before the session's later clicks
            error = after_refusal(job.session or "", job.attempts)
            if error is None:
                self._deferred.appendleft(job)
            else:
                self.counts["gave_up"] += 1
                _settle(job, error)


def _settle(job: Job, outcome: JobResult | Exception) -> None:
    """Answer ``job`` with ``outcome`` (a result or the error it fails with) — unless its future
    was cancelled meanwhile (its request went away): answering that would raise, and fail the
    rest of the batch with it."""
    try:
        if isinstance(outcome, Exception):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        log.debug("a request of session %r went away before its answer", job.session)


def _last_item(items: np.ndarray) -> int:
    """A click's item index (-1: an unknown item, which adds nothing to the session)."""
    return int(items[-1]) if len(items) else -1


def _drain(q: queue.Queue[Job | _Swap | None]) -> list[Job | _Swap | None]:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items
