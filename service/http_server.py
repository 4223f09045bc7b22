"""uvicorn with the limits a public HTTP server needs: header size, header and body read time, and
a clean close when it answers before a request body has all arrived.

uvicorn reads a request head as long as a client keeps sending it: a 64 MB header was read in
full (stalling other requests meanwhile), and a client that sends a few header bytes every now and
then (slowloris) holds its connection forever; the same goes for a body sent a byte at a time. The
protocol classes here wrap uvicorn's own (the httptools one, or h11 where httptools is missing) and
add bounds on every request:

- a head of more than ``max_header_bytes`` (or that many bytes without a complete head): ``431``
  and the connection closes;
- no complete head within ``header_timeout_s`` of its first byte (or of the connection, for the
  first request): ``408`` and the connection closes;
- a body with a gap of more than ``body_idle_timeout_s`` between two of its pieces, or not complete
  within ``body_timeout_s`` of the end of its head: ``408`` and the connection closes. Time the
  server itself is not reading (the application has not taken the bytes already received yet, or
  has not asked for a body sent with ``Expect: 100-continue``) does not count against the client.

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
import errno
import socket
from typing import TYPE_CHECKING, Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    from service.config import Settings

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn itself falls back to h11
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_CLOSE = (b"connection", b"close")


class _LingeringTransport:
    """The socket transport as uvicorn sees it: ``close()`` lingers while the client may still be
    sending its request body (see the module docstring), and the head of an answer with a
    ``content-length`` is held until its body's first piece, so head and body leave in one write
    (one segment, one wake-up of the client, instead of two); everything else is the socket's own."""

    def __init__(self, transport: asyncio.Transport, guard: _Guard) -> None:
        self._transport = transport
        self._guard = guard
        self._held: list[bytes] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
        else:
            self._transport.write(data)

    def hold(self) -> None:
        """Keep what is written until ``release``."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        """Write what was held, in one write."""
        held, self._held = self._held, None
        if held:
            self._transport.write(b"".join(held))

    def close(self) -> None:
        self.release()  # an answer cut short still goes out as far as it was written
        self._guard._close()

    def is_closing(self) -> bool:
        return self._guard._lingering or self._transport.is_closing()


class _Guard:
    """Mixin over a uvicorn HTTP protocol: bounds each request head and body, closes cleanly."""

    max_header_bytes = 64 * 1024
    header_timeout_s = 10.0
    body_idle_timeout_s = 10.0
    body_timeout_s = 60.0
    linger_s = 5.0
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any  # the uvicorn RequestResponseCycle of the current request, None before the first
    flow: Any  # uvicorn's FlowControl: read_paused says whether the server holds off reading

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._socket = transport
        self._writer = _LingeringTransport(transport, self)
        self._lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_cycle: Any = None
        self._body_last = self._body_deadline = 0.0
        self._next_is_head = False
        super().connection_made(cast(asyncio.Transport, self._writer))  # type: ignore[misc]
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
            return
        self._watch_body()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._head_done()
        # The next bytes start a new head, unless a pipelined request after this one was parsed already.
        self._next_is_head = self.cycle is None or self.cycle.response_complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        self._stop_body_timer()
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
        self._stop_body_timer()
        self._writer.release()
        self._socket.write(answer)
        self._socket.close()

    # ------------------------------------------------------------------ request bodies
    def _request_started(self) -> None:
        """Called once a request head is parsed and its cycle exists (before its application runs)."""
        self._head_done()
        cycle = self.cycle
        send, writer = cycle.send, self._writer

        async def send_closing_early(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if not isinstance(headers, list):  # any iterable, read twice below: listed once
                    headers = list(headers)
                    message = {**message, "headers": headers}
                # An answer that starts before its request body has all arrived ends the connection:
                # the rest of the body will not be read, so no next request can be found after it.
                if cycle.more_body and not cycle.response_started:
                    if not any(name.lower() == b"connection" and b"close" in value.lower() for name, value in headers):
                        message = {**message, "headers": [*headers, _CLOSE]}
                # A whole body follows (not a stream that may wait for its first piece): one write.
                if any(name.lower() == b"content-length" for name, _ in headers):
                    writer.hold()
                await send(message)
                return
            try:
                await send(message)
            finally:
                writer.release()

        # uvicorn hands ``cycle.send`` to the application when its task first runs, after this.
        cycle.send = send_closing_early

    def _body_pending(self) -> bool:
        """Whether the current request's body is still arriving and nothing has answered it yet."""
        cycle = self.cycle
        return (
            cycle is not None
            and not self._in_head
            and not self._next_is_head
            and cycle.more_body
            and not cycle.response_started
            and not self.transport.is_closing()
        )

    def _watch_body(self) -> None:
        if not self._body_pending():
            self._stop_body_timer()
            return
        now = self.loop.time()
        self._body_last = now
        if self._body_cycle is not self.cycle:  # the head of this request was just parsed
            self._stop_body_timer()
            self._body_cycle = self.cycle
            self._body_deadline = now + self.body_timeout_s
            self._body_timer = self.loop.call_at(
                min(now + self.body_idle_timeout_s, self._body_deadline), self._check_body
            )
        # Otherwise the timer already set is checked when it fires: re-arming it for each piece of
        # a body would cost a timer per read.

    def _stop_body_timer(self) -> None:
        self._body_cycle = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _check_body(self) -> None:
        self._body_timer = None
        if not self._body_pending():
            self._body_cycle = None
            return
        now = self.loop.time()
        if self.flow.read_paused or self.cycle.waiting_for_100_continue:
            # The server holds off reading, not the client: once it reads again, the client has at
            # least a whole gap to go on.
            self._body_last = now
            self._body_deadline = max(self._body_deadline, now + self.body_idle_timeout_s)
        due = min(self._body_last + self.body_idle_timeout_s, self._body_deadline)
        if now < due:
            self._body_timer = self.loop.call_at(due, self._check_body)
            return
        self._body_timed_out()

    def _body_timed_out(self) -> None:
        # What uvicorn does when a client goes away: the application's next receive() says
        # http.disconnect, and whatever it answers is dropped; the client gets the 408 instead.
        self.cycle.disconnected = True
        self.cycle.message_event.set()
        self._stop_body_timer()
        self._writer.release()
        self._socket.write(_TIMEOUT)
        self._close()

    # ------------------------------------------------------------------ closing
    def _close(self) -> None:
        """Close the connection; linger while the client may still be sending a request body."""
        if self._lingering or self._socket.is_closing():
            return
        self._head_done()
        self._stop_body_timer()
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
            self._watch_body()  # also when the head was a pipelined one, parsed from what was buffered


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


def guarded_protocol(
    max_header_bytes: int, header_timeout_s: float, body_idle_timeout_s: float = 10.0, body_timeout_s: float = 60.0
) -> type[asyncio.Protocol]:
    """The protocol class uvicorn should use, with these bounds."""
    base: type = GuardedHttpToolsProtocol if HttpToolsProtocol is not None else GuardedH11Protocol
    bounds = {
        "max_header_bytes": max_header_bytes,
        "header_timeout_s": header_timeout_s,
        "body_idle_timeout_s": body_idle_timeout_s,
        "body_timeout_s": body_timeout_s,
    }
    return type(base.__name__, (base,), bounds)


def run(
    app: Any,
    *,
    max_header_bytes: int,
    header_timeout_s: float,
    body_idle_timeout_s: float,
    body_timeout_s: float,
    keep_alive_s: float,
    **options: Any,
) -> None:
    """``uvicorn.run`` with the head and body bounds and the keep-alive timeout."""
    # python -m service probed before importing the app; again here, for the port may have been taken
    # during those seconds, and uvicorn would only say so after the model load, with the bare errno.
    # (A unix socket, the engine's with workers > 1, is in a folder of its own: nothing to probe.)
    if "uds" not in options and "fd" not in options:
        check_can_listen(str(options.get("host", "127.0.0.1")), int(options.get("port", 8000)))
    uvicorn.run(
        app,
        http=guarded_protocol(max_header_bytes, header_timeout_s, body_idle_timeout_s, body_timeout_s),  # type: ignore[arg-type]
        h11_max_incomplete_event_size=max_header_bytes,
        timeout_keep_alive=int(max(1, keep_alive_s)),
        **options,
    )


def run_served(app: Any, settings: Settings, *, keep_alive_s: float | None = None, **options: Any) -> None:
    """``run`` under the settings' request bounds, log level and graceful shutdown (the access log
    off: the service logs one structured line per request itself); ``options`` say where to listen."""
    run(
        app,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        body_idle_timeout_s=settings.body_idle_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        keep_alive_s=settings.keep_alive_s if keep_alive_s is None else keep_alive_s,
        **options,
    )


def check_can_listen(host: str, port: int) -> None:
    """Exit at once, saying what to do, when ``host:port`` cannot be bound: uvicorn binds only after
    the app's startup (the model load, seconds to minutes), then exits with the bare errno text."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            hint = (
                f"another process is listening there: stop it, or choose another port with --port (CLIP_PORT); "
                f"`ss -ltnp 'sport = :{port}'` shows which process it is"
                if exc.errno == errno.EADDRINUSE
                else "check --host (CLIP_HOST): it must be an address of this machine, and ports below 1024 need "
                "privileges"
            )
            raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {hint}") from None
