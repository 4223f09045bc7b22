"""The guarded uvicorn protocol writes an answer with a content-length as one write (head and body
together), and still sends a streamed answer's head before its body comes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from service.http_server import guarded_protocol

WRITES: list[bytes] = []  # what the server's sockets were given, one entry per write


class _RecordingTransport:
    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)


def _recording_protocol() -> type:
    base = guarded_protocol(16384, 5.0)

    class Recording(base):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_RecordingTransport(transport))

    return Recording


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/whole":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})
        return
    if scope["path"] == "/generated":  # ASGI's headers may be any iterable, read once
        headers = (pair for pair in [(b"x-one", b"1"), (b"content-length", b"2")])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    WRITES.append(b"-- the stream's first piece comes now --")
    await send({"type": "http.response.body", "body": b"one", "more_body": True})
    await send({"type": "http.response.body", "body": b"two"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, http=_recording_protocol(), log_level="warning",
                            lifespan="off")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        sock.settimeout(10)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def test_an_answer_with_a_length_is_one_write(port: int) -> None:
    WRITES.clear()
    answer = _get(port, "/whole")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nhello")
    assert WRITES == [answer]


def test_a_streamed_answers_head_goes_before_its_body(port: int) -> None:
    WRITES.clear()
    answer = _get(port, "/stream")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in answer
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n") and WRITES[0].endswith(b"\r\n\r\n")
    assert WRITES[1] == b"-- the stream's first piece comes now --"


def test_headers_given_as_a_generator_all_arrive(port: int) -> None:
    WRITES.clear()
    answer = _get(port, "/generated")
    assert b"x-one: 1\r\n" in answer and answer.endswith(b"\r\n\r\nok")
    assert WRITES == [answer]
