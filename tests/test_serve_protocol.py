"""The session protocol (gru4rec/serve/protocol.py) on its own: each ``seq`` case against the
position the stored bytes hold, the replayed answer equal to the stored one, the
compare-and-set retry limit — and the rule that deciding changes nothing (no future is resolved,
no store called: the module does not even know of futures)."""
from __future__ import annotations

import ast
import inspect
import logging
import struct

import numpy as np
import pytest

from gru4rec.inference import Answer, SessionState
from gru4rec.serve import protocol
from gru4rec.serve.protocol import (
    MAX_ATTEMPTS,
    Apply,
    Replay,
    SeqMismatch,
    StateConflict,
    after_refusal,
    place,
    read_session,
    written_value,
)
from gru4rec.serve.state import LastClick, StoredSession, decode_session, encode_session

HIDDEN = 8


def stored(position: int, item: int = 42, *, fallback: bool = False, started: bool = False) -> StoredSession:
    """A session as the store gives it back: encoded to layout-2 bytes and decoded."""
    state = SessionState(np.arange(HIDDEN, dtype=np.float32), np.array([3, item], dtype=np.int32))
    scores = None if fallback else np.array([0.5, 0.25, 0.125], dtype=np.float32)
    session = decode_session(encode_session(state, position, LastClick(item, np.array([7, 8, 9], dtype=np.int32), scores,
                                                                       fallback, started)), HIDDEN)
    assert session is not None
    return session


def layout_1() -> StoredSession:
    """A state written before positions existed (hand-built bytes): position 0, no last click."""
    raw = struct.pack("<4sHII", b"G4RS", 1, HIDDEN, 1) + np.ones(HIDDEN, "<f4").tobytes() + np.array([3], "<i4").tobytes()
    session = decode_session(raw, HIDDEN)
    assert session is not None and session.position == 0
    return session


@pytest.mark.parametrize(("session", "seq", "position"), [
    (None, None, 1),            # a new session without seq: its first click
    (None, 1, 1),               # a new session's first click, numbered
    ("held3", None, 4),         # without seq: applied as it comes
    ("held3", 4, 4),            # the next position
    ("layout1", None, 0),       # a layout-1 state's position stays unknown without seq...
    ("layout1", 17, 17),        # ...and starts at the first seq given
])
def test_a_click_in_line_is_applied_at_its_position(session: str | None, seq: int | None, position: int) -> None:
    held = {None: None, "held3": stored(3), "layout1": layout_1()}[session]
    assert place("s", seq, 42, held) == Apply(position)


@pytest.mark.parametrize(("fallback", "started"), [(False, False), (True, True)])
def test_the_last_click_sent_again_is_replayed_from_the_stored_answer(fallback: bool, started: bool) -> None:
    held = stored(3, item=42, fallback=fallback, started=started)
    step = place("s", 3, 42, held)
    assert isinstance(step, Replay) and step.started is started
    np.testing.assert_array_equal(step.answer.items, [7, 8, 9])
    assert step.answer.items.dtype == np.int64  # item indices as the engine gives them
    if fallback:
        assert step.answer.fallback and step.answer.scores is None
    else:
        np.testing.assert_array_equal(step.answer.scores, [0.5, 0.25, 0.125])  # type: ignore[arg-type]
    np.testing.assert_array_equal(step.answer.state.hidden, np.arange(HIDDEN))  # type: ignore[arg-type]


@pytest.mark.parametrize(("session", "seq", "item", "expected", "words"), [
    ("held3", 3, 41, 4, "was applied with another item"),  # a retry whose item differs
    ("held3", 6, 42, 4, "a click is missing"),
    ("held3", 2, 42, 4, "older than its last click"),
    (None, 2, 42, 1, "is not held"),
    ("unknown_item", 3, 42, 4, "was applied with another item"),  # the last click was an unknown item (-1)
])
def test_a_seq_out_of_line_is_refused_with_the_position_expected(session: str | None, seq: int, item: int, expected: int,
                                                                 words: str) -> None:
    held = {None: None, "held3": stored(3, item=42), "unknown_item": stored(3, item=-1)}[session]
    with pytest.raises(SeqMismatch, match=words) as caught:
        place("visitor-9", seq, item, held)
    assert caught.value.expected == expected and "'visitor-9'" in str(caught.value)


def test_a_refused_write_runs_again_until_the_limit() -> None:
    assert MAX_ATTEMPTS == 8  # the documented limit (docs/serving.md)
    assert all(after_refusal("s", n) is None for n in range(1, MAX_ATTEMPTS))
    error = after_refusal("s", MAX_ATTEMPTS)
    assert isinstance(error, StateConflict) and f"{MAX_ATTEMPTS} times in a row" in str(error)


def test_the_written_value_is_read_back_as_the_answer_a_retry_gets() -> None:
    state = SessionState(np.full(HIDDEN, 0.5, dtype=np.float32), np.array([5], dtype=np.int32))
    answer = Answer(np.array([1, 2], dtype=np.int64), np.array([0.75, 0.5], dtype=np.float32), False, state)
    back = read_session(written_value(5, 5, answer, started=True), HIDDEN, "s")
    assert back is not None and back.position == 5
    step = place("s", 5, 5, back)
    assert isinstance(step, Replay) and step.started
    np.testing.assert_array_equal(step.answer.items, answer.items)
    np.testing.assert_array_equal(step.answer.scores, answer.scores)  # type: ignore[arg-type]
    assert place("s", 6, 9, back) == Apply(6)


def test_foreign_bytes_read_as_no_session_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gru4rec.serve.protocol"):
        assert read_session(None, HIDDEN, "s") is None
        assert not caplog.records  # not held is not worth a word
        assert read_session(b"not a session at all", HIDDEN, "visitor-3") is None
    assert len(caplog.records) == 1 and "'visitor-3'" in caplog.records[0].getMessage()


def test_deciding_changes_nothing() -> None:
    """The protocol decides; the batcher answers. The module never names a future nor resolves
    one (the old ``MicroBatcher._position`` answered a replay's future as a side effect), and
    a decision leaves the stored session as it was."""
    tree = ast.parse(inspect.getsource(protocol))
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"future", "set_result", "set_exception", "Future", "counts", "compare_and_set", "store"}
    held = stored(3)
    before = (held.position, held.last.items.copy() if held.last else None)
    for seq in (None, 3, 4):
        place("s", seq, 42, held)
    assert held.position == before[0] and held.last is not None
    np.testing.assert_array_equal(held.last.items, before[1])  # type: ignore[arg-type]
