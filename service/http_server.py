"""uvicorn with the limits a public HTTP server needs: header size and header read time, and a
clean close when it answers before a request body has all arrived.

uvicorn reads a request head as long as a client keeps sending it: a 64 MB header was read in
full (stalling other requests meanwhile), and a client that sends a few header bytes every now and
then (slowloris) holds its connection forever. The protocol classes here wrap uvicorn's own (the
httptools one, or h11 where httptools is missing) and add two bounds on every request head:

- a head of more than ``max_header_bytes`` (or that many bytes without a complete head): ``431``
  and the connection closes;
- no complete head within ``header_timeout_s`` of its first byte (or of the connection, for the
  first request): ``408`` and the connection closes.

An answer that starts before its request body has all arrived (a 413 for a body over the limit, a
401, a 404 that never read the body) carries ``Connection: close``: the rest of that body is never
read, so the connection cannot carry another request. Closing a socket whose peer is still sending
makes the kernel reset it, and a reset can destroy the answer before the client reads it; so such a
connection closes as web servers do (a "lingering close"): the answer is sent, then the write side
is shut (the client reads the answer and an end of stream), and what the client still sends is read
and dropped until it closes its side, for at most ``linger_s``.

Idle keep-alive connections are closed by uvicorn's own ``timeout_keep_alive``. Behind a reverse
proxy, set the same bounds there too (docs/operations.md).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn itself falls back to h11
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_CLOSE = (b"connection", b"close")


class _LingeringTransport:
    """The socket transport as uvicorn sees it: ``close()`` lingers while the client may still be
    sending its request body (see the module docstring); everything else is the socket's own."""

    def __init__(self, transport: asyncio.Transport, guard: _Guard) -> None:
        self._transport = transport
        self._guard = guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._guard._close()

    def is_closing(self) -> bool:
        return self._guard._lingering or self._transport.is_closing()


class _Guard:
    """Mixin over a uvicorn HTTP protocol: bounds each request head, closes cleanly."""

    max_header_bytes = 64 * 1024
    header_timeout_s = 10.0
    linger_s = 5.0
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any  # the uvicorn RequestResponseCycle of the current request, None before the first
    flow: Any  # uvicorn's FlowControl

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._socket = transport
        self._lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._next_is_head = False
        super().connection_made(cast(asyncio.Transport, _LingeringTransport(transport, self)))  # type: ignore[misc]
        self._start_head()

    # ------------------------------------------------------------------ request heads
    def _start_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_done(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the rest of a request the server answered without reading it
            return
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
        # The next bytes start a new head, unless a pipelined request after this one was parsed already.
        self._next_is_head = self.cycle is None or self.cycle.response_complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._abort(_TIMEOUT)

    def _abort(self, answer: bytes) -> None:
        """Answer ``answer`` (a whole response) and close at once: nothing more of this request is read."""
        self._head_done()
        self._socket.write(answer)
        self._socket.close()

    # ------------------------------------------------------------------ early answers
    def _request_started(self) -> None:
        """Called once a request head is parsed and its cycle exists (before its application runs)."""
        self._head_done()
        cycle = self.cycle
        send = cycle.send

        async def send_closing_early(message: Any) -> None:
            # An answer that starts before its request body has all arrived ends the connection:
            # the rest of the body will not be read, so no next request can be found after it.
            if message["type"] == "http.response.start" and cycle.more_body and not cycle.response_started:
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"connection" and b"close" in value.lower() for name, value in headers):
                    message = {**message, "headers": [*headers, _CLOSE]}
            await send(message)

        # uvicorn hands ``cycle.send`` to the application when its task first runs, after this.
        cycle.send = send_closing_early

    # ------------------------------------------------------------------ closing
    def _close(self) -> None:
        """Close the connection; linger while the client may still be sending a request body."""
        if self._lingering or self._socket.is_closing():
            return
        self._head_done()
        cycle = self.cycle
        mid_body = cycle is not None and cycle.more_body and not self._next_is_head
        if not mid_body or not self._socket.can_write_eof():
            self._socket.close()
            return
        self._lingering = True
        self._socket.write_eof()  # after what is buffered: the client reads the answer, then the end
        self.flow.resume_reading()  # read (and drop) what the client still sends, not leave it unread
        self._linger_timer = self.loop.call_later(self.linger_s, self._socket.close)


class GuardedH11Protocol(_Guard, H11Protocol):  # type: ignore[misc]  # both narrow the transport type
    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # h11 parsed a whole request head
            self._request_started()


if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(_Guard, HttpToolsProtocol):  # type: ignore[misc]
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
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not before:  # not a websocket upgrade
                self._request_started()

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
