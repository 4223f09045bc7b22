"""A front-end's HTTP/1.1 connections to the engine's unix socket, for requests with whole bodies.

What the relay needs and no more: one write per request (head and body together), the answer read
whole, kept-alive connections reused. httpx did the same with a connection pool, events and stream
layers that cost 41 % of a front-end's CPU per request (docs/benchmarks.md, "Front-ends and an
engine"); streamed request bodies still go through it.
"""

from __future__ import annotations

import asyncio
import time

import h11

# Idle connections older than this are closed rather than reused (the engine keeps them an hour).
IDLE_S = 60.0
READ_BYTES = 256 * 1024


class EngineUnavailable(ConnectionError):
    """The engine did not answer: not listening, or the connection broke before the answer."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.http = h11.Connection(our_role=h11.CLIENT)
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
        """(status, headers, body) of the engine's answer. Raises ``h11.LocalProtocolError`` for a
        request h11 will not write (the caller relays it another way) and ``EngineUnavailable``."""
        head = [*headers, (b"content-length", str(len(body)).encode())]
        if not any(k == b"host" for k, _ in head):
            head.append((b"host", b"engine"))
        for attempt in range(2):
            connection, reused = self._take()
            if connection is None:
                try:
                    reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=READ_BYTES)
                except OSError as exc:
                    raise EngineUnavailable(str(exc)) from None
                connection = _Connection(reader, writer)
            try:
                data = connection.http.send(h11.Request(method=method, target=target, headers=head))
            except h11.LocalProtocolError:
                self._give_back(connection)  # nothing was written: the connection is as it was
                raise
            data = (data or b"") + (connection.http.send(h11.Data(data=body)) or b"")
            data += connection.http.send(h11.EndOfMessage()) or b""
            try:
                answer = await self._exchange(connection, data)
            except (OSError, EOFError, h11.RemoteProtocolError) as exc:
                connection.close()
                # A kept-alive connection the engine had closed meanwhile: once more on a new one.
                if reused and attempt == 0 and isinstance(exc, OSError | EOFError):
                    continue
                raise EngineUnavailable(str(exc)) from None
            except BaseException:
                connection.close()  # cancelled mid-answer: the connection's state is unknown
                raise
            self._give_back(connection)
            return answer
        raise EngineUnavailable("the engine closed two connections in a row")

    async def _exchange(self, connection: _Connection, data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        connection.writer.write(data)
        status, headers, chunks = 0, [], []
        received = False
        while True:
            event = connection.http.next_event()
            if event is h11.NEED_DATA:
                chunk = await connection.reader.read(READ_BYTES)
                if not chunk and not received:
                    raise EOFError("the engine closed the connection")
                received = received or bool(chunk)
                connection.http.receive_data(chunk)
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the engine closed the connection mid-answer")

    def _take(self) -> tuple[_Connection | None, bool]:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < IDLE_S and not connection.writer.is_closing():
                return connection, True
            connection.close()
        return None, False

    def _give_back(self, connection: _Connection) -> None:
        http = connection.http
        if http.our_state is h11.DONE and http.their_state is h11.DONE:
            http.start_next_cycle()
        if http.our_state is not h11.IDLE or http.their_state is not h11.IDLE:
            connection.close()  # the engine asked to close, or the exchange did not finish
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
