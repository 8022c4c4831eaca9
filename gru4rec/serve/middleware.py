"""Three plain ASGI middlewares around the app: the access token, the request-body limit and
the request metrics.

:class:`BearerToken` refuses a request to a ``/v1`` route without ``Authorization: Bearer
TOKEN`` with 401, before its body is read; the token is compared in constant time
(:func:`hmac.compare_digest`), so the time of a refusal says nothing about how much of a guess
was right. ``/healthz`` and ``/metrics`` stay open (load balancers and Prometheus ask them).

:class:`BodyLimit` refuses a body larger than the limit with 413 — from its ``Content-Length``
before anything is read, or, for a chunked body, as soon as the bytes read pass the limit — and
hands the app the body it read, so that no handler ever holds more than the limit in memory.

:class:`RequestMetrics` times every request and counts it by route template (``/v1/sessions/
{session_id}/events``, not one series per session) and status.
"""
from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gru4rec.serve.metrics import ServeMetrics

__all__ = ["BearerToken", "BodyLimit", "RequestMetrics"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_error(send: Send, status: int, message: str, *, close: bool = False,
                     extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A ``{"error": message}`` JSON response; ``close`` asks the client to drop the connection
    (the unread rest of a refused body must not be taken for the next request)."""
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra_headers or [])]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerToken:
    """``/v1`` routes need ``Authorization: Bearer {token}`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        scheme, _, credentials = given.partition(b" ")
        # The scheme is case-insensitive (RFC 9110); only the token's bytes are secret.
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self._token):
            await self.app(scope, receive, send)
            return
        reason = ("this route needs an access token: send the header 'Authorization: Bearer TOKEN'" if not given
                  else "the access token is not valid")
        await send_error(send, 401, reason, close=True, extra_headers=[(b"www-authenticate", b'Bearer realm="gru4rec"')])


class BodyLimit:
    """Bodies over ``max_bytes`` get 413 without being read (see the module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await send_error(send, 400, f"Content-Length {value.decode(errors='replace')!r} is not a number", close=True)
                    return
        too_big = f"the request body is larger than the limit of {self.max_bytes} bytes"
        if length is not None and length > self.max_bytes:
            await send_error(send, 413, too_big, close=True)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, 413, too_big, close=True)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RequestMetrics:
    """Observes every HTTP request's route, method, status and seconds in ``metrics``."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(template, scope.get("method", ""), status, time.perf_counter() - start)
