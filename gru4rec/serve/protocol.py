"""The session protocol: what a click does to its stored session, decided without side effects.

The micro-batcher (:mod:`gru4rec.serve.batcher`) forms batches and answers requests; what a
click *means* for its session is decided here, by plain functions of the click and the stored
session that return a decision and touch nothing else — no future is resolved, no counter moved,
no store called. The batcher acts on the decision.

**Position and** ``seq``. A stored session holds its position (the clicks applied so far) and
the answer to its last click (:class:`~gru4rec.serve.state.LastClick`). A click that names its
position (``seq``, 1 for the first) is idempotent: ``seq`` = position + 1 is applied
(:class:`Apply`); ``seq`` = position with the same item is the last click sent again, answered
from the stored answer without a step (:class:`Replay`); anything else is refused with
:class:`SeqMismatch` (a 409 naming the position expected). A click without ``seq`` is applied as
it comes. A layout-1 state (stored before positions were) has position 0, "unknown": its first
click with ``seq`` sets the position.

**Compare-and-set retries.** The batcher writes a session only if nobody wrote it since the
batch read it; a refused click runs again on the state read afresh, up to :data:`MAX_ATTEMPTS`
runs (:func:`after_refusal`), then fails with :class:`StateConflict` (a 503).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from gru4rec.errors import Gru4RecError
from gru4rec.inference import Answer
from gru4rec.serve.state import LastClick, StoredSession, decode_session, encode_session

__all__ = ["Apply", "MAX_ATTEMPTS", "Replay", "SeqMismatch", "StateConflict", "after_refusal", "place", "read_session",
           "written_value"]

#: Runs of one click whose compare-and-set another writer beat, before it fails with a 503.
MAX_ATTEMPTS = 8

log = logging.getLogger(__name__)


class StateConflict(Gru4RecError):
    """A click's session kept changing under it (other replicas writing it): not applied."""


class SeqMismatch(Gru4RecError):
    """A click's ``seq`` is neither the session's position (a retry) nor the next one."""

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        #: The ``seq`` the session's next click must carry.
        self.expected = expected


@dataclass(frozen=True)
class Apply:
    """Run the click: the session's position once it is applied (0: still unknown, a layout-1
    state clicked without ``seq``)."""

    position: int


@dataclass(frozen=True)
class Replay:
    """The click is the session's last one sent again: answer it with ``answer`` (the stored
    one) without a step; ``started``: that click started the session (its ``new_session``)."""

    answer: Answer
    started: bool


def read_session(raw: bytes | None, hidden_size: int, session_id: str) -> StoredSession | None:
    """The stored session in ``raw`` (None: not held). Bytes that are not a session of a model
    with ``hidden_size`` floats of state (another model's, foreign data) are None too, with a
    warning: the session starts afresh."""
    if raw is None:
        return None
    session = decode_session(raw, hidden_size)
    if session is None:
        log.warning("session %r: its stored state is not one of this model's; it starts afresh", session_id)
    return session


def place(session_id: str, seq: int | None, item: int, session: StoredSession | None) -> Apply | Replay:
    """What the click of ``item`` (its item index, -1 for an unknown item) with ``seq`` does to
    the session ``session`` (None: not held). Raises :class:`SeqMismatch` for a ``seq`` out of
    line; never changes anything."""
    held = 0 if session is None else session.position
    if seq is None:
        return Apply(held + 1 if session is None or held else 0)  # a layout-1 state's position stays unknown
    if session is not None and session.position == 0:  # a layout-1 state: its position starts here
        return Apply(seq)
    if seq == held + 1:
        return Apply(seq)
    if seq == held and session is not None and session.last is not None:
        last = session.last
        if item != last.item:
            raise SeqMismatch(f"click seq {seq} of session {session_id!r} was applied with another item; "
                              f"the next click is seq {held + 1}", held + 1)
        return Replay(Answer(last.items.astype(np.int64), last.scores, last.fallback, session.state), last.started)
    if session is None:
        raise SeqMismatch(f"session {session_id!r} is not held (new, ended, expired or evicted): "
                          f"its first click is seq 1, got seq {seq}", 1)
    if seq > held:
        raise SeqMismatch(f"session {session_id!r} has applied {held} click(s): the next is seq {held + 1}, "
                          f"got seq {seq} (a click is missing)", held + 1)
    raise SeqMismatch(f"session {session_id!r} has applied {held} click(s): seq {seq} is older than its last "
                      f"click, whose answer is the only one kept; the next is seq {held + 1}", held + 1)


def written_value(position: int, item: int, answer: Answer, started: bool) -> bytes:
    """The bytes stored after a click of ``item`` (index, -1: unknown) at ``position``: the
    session's new state (``answer.state``) and the click's answer, kept for a retry
    (``started``: the click started the session)."""
    return encode_session(answer.state, position, LastClick(item, answer.items, answer.scores, answer.fallback, started))


def after_refusal(session_id: str, attempts: int) -> StateConflict | None:
    """After the compare-and-set refused a click's write for the ``attempts``-th time: None to
    run it again, or the error to fail it with once it has run :data:`MAX_ATTEMPTS` times."""
    if attempts < MAX_ATTEMPTS:
        return None
    return StateConflict(f"session {session_id!r} changed under this click {attempts} times in a row (other replicas "
                         "writing it); the click was not applied: send it again")
