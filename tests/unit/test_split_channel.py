"""service.split.channel against a real unix-socket server that closes kept-alive connections."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.split.channel import EngineChannel, EngineUnavailable, UnsendableHead, request_head


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


async def _serve_answers(path: Path, answers: list[bytes], heads: list[bytes]) -> asyncio.AbstractServer:
    """Answers each request on a connection with the next of ``answers`` (raw bytes), keeping the
    connection open; records each request's head."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(b"connection")
        while answers:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            lines = head.split(b"\r\n")
            length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
            await reader.readexactly(length)
            heads.append(head)
            writer.write(answers.pop(0))
            await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


def test_answers_of_every_framing_are_read_whole_on_one_kept_alive_connection(tmp_path: Path) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",  # a HEAD's answer: the length of the GET's body
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ]

    async def scenario() -> list[tuple[int, list[tuple[bytes, bytes]], bytes]]:
        heads: list[bytes] = []
        server = await _serve_answers(tmp_path / "engine.sock", list(answers), heads)
        channel = EngineChannel(str(tmp_path / "engine.sock"))
        got = []
        for method in ("POST", "GET", "POST", "HEAD", "DELETE"):
            got.append(await channel.request(method, "/x?y=1", [(b"x-key", b"a b")], b"{}"))
        channel.close()
        server.close()
        assert heads.count(b"connection") == 1  # one connection carried all five
        assert heads[1] == b"POST /x?y=1 HTTP/1.1\r\nx-key: a b\r\nhost: engine\r\ncontent-length: 2\r\n\r\n"
        return got

    got = asyncio.run(scenario())
    assert got[0] == (200, [(b"content-type", b"text/plain"), (b"content-length", b"5")], b"hello")
    assert got[1][0] == 200 and got[1][2] == b"abcde"
    assert got[2] == (202, [(b"content-length", b"2")], b"ok")
    assert got[3] == (200, [(b"content-length", b"9")], b"")
    assert got[4] == (204, [], b"")


def test_an_answer_that_asks_to_close_is_not_reused(tmp_path: Path) -> None:
    async def scenario() -> int:
        heads: list[bytes] = []
        answer = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        server = await _serve_answers(tmp_path / "engine.sock", [answer], heads)
        channel = EngineChannel(str(tmp_path / "engine.sock"))
        status, _, _ = await channel.request("GET", "/", [], b"")
        idle = len(channel._idle)
        server.close()
        return status + idle

    assert asyncio.run(scenario()) == 200


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GET", "/a b", []),
        ("G(T", "/", []),
        ("GET", "/", [(b"bad name", b"v")]),
        ("GET", "/", [(b"x", b"line\r\nbreak")]),
        ("GET", "/", [(b"host", b"a"), (b"Host", b"b")]),
    ],
)
def test_a_head_http_refuses_is_unsendable(method: str, target: str, headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(UnsendableHead):
        request_head(method, target, headers, 0)
