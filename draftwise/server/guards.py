"""Bounds on what one HTTP connection can hold: header and body read time, body size, unread output.

``RequestGuard`` (ASGI middleware) answers a request to a path the API key guards without
the key with its 401 as soon as the headers are read, whatever its body; it reads each other
request's body before the app sees it: more than ``max_request_body_bytes`` (declared or sent) is a 413,
a body that has not arrived within ``body_read_timeout`` a 408; the app then
gets the body from memory. Every ``send`` of the response must complete
within ``send_timeout`` (uvicorn's send waits while the client does not read);
past it the response is abandoned, which closes the connection and, through
the handlers' ``finally``, aborts its engine requests.

``header_timeout_protocol`` returns uvicorn's h11 protocol with a header
deadline: a connection must send a request's complete headers within
``header_read_timeout`` of sending its first byte (or of connecting), else it
is closed; idle keep-alive connections stay uvicorn's business
(``timeout_keep_alive``). Its transport closes lingering (``lingering.py``): a client
answered while still sending its body reads the answer instead of a reset.
"""
from __future__ import annotations

import asyncio
import logging
import secrets

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError
from .lingering import LingeringTransport

logger = logging.getLogger("draftwise")


class SendTimeout(Exception):
    """A client left the response unread for longer than ``send_timeout``."""


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


KEY_MESSAGE = "Incorrect API key provided: pass it as 'Authorization: Bearer KEY'"
KEY_PATHS = ("/v1/", "/openapi.json")  # what the API key guards (vLLM's key guards /v1 only)


def authorized(headers: list[tuple[bytes, bytes]], expected: bytes | None) -> bool:
    """``Authorization: Bearer KEY`` with the server's key (any request where it has none); compared as
    bytes in constant time, so any header (non-ASCII, several spaces, no scheme) is simply refused."""
    if expected is None:
        return True
    header = b"".join(value for name, value in headers if name == b"authorization")
    scheme, _, token = header.partition(b" ")
    return scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), expected)


class RequestGuard:
    def __init__(self, app, max_request_body_bytes: int, body_read_timeout: float, send_timeout: float,
                 api_key: str | None = None):
        self.app = app
        self.max_bytes, self.body_timeout, self.send_timeout = max_request_body_bytes, body_read_timeout, send_timeout
        self.expected_key = api_key.encode() if api_key is not None else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"].startswith(KEY_PATHS) and not authorized(scope["headers"], self.expected_key):
            return await _reject(send, 401, KEY_MESSAGE, "invalid_api_key")  # on the headers: no body is read
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        try:
            if int(declared) > self.max_bytes:
                raise _TooLarge
            body = await asyncio.wait_for(self._read_body(receive), self.body_timeout)
        except (_TooLarge, ValueError):
            return await _reject(send, 413, f"the request body exceeds {self.max_bytes} bytes "
                                            "(the server's --max-request-body-bytes)")
        except asyncio.TimeoutError:
            return await _reject(send, 408, f"the request body did not arrive within {self.body_timeout:g} s")
        except _Disconnected:
            return
        try:
            await self.app(scope, _replay(body, receive), self._timed(send))
        except Exception as exc:
            if not _holds(exc, SendTimeout):
                raise
            logger.warning("draftwise: %s %s: the client did not read its response for %g s; aborted",
                           scope["method"], scope["path"], self.send_timeout)

    async def _read_body(self, receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _timed(self, send):
        async def timed_send(message) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout)
            except asyncio.TimeoutError:
                raise SendTimeout from None

        return timed_send


def _replay(body: bytes, receive):
    """A ``receive`` that returns the buffered body once, then the connection's own messages."""
    delivered = False

    async def replay():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reject(send, status: int, message: str, code: str | None = None) -> None:
    code = code or ("request_too_large" if status == 413 else "request_timeout")
    response = APIError(status, message, code=code).response()
    headers = [*response.raw_headers, (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def _holds(exc: BaseException, kind: type) -> bool:
    """``exc`` is a ``kind``, or an exception group holding one (anyio task groups wrap)."""
    if isinstance(exc, kind):
        return True
    return any(_holds(inner, kind) for inner in getattr(exc, "exceptions", ()))


def header_timeout_protocol(header_read_timeout: float) -> type[H11Protocol]:
    class HeaderTimeoutH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(LingeringTransport(transport, self._client_sending, self.loop))
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.transport.lingering:  # answered mid-body (lingering.py): the rest is dropped
                self.transport.drain(data)
                return
            if self._header_timer is None and self._between_requests():
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if not self._between_requests():
                self._disarm()  # its headers are complete

        def connection_lost(self, exc) -> None:
            self._disarm()
            self.transport.lost()
            super().connection_lost(exc)

        def _client_sending(self) -> bool:
            return self.conn.their_state is h11.SEND_BODY

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_read_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11Protocol
