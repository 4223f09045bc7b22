"""uvicorn with the limits a public HTTP server needs: header size and header read time.

uvicorn reads a request head as long as a client keeps sending it: a 64 MB header was read in
full (stalling other requests meanwhile), and a client that sends a few header bytes every now and
then (slowloris) holds its connection forever. The protocol classes here wrap uvicorn's own (the
httptools one, or h11 where httptools is missing) and add two bounds on every request head:

- a head of more than ``max_header_bytes`` (or that many bytes without a complete head): ``431``
  and the connection closes;
- no complete head within ``header_timeout_s`` of its first byte (or of the connection, for the
  first request): ``408`` and the connection closes.

Idle keep-alive connections are closed by uvicorn's own ``timeout_keep_alive``. Behind a reverse
proxy, set the same bounds there too (docs/operations.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn itself falls back to h11
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


class _HeadGuard:
    """Mixin over a uvicorn HTTP protocol: bounds the bytes and the time of each request head."""

    max_header_bytes = 64 * 1024
    header_timeout_s = 10.0
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer: asyncio.TimerHandle | None = None
        self._next_is_head = False
        self._start_head()

    def _start_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_done(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._next_is_head:  # the first bytes of the next request on a kept-alive connection
            self._next_is_head = False
            self._start_head()
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        # Checked after parsing: a head that completed in this chunk is fine, whatever body followed.
        if self._in_head and self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._abort(_TOO_LARGE)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._head_done()
        self._next_is_head = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)  # type: ignore[misc]

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._abort(_TIMEOUT)

    def _abort(self, answer: bytes) -> None:
        self._head_done()
        self.transport.write(answer)
        self.transport.close()


class GuardedH11Protocol(_HeadGuard, H11Protocol):  # type: ignore[misc]  # both narrow the transport type
    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # h11 parsed a whole request head
            self._head_done()


if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(_HeadGuard, HttpToolsProtocol):  # type: ignore[misc]
        # A head that arrived whole in one read is parsed before the byte count above can see it:
        # its parts are counted as the parser hands them over, and checked once it is complete.
        def on_message_begin(self) -> None:
            self._parsed_head = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._parsed_head += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._parsed_head += len(name) + len(value) + 4  # ": " and CRLF
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_done()
            if self._parsed_head > self.max_header_bytes:
                self._abort(_TOO_LARGE)
                return
            super().on_headers_complete()

        # The parser goes on through the data it was given after an abort: there is no request.
        def on_body(self, body: bytes) -> None:
            if not self.transport.is_closing():
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self.transport.is_closing():
                super().on_message_complete()


def guarded_protocol(max_header_bytes: int, header_timeout_s: float) -> type[asyncio.Protocol]:
    """The protocol class uvicorn should use, with these bounds."""
    base: type = GuardedHttpToolsProtocol if HttpToolsProtocol is not None else GuardedH11Protocol
    bounds = {"max_header_bytes": max_header_bytes, "header_timeout_s": header_timeout_s}
    return type(base.__name__, (base,), bounds)


def run(app: Any, *, max_header_bytes: int, header_timeout_s: float, keep_alive_s: float, **options: Any) -> None:
    """``uvicorn.run`` with the head bounds and the keep-alive timeout."""
    uvicorn.run(
        app,
        http=guarded_protocol(max_header_bytes, header_timeout_s),  # type: ignore[arg-type]
        h11_max_incomplete_event_size=max_header_bytes,
        timeout_keep_alive=int(max(1, keep_alive_s)),
        **options,
    )
