"""The front door: API key, body size limit, slow-client deadlines, and each response counted.

A connection must send each request's headers within `header_timeout` (checked by `TimedH11Protocol`)
and its body within `body_timeout` (checked by `Gate`, answered with a 408).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gufo.server.metrics import Metrics
from gufo.server.responses import ApiError
from gufo.server.settings import ServerSettings


class Gate:
    """ASGI middleware in front of routing: API key (every route), body size limit, request counts.

    The body is read here, up to the limit, and replayed to the app; later `receive` calls pass
    through, so the app still sees the client's disconnect.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        metrics: Metrics,
        routes: Collection[str],
        open_paths: Collection[str] = (),
    ):
        """`routes`: the paths counted by name in the metrics; any other counts as "other". `open_paths`
        need no API key (the chat page's files: the page asks for the key)."""
        self.app = app
        self.settings, self.metrics, self.routes, self.open_paths = settings, metrics, routes, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_request(route, message["status"])
            await send(message)

        try:
            if scope["path"] not in self.open_paths:
                self._check_key(scope)
            body = await self._read_body(scope, receive)
        except ApiError as err:
            await err.response()(scope, receive, counted_send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, counted_send)

    def _check_key(self, scope: Scope) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(
                401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key"
            )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.settings.max_request_bytes
        too_large = ApiError(413, f"request body over the limit of {limit} bytes", code="request_too_large")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise too_large
            except ValueError:
                raise ApiError(400, "invalid Content-Length header") from None
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.settings.body_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    408, "the request body did not arrive in time (--body-timeout)", code="request_timeout"
                ) from None
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # a chunked body declares no length
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers: `header_timeout` seconds from
    the connection (or the previous response) on. uvicorn's keep-alive timer alone is reset by every
    byte, so a client dribbling its headers would hold the connection forever."""

    header_timeout: float = 10.0
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_overdue)

    def _headers_overdue(self) -> None:
        no_request_begun = self.cycle is None or self.cycle.response_complete
        if no_request_begun and not self.transport.is_closing():
            self.transport.close()
