"""The real `python -m service` bounds every request head: oversized headers answer 431, slow ones
408, and neither holds up other requests; normal keep-alive traffic is untouched."""

from __future__ import annotations

import os
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

REPO = Path(__file__).resolve().parents[2]


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
           "CLIP_KEEP_ALIVE_S": "2"}  # fmt: skip
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
