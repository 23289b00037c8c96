"""What the agent does before a request reaches its routes, and how its HTTP server treats slow
or too many clients (issue 17: slow-loris, unauthenticated 300 MB bodies, NaN in JSON).

* ``Gate`` (ASGI): the bearer token is checked on the headers, so an unknown client gets 401
  before one byte of its body is read; a body over ``max_body_bytes`` gets 413 (by its
  Content-Length, or as soon as a chunked body passes the limit), so memory stays bounded;
  a JSON body with NaN, Infinity or a number too large for a float gets 400 naming the field.
* ``guarded_protocol`` (uvicorn): a request must arrive whole (headers and body) within
  ``request_timeout_s`` or its connection is closed; connections beyond ``max_connections`` are
  closed as they are accepted, so the agent never reaches its file-descriptor limit; and what
  is closed is logged once per interval, never once per connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from iepm.remote.protocol import Refusal
from iepm.remote.trust import MonitorEntry

log = logging.getLogger("iepm.agent")

LOG_EVERY_S = 10.0
# Listen backlog, which is also how many connections asyncio accepts in one go; a connection's
# protocol runs (and the cap closes it) two loop turns after its accept, so up to three batches
# are in flight beyond the cap.
ACCEPT_BATCH = 64
# Descriptors kept free beside the connections: those batches, the servers' pipes, ss, the
# state and log files.
FD_RESERVE = 3 * ACCEPT_BATCH + 32


def refusal_response(status: int, refusal: Refusal) -> JSONResponse:
    headers = {}
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(math.ceil(refusal.retry_after_s))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(refusal.model_dump(exclude_none=True), status, headers=headers)


def bearer_token(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def unauthorized(token: str | None) -> Refusal:
    message = (
        "no credential: send 'Authorization: Bearer <token>'"
        if token is None
        else "unknown credential"
    )
    return Refusal(error="unauthorized", message=message)


class _Bad:
    """A JSON number Python would read as NaN or ±inf."""

    def __init__(self, text: str) -> None:
        self.text = text


def _float(text: str) -> float | _Bad:
    value = float(text)
    return value if math.isfinite(value) else _Bad(text)


def _bad_paths(value: object, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, _Bad):
        yield path or "(body)", value.text
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _bad_paths(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _bad_paths(item, f"{path}[{index}]")


def json_problem(body: bytes) -> str | None:
    """Why a body is not JSON this agent accepts (one line naming the field), or None."""
    try:
        doc = json.loads(body, parse_constant=_Bad, parse_float=_float)
    except RecursionError:
        return "the body is nested too deeply"
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer of 4,300+ digits
        return f"the body is not valid JSON: {str(exc).splitlines()[0][:200]}"
    for path, text in _bad_paths(doc):
        return f"{path}: {text[:40]} is not a finite number"
    return None


class Gate:
    """ASGI middleware in front of the agent's routes (see the module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticate: Callable[[str | None], MonitorEntry | None],
        public: frozenset[str],
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.public = public
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        if scope["path"].startswith("/v1/") and scope["path"] not in self.public:
            token = bearer_token(_header(headers, b"authorization"))
            monitor = self.authenticate(token)
            if monitor is None:
                await refusal_response(401, unauthorized(token))(scope, receive, send)
                return
            scope.setdefault("state", {})["monitor"] = monitor
        length = _header(headers, b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if length is None and not chunked:
            await self.app(scope, receive, send)
            return
        too_large = Refusal(
            error="too_large",
            message=f"the body is larger than this agent's {self.max_body_bytes} byte limit",
        )
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await refusal_response(413, too_large)(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await refusal_response(413, too_large)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        if body:
            problem = json_problem(bytes(body))
            if problem is not None:
                refusal = Refusal(error="invalid", message=problem)
                await refusal_response(400, refusal)(scope, receive, send)
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class Tally:
    """Counts an event and logs it at most once per ``LOG_EVERY_S``."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self.logged_at = -math.inf

    def add(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            log.warning("%s: %d since the last report", self.what, self.count)
            self.count = 0
            self.logged_at = now


class QuietAccept(logging.Filter):
    """asyncio logs every failed accept() at the fd limit (560,000 lines in 33 s): one a while."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = Tally("accept() failed: out of file descriptors")

    def filter(self, record: logging.LogRecord) -> bool:
        if "out of system resource" in record.getMessage():
            self.tally.add()
            return False
        return True


def guarded_protocol(request_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a whole-request deadline and a connection cap."""
    too_slow = Tally(f"closed connections that sent no whole request within {request_timeout_s} s")
    too_many = Tally(f"closed connections beyond max_connections = {max_connections}")

    class GuardedH11Protocol(H11Protocol):
        _request_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                too_many.add()
                transport.abort()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not cycle.response_complete:
                self._disarm()  # the request is in; answering it has its own deadlines

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection gets the same time

        def _arm(self) -> None:
            self._disarm()
            self._request_timer = self.loop.call_later(request_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def _too_slow(self) -> None:
            self._request_timer = None
            if self.transport.is_closing():
                return
            too_slow.add()
            self.transport.close()

    return GuardedH11Protocol


def connection_cap(max_connections: int, fd_limit: int | None) -> int:
    """max_connections, lowered so that accept() never meets the fd limit."""
    if fd_limit is None:
        return max_connections
    return max(4, min(max_connections, fd_limit - FD_RESERVE))


def uvicorn_options(request_timeout_s: float, max_connections: int) -> dict[str, Any]:
    return {
        "http": guarded_protocol(request_timeout_s, max_connections),
        "timeout_keep_alive": min(5.0, request_timeout_s),
        "backlog": ACCEPT_BATCH,
    }
