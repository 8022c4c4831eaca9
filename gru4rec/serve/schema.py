"""Request bodies: parsed and checked by hand, so that every bad input gets one line saying
what is wrong and where (``items[3] must be an item id ...``), as ``{"error": ...}`` with a 4xx.

Item ids are JSON integers or strings, as the model's item map holds them. An id of the other
type is read as the catalogue's (:func:`catalogue_ids`): ``"360077951"`` is item 360077951 of a
catalogue of integer ids, ``12`` is item ``"12"`` of a catalogue of string ids — else a client
that sends ids as strings would get the popularity fallback for every session. JSON's
``true``/``false`` are not ids, and NaN/Infinity are not JSON.

A click's ``time`` (an event's; ``times`` of a recommend request, one per item) is a finite JSON
number, unix seconds: a model with click context computes the click's context from it (absent:
the server's clock when the request arrives); a plain model ignores it.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["ApiError", "EventBody", "RecommendBody", "parse_event", "parse_json", "parse_recommend", "check_session_id",
           "MAX_SEQ", "MAX_SESSION_ID", "IdKind", "catalogue_ids", "id_kind"]

#: Longest session id accepted in a URL.
MAX_SESSION_ID = 200


class ApiError(Exception):
    """A request the server refuses: the HTTP status, a one-line reason and any more fields of
    the JSON answer (``{"error": message, **fields}``)."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.fields = status, message, fields


@dataclass(frozen=True)
class RecommendBody:
    """``POST /v1/recommend``."""

    items: list[Any]
    k: int
    exclude_seen: bool
    #: The clicks' times (unix seconds, one per item), or None: the server's clock.
    times: list[float] | None = None


@dataclass(frozen=True)
class EventBody:
    """``POST /v1/sessions/{id}/events``."""

    item: Any
    k: int
    exclude_seen: bool
    #: The click's position in its session (1 for the first), or None.
    seq: int | None = None
    #: The click's time (unix seconds), or None: the server's clock.
    time: float | None = None


#: Largest ``seq`` (positions are stored as 32-bit unsigned integers).
MAX_SEQ = 2**32 - 1


def _kind(value: Any) -> str:
    """A value's JSON type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: Deepest nesting of arrays and objects accepted in a body (a request needs 2). Python's own
#: limit depends on its version (3.11's decoder fails near 1,000 levels, 3.12's does not), so the
#: answer to a deep body must not.
MAX_NESTING = 32
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings ignored)."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (400 when it is not JSON or nested deeper than
    :data:`MAX_NESTING`, 422 when it is not an object)."""
    if not body.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        text = body.decode("utf-8")  # JSON on the wire is UTF-8 (RFC 8259)
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8 text (byte {exc.start})") from None
    # Counting brackets is cheap; only a body with many of them is scanned properly.
    if text.count("[") + text.count("{") > MAX_NESTING and _nesting(text) > MAX_NESTING:
        raise ApiError(400, f"malformed JSON: nested more than {MAX_NESTING} levels deep")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(422, f"the body must be a JSON object, got {_kind(value)}")
    return value


def _check_fields(body: dict[str, Any], allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    for name in body:
        if name not in allowed:
            raise ApiError(422, f"unknown field {name!r} (fields: {', '.join(allowed)})")
    for name in required:
        if name not in body:
            raise ApiError(422, f"missing field {name!r}")


def _is_item_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _k(body: dict[str, Any], n_items: int) -> int:
    k = body.get("k", 20)
    if not isinstance(k, int) or isinstance(k, bool):
        raise ApiError(422, f"'k' must be an integer, got {_kind(k)}")
    if not 1 <= k <= n_items:
        raise ApiError(422, f"'k' must be between 1 and {n_items} (the number of items), got {k}")
    return k


def _exclude_seen(body: dict[str, Any]) -> bool:
    value = body.get("exclude_seen", False)
    if not isinstance(value, bool):
        raise ApiError(422, f"'exclude_seen' must be true or false, got {_kind(value)}")
    return value


def _time(value: Any, name: str) -> float:
    """A click time: a finite JSON number (unix seconds), else one 422 naming ``name``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ApiError(422, f"{name!r} must be a number (unix seconds), got {_kind(value)}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ApiError(422, f"{name!r} must be a finite number (unix seconds), got {value!r}")
    return seconds


def parse_recommend(body: dict[str, Any], *, n_items: int, max_items: int) -> RecommendBody:
    """``{"items": [...], "k": 20, "exclude_seen": false, "times": [...]}``: the session's
    clicks so far (``times``, optional: their unix times, one per item)."""
    _check_fields(body, ("items", "k", "exclude_seen", "times"), ("items",))
    items = body["items"]
    if not isinstance(items, list):
        raise ApiError(422, f"'items' must be an array of item ids, got {_kind(items)}")
    if len(items) > max_items:
        raise ApiError(422, f"'items' has {len(items)} entries, more than the limit of {max_items}")
    for i, item in enumerate(items):
        if not _is_item_id(item):
            raise ApiError(422, f"items[{i}] must be an item id (an integer or a string), got {_kind(item)}")
    times = body.get("times")
    if times is not None:
        if not isinstance(times, list) or len(times) != len(items):
            raise ApiError(422, f"'times' must be an array of {len(items)} numbers (one per item), got "
                                f"{_kind(times) if not isinstance(times, list) else f'{len(times)} entries'}")
        times = [_time(t, f"times[{i}]") for i, t in enumerate(times)]
    return RecommendBody(items, _k(body, n_items), _exclude_seen(body), times)


def parse_event(body: dict[str, Any], *, n_items: int) -> EventBody:
    """``{"item": ..., "k": 20, "exclude_seen": false, "seq": n, "time": t}``: one click of a
    session; ``seq`` (optional) is its position in the session, 1 for the first; ``time``
    (optional) its unix time."""
    _check_fields(body, ("item", "k", "exclude_seen", "seq", "time"), ("item",))
    item = body["item"]
    if not _is_item_id(item):
        raise ApiError(422, f"'item' must be an item id (an integer or a string), got {_kind(item)}")
    seq = body.get("seq")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
        raise ApiError(422, f"'seq' must be an integer, got {_kind(seq)}")
    if seq is not None and not 1 <= seq <= MAX_SEQ:
        raise ApiError(422, f"'seq' must be between 1 and {MAX_SEQ} (the click's position in its session), got {seq}")
    time = body.get("time")
    return EventBody(item, _k(body, n_items), _exclude_seen(body), seq, None if time is None else _time(time, "time"))


def check_session_id(session_id: str) -> str:
    """A session id from the URL: 1 to :data:`MAX_SESSION_ID` characters."""
    if not session_id or len(session_id) > MAX_SESSION_ID:
        raise ApiError(422, f"the session id must have 1 to {MAX_SESSION_ID} characters, got {len(session_id)}")
    return session_id


#: What a model's item ids are: all integers, all strings, or both (then ids are taken as sent).
IdKind = Literal["int", "str", "mixed"]

#: A decimal integer as a numeric id's text, as a CSV's ItemId column of digits is read (its
#: leading zeros dropped, as the training data's reader drops them); at most 19 digits: an int64,
#: and never a string that Python's int() refuses for its length.
_INTEGER = re.compile(r"(-?)0*([0-9]{1,19})")


def _as_int(text: str) -> int | str:
    """``text`` as an integer id, or ``text`` when it is not a decimal integer."""
    match = _INTEGER.fullmatch(text)
    return text if match is None else int(match[1] + match[2])


def id_kind(ids: np.ndarray | Sequence[Any]) -> IdKind:
    """The kind of a catalogue's ``ids`` (:attr:`gru4rec.data.ItemMap.ids`: an integer array is
    "int" at once; an object array is looked through once per model)."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":
        return "int"
    if all(isinstance(i, str) for i in ids):
        return "str"
    if all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
        return "int"
    return "mixed"


def catalogue_ids(ids: list[Any], kind: IdKind) -> list[Any]:
    """``ids`` as a catalogue of ``kind`` holds them: a string of decimal digits is an integer id
    of an "int" catalogue, an integer is its decimal string in a "str" catalogue; everything
    else stays as sent (and is unknown unless the catalogue holds it)."""
    if kind == "int":
        return [_as_int(i) if isinstance(i, str) else i for i in ids]
    if kind == "str":
        return [str(i) if isinstance(i, int) and not isinstance(i, bool) else i for i in ids]
    return ids
