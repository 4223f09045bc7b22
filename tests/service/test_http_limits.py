"""The real `python -m service` bounds every request head and body: oversized headers answer 431,
slow heads and slow bodies 408, and none holds up other requests; an answer sent before the body
has all arrived closes the connection cleanly; normal keep-alive traffic is untouched."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BODY_IDLE_S, BODY_S = 2.0, 4.0  # the server's body bounds: a gap between two pieces, the whole body
MAX_BODY = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> Iterator[str]:
    root = tmp_path_factory.mktemp("limits-store")
    publish_model(root, "limits", seed=15)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLIP_HEADER_TIMEOUT_S": "1.0", "CLIP_MAX_HEADER_BYTES": "16384",
           "CLIP_KEEP_ALIVE_S": "2", "CLIP_BODY_IDLE_TIMEOUT_S": str(BODY_IDLE_S), "CLIP_BODY_TIMEOUT_S": str(BODY_S),
           "CLIP_LIMITS__MAX_BODY_BYTES": str(MAX_BODY)}  # fmt: skip
    cmd = [sys.executable, "-m", "service", "--store", str(root), "--model", "limits@production", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "the server exited"
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(20)  # far above the 1 s bound: only a server that never answers fails here
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.slow
def test_an_oversized_header_is_refused_with_431(server: str) -> None:
    with socket.create_connection(("127.0.0.1", _port(server))) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 431")
    # Far larger: the server stops reading and closes while the client still sends (the client may
    # see the 431 or a reset), and never reads the rest.
    with socket.create_connection(("127.0.0.1", _port(server))) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 64_000_000 + b"\r\n\r\n")
            answer = _read_all(sock)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert httpx.get(f"{server}/healthz").status_code == 200


def test_a_slow_head_is_cut_off_with_408(server: str) -> None:
    socks = []
    for _ in range(20):  # slowloris: many connections trickling a head
        sock = socket.create_connection(("127.0.0.1", _port(server)))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        socks.append(sock)
    idle = socket.create_connection(("127.0.0.1", _port(server)))  # connects, sends nothing
    try:
        assert httpx.get(f"{server}/healthz").status_code == 200  # others are served meanwhile
        for sock in socks:
            assert _read_all(sock).startswith(b"HTTP/1.1 408")
        assert _read_all(idle).startswith(b"HTTP/1.1 408")
    finally:
        for sock in [*socks, idle]:
            sock.close()


def test_keep_alive_requests_and_bodies_are_untouched(server: str) -> None:
    with httpx.Client(base_url=server, timeout=30) as client:
        for i in range(5):
            r = client.post("/embed", json={"texts": [f"a red circle {i}", "x" * 1500]})
            assert r.status_code == 200
        big_body = {"texts": ["word " * 300] * 200}  # ~300 KB body after a small head
        assert client.post("/embed", json=big_body).status_code == 200
        time.sleep(1.5)  # idle under keep_alive_s, past header_timeout_s: the next request still works
        assert client.get("/healthz").status_code == 200


def _trickle(sock: socket.socket, pieces: list[bytes], every_s: float, give_up_s: float = 30) -> bytes:
    """Send ``pieces`` one by one, ``every_s`` apart, until the server answers; then read its answer."""
    deadline = time.monotonic() + give_up_s
    for piece in pieces:
        if select.select([sock], [], [], every_s)[0] or time.monotonic() > deadline:
            break  # the server answered (or closed)
        sock.sendall(piece)
    else:
        select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
    return _read_all(sock)


def _post_head(length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_that_stops_arriving_is_cut_off_with_408(server: str, chunked: bool) -> None:
    with socket.create_connection(("127.0.0.1", _port(server))) as sock:
        sock.sendall(_post_head(None if chunked else 1000) + (b"8\r\n" if chunked else b"") + b'{"texts"')
        started = time.monotonic()
        answer = _read_all(sock)  # then nothing more: the gap outlasts body_idle_timeout_s
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert b"connection: close" in answer.lower()
        assert time.monotonic() - started < BODY_IDLE_S + 10  # generous: the bound, not a benchmark
    assert httpx.get(f"{server}/healthz").status_code == 200


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.slow
def test_a_trickled_body_is_cut_off_with_408_at_the_body_deadline(server: str, chunked: bool) -> None:
    # One byte every 0.5 s never leaves a gap of body_idle_timeout_s, and would take 500 s.
    pieces = [b"1\r\na\r\n" if chunked else b"a"] * 1000
    with socket.create_connection(("127.0.0.1", _port(server))) as sock:
        sock.sendall(_post_head(None if chunked else 1000))
        started = time.monotonic()
        answer = _trickle(sock, pieces, every_s=0.5)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert time.monotonic() - started < BODY_S + 10
    assert httpx.get(f"{server}/healthz").status_code == 200


def _response(sock: socket.socket) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One whole response (head and Content-Length body) from a kept-alive socket."""
    sock.settimeout(20)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a whole response head: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}
    while len(body) < int(headers[b"content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of a response body"
        body += chunk
    return status, headers, body


def test_an_oversized_chunked_body_gets_413_and_a_clean_close(server: str) -> None:
    chunk = b"a" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3 * MAX_BODY // len(chunk))) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", _port(server))) as sock:
        # A keep-alive client sends its whole request, then reads the answer.
        sock.sendall(_post_head(None) + body)
        status, headers, answer = _response(sock)
        assert status.startswith(b"HTTP/1.1 413") and b"payload_too_large" in answer
        # The rest of the body was never read: the answer says so, and the server closes cleanly (a
        # FIN after the answer, no reset), so the client knows to send its next request elsewhere.
        assert headers.get(b"connection") == b"close"
        assert sock.recv(65536) == b""


def test_an_answer_before_the_body_keeps_the_connection_in_step(server: str) -> None:
    # A keep-alive request whose body the app never reads (an unknown route answers at once), then
    # another request on the same connection: either the connection closes after the first answer
    # (and says so), or the second is answered; never a reset or a 4xx made of the first body.
    body = b"a" * (300 * 1024)
    with socket.create_connection(("127.0.0.1", _port(server))) as sock:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        status, headers, _ = _response(sock)
        assert status.startswith(b"HTTP/1.1 404")
        if headers.get(b"connection") == b"close":
            assert sock.recv(65536) == b""
        else:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")


def test_httpx_sees_the_413_of_an_oversized_chunked_body_and_reconnects(server: str) -> None:
    def chunks() -> Iterator[bytes]:  # no length: httpx sends it chunked
        for _ in range(4 * MAX_BODY // 65536):
            yield b"a" * 65536

    with httpx.Client(base_url=server, timeout=30) as client:
        for _ in range(3):
            r = client.post("/embed", content=chunks(), headers={"Content-Type": "application/json"})
            assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
            assert r.headers["connection"] == "close"
            assert client.get("/healthz").status_code == 200
