"""A front-end's HTTP/1.1 connections to the engine's unix socket, for requests with whole bodies.

What the relay needs and no more: one write per request (head and body together), the answer read
whole, kept-alive connections reused. httpx did the same with a connection pool, events and stream
layers that cost 41 % of a front-end's CPU per request, and h11 after it still took a quarter of a
front-end's event loop building each request and parsing each answer in Python (docs/benchmarks.md,
"Front-ends and an engine" and "Front-end cost"). The request head is now written here, checked
against HTTP's grammar with h11's own patterns (a head they refuse is ``UnsendableHead``: the caller
relays it another way, as before), and the answer is parsed by llhttp through httptools, the parser
uvicorn itself runs on. Streamed request bodies still go through httpx.
"""

from __future__ import annotations

import asyncio
import re
import time

import httptools

# Idle connections older than this are closed rather than reused (the engine keeps them an hour).
IDLE_S = 60.0
READ_BYTES = 256 * 1024

# RFC 9110's grammar as h11 (the previous writer of these heads) checks it: h11._abnf.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_FIELD_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")


class EngineUnavailable(ConnectionError):
    """The engine did not answer: not listening, or the connection broke before the answer."""


class UnsendableHead(ValueError):
    """A request head this writer will not send (HTTP's grammar refuses a part of it), though the
    front-end's server read it; nothing was written."""


def request_head(method: str, target: str, headers: list[tuple[bytes, bytes]], body_length: int) -> bytes:
    """The bytes of an HTTP/1.1 request head with a ``content-length`` of ``body_length`` (and a
    ``host``, where ``headers`` have none), or ``UnsendableHead``."""
    verb, path = method.encode("latin-1"), target.encode("latin-1")
    if not _TOKEN.fullmatch(verb) or not _TARGET.fullmatch(path):
        raise UnsendableHead(f"illegal request line {method!r} {target!r}")
    lines = [verb, b" ", path, b" HTTP/1.1\r\n"]
    hosts = 0
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise UnsendableHead(f"illegal header {name!r}")
        if name.lower() == b"host":
            hosts += 1
        lines += [name, b": ", value, b"\r\n"]
    if hosts > 1:
        raise UnsendableHead("more than one host header")
    if not hosts:
        lines.append(b"host: engine\r\n")
    lines += [b"content-length: ", str(body_length).encode(), b"\r\n\r\n"]
    return b"".join(lines)


class _Answer:
    """httptools' callbacks for one response: its headers (names lower-cased) and body."""

    __slots__ = ("parser", "head_only", "headers", "chunks", "done", "keep_alive", "trailing")

    def __init__(self, head_only: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only  # the answer to a HEAD: no body follows its head
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.done = self.keep_alive = self.trailing = False

    def on_message_begin(self) -> None:
        self.trailing = self.trailing or self.done  # bytes after the answer: the connection is not reused

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.head_only and self.parser.get_status_code() >= 200:
            self._complete()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self.parser.get_status_code() < 200:  # an interim answer (100 Continue): the real one follows
            self.headers.clear()
            self.chunks.clear()
            return
        self._complete()

    def _complete(self) -> None:
        self.done, self.keep_alive = True, self.parser.should_keep_alive()


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    def close(self) -> None:
        self.writer.close()


class EngineChannel:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._idle: list[_Connection] = []

    async def request(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body) of the engine's answer. Raises ``UnsendableHead`` for a request
        HTTP's grammar refuses (the caller relays it another way) and ``EngineUnavailable``."""
        data = request_head(method, target, headers, len(body)) + body
        for attempt in range(2):
            connection, reused = self._take()
            if connection is None:
                try:
                    reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=READ_BYTES)
                except OSError as exc:
                    raise EngineUnavailable(str(exc)) from None
                connection = _Connection(reader, writer)
            answer = _Answer(head_only=method == "HEAD")
            try:
                await self._exchange(connection, data, answer)
            except (OSError, EOFError, httptools.HttpParserError) as exc:
                connection.close()
                # A kept-alive connection the engine had closed meanwhile: once more on a new one.
                if reused and attempt == 0 and isinstance(exc, OSError | EOFError):
                    continue
                raise EngineUnavailable(str(exc)) from None
            except BaseException:
                connection.close()  # cancelled mid-answer: the connection's state is unknown
                raise
            if answer.keep_alive and not answer.trailing:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                connection.close()  # the engine asked to close, or sent more than the answer
            return answer.parser.get_status_code(), answer.headers, b"".join(answer.chunks)
        raise EngineUnavailable("the engine closed two connections in a row")

    async def _exchange(self, connection: _Connection, data: bytes, answer: _Answer) -> None:
        connection.writer.write(data)
        received = False
        while not answer.done:
            chunk = await connection.reader.read(READ_BYTES)
            if not chunk:
                if not received:
                    raise EOFError("the engine closed the connection")
                raise httptools.HttpParserError("the engine closed the connection mid-answer")
            received = True
            answer.parser.feed_data(chunk)

    def _take(self) -> tuple[_Connection | None, bool]:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < IDLE_S and not connection.writer.is_closing():
                return connection, True
            connection.close()
        return None, False

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
