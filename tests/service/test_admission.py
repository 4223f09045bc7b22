"""The in-flight bound: past ``limits.max_concurrent_requests`` API requests, 429 with Retry-After
before the body is read; the probes still answer and the held request completes."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest


@pytest.mark.slow
def test_past_the_bound_requests_are_refused_at_once_and_the_held_one_completes(
    tiny_store: Path, serve_app: Any, make_image: Any
) -> None:
    body = json.dumps({"images": [make_image()]}).encode()
    limits = {"max_concurrent_requests": 1}
    with serve_app(store=str(tiny_store), model="tiny@production", limits=limits) as running:
        host, port = running.url.removeprefix("http://").split(":")
        head = (
            f"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection((host, int(port))) as held:
            # A request whose body is still arriving holds the one place.
            held.sendall(head.encode() + body[:10])
            deadline = time.monotonic() + 10
            while True:
                refused = httpx.post(f"{running.url}/embed", content=body, headers={"content-type": "application/json"})
                if refused.status_code == 429 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)  # the held request's head may not be parsed yet
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "overloaded" and "limits.max_concurrent_requests" in error["message"]
            assert httpx.get(f"{running.url}/healthz").status_code == 200  # probes are not counted
            held.sendall(body[10:])
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += held.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        # The place is free again.
        ok = httpx.post(f"{running.url}/embed", content=body, headers={"content-type": "application/json"}, timeout=30)
        assert ok.status_code == 200, ok.text
