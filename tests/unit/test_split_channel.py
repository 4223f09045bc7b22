"""service.split.channel against a real unix-socket server that closes kept-alive connections."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.split.channel import EngineChannel, EngineUnavailable


async def _serve_once_per_connection(path: Path, seen: list[bytes]) -> asyncio.AbstractServer:
    """Answers one request per connection, then closes it without saying so (as a server does
    when a kept-alive connection has been idle too long)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        body = await reader.readexactly(length)
        seen.append(head.split(b"\r\n")[0] + b" " + body)
        writer.write(b"HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


def test_a_connection_the_engine_closed_is_replaced_transparently(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[int, bytes]]:
        seen: list[bytes] = []
        server = await _serve_once_per_connection(tmp_path / "engine.sock", seen)
        channel = EngineChannel(str(tmp_path / "engine.sock"))
        answers = []
        for body in (b"first", b"second"):
            status, headers, answer = await channel.request("POST", "/embed", [(b"host", b"x")], body)
            assert (b"content-type", b"text/plain") in headers
            answers.append((status, answer))
            await asyncio.sleep(0.05)  # the server has closed the connection by now
        channel.close()
        server.close()
        assert seen == [b"POST /embed HTTP/1.1 first", b"POST /embed HTTP/1.1 second"]
        return answers

    assert asyncio.run(scenario()) == [(201, b"ok"), (201, b"ok")]


def test_no_engine_is_engine_unavailable(tmp_path: Path) -> None:
    channel = EngineChannel(str(tmp_path / "absent.sock"))
    with pytest.raises(EngineUnavailable):
        asyncio.run(channel.request("GET", "/healthz", [], b""))
