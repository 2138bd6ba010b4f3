"""Lingering close: a connection answered while its client is still sending the request body.

A server that closes a socket with unread bytes in its receive buffer makes the kernel send a
reset, and a client still writing its body (a 20 MB upload answered 401 as soon as its headers
were read) then gets "connection reset" instead of the answer already sent. ``LingeringTransport``
wraps a connection's transport: its ``close()``, while the client is mid-body, sends the answer's
end of stream (``write_eof``: the response stays whole) and keeps reading, dropping what arrives,
until the client closes, ``LINGER_BYTES`` were dropped or ``LINGER_SECONDS`` passed; then it
closes. Otherwise ``close()`` closes at once. The protocol hands received bytes to ``drain``
while ``lingering``.
"""
from __future__ import annotations

import asyncio
from typing import Callable

LINGER_BYTES = 64 << 20  # at most this much of an unread body is drained
LINGER_SECONDS = 5.0  # a client that keeps the connection open longer is cut


class LingeringTransport:
    def __init__(self, transport: asyncio.Transport, client_sending: Callable[[], bool],
                 loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._client_sending = client_sending  # whether the client is still sending a request body
        self._loop = loop
        self.lingering = False
        self._drained = 0
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name: str):  # everything else is the transport's
        return getattr(self._transport, name)

    def close(self) -> None:
        if self.lingering:
            return
        if self._transport.is_closing() or not self._client_sending() or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()  # the response, then the end of our stream
        self._transport.resume_reading()
        self._timer = self._loop.call_later(LINGER_SECONDS, self._transport.close)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def drain(self, data: bytes) -> None:
        """Drop bytes that arrived while lingering; close once too many came."""
        self._drained += len(data)
        if self._drained > LINGER_BYTES:
            self._transport.close()

    def lost(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
