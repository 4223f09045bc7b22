"""Retry behaviour against a real server that answers 429/503 a few times, then 200."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from scripted_server import Reply, ScriptedServer, envelope

from clipdiff import AsyncClient, BadRequest, Client, ConnectionFailed, Overloaded, RetryPolicy, Unavailable

OK = {"model": "m@1", "first": "a", "score": 0.4}
IMG = b"img"


def busy(retry_after: str | None = None) -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(429, envelope("overloaded", "queue full"), headers)


def not_ready() -> Reply:
    return Reply(503, envelope("not_ready", "model loading"))


def test_429_and_503_are_retried_until_success(server: ScriptedServer) -> None:
    server.script("/rank-pair", busy("0"), not_ready(), busy("0"), Reply(body=OK))
    with Client(server.url, max_retries=3, backoff=0.01) as c:
        assert c.rank_pair(IMG, IMG, "d").first == "a"
    assert len(server.hits("/rank-pair")) == 4


def test_retry_after_is_honoured(server: ScriptedServer) -> None:
    server.script("/rank-pair", busy("0.4"), Reply(body=OK))
    with Client(server.url, max_retries=2, backoff=0.0) as c:
        t0 = time.monotonic()
        c.rank_pair(IMG, IMG, "d")
        assert time.monotonic() - t0 >= 0.35


def test_attempts_are_bounded(server: ScriptedServer) -> None:
    server.script("/rank-pair", busy("0"))
    with Client(server.url, max_retries=2, backoff=0.01) as c:
        with pytest.raises(Overloaded) as info:
            c.rank_pair(IMG, IMG, "d")
    assert info.value.retry_after == 0.0
    assert len(server.hits("/rank-pair")) == 3  # the first attempt + 2 retries
    server.script("/rank-pair", not_ready())
    with Client(server.url, max_retries=0) as c, pytest.raises(Unavailable):
        c.rank_pair(IMG, IMG, "d")


@pytest.mark.parametrize("status", [400, 404, 413, 422, 500, 504])
def test_other_errors_are_not_retried(server: ScriptedServer, status: int) -> None:
    server.script("/rank-pair", Reply(status, envelope("x", "no")), Reply(body=OK))
    with Client(server.url, max_retries=3, backoff=0.01) as c:
        with pytest.raises(Exception) as info:
            c.rank_pair(IMG, IMG, "d")
    assert getattr(info.value, "status", None) == status
    assert len(server.hits("/rank-pair")) == 1
    if status in (400, 422):
        assert isinstance(info.value, BadRequest)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connections_raise_connection_failed() -> None:
    port = free_port()
    with Client(f"http://127.0.0.1:{port}", max_retries=2, backoff=0.05) as c:
        t0 = time.monotonic()
        with pytest.raises(ConnectionFailed) as info:
            c.models()
        # Two backoffs happened (>= half of 0.05 and of 0.1, the equal-jitter floor).
        assert time.monotonic() - t0 >= 0.07
    assert info.value.status is None and info.value.code == "connection_error"
    # What failed and what to check: the URL, the attempts, the hint (not only "[Errno 111] ...").
    assert info.value.url == f"GET http://127.0.0.1:{port}/models"
    assert f"no answer from http://127.0.0.1:{port}" in str(info.value) and "after 3 attempt(s)" in str(info.value)
    assert "check that the service is running there" in str(info.value)


def test_connection_errors_are_retried_until_the_server_is_up() -> None:
    port = free_port()
    srv: list[ScriptedServer] = []

    def start_late() -> None:
        time.sleep(0.3)
        s = ScriptedServer(port=port)
        s.script("/models", Reply(body={"serving": None, "models": []}))
        s.start()
        srv.append(s)

    thread = threading.Thread(target=start_late)
    thread.start()
    try:
        with Client(f"http://127.0.0.1:{port}", max_retries=8, backoff=0.1) as c:
            assert c.models().models == []
    finally:
        thread.join()
        for s in srv:
            s.stop()


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(max_retries=5, backoff=0.2, max_backoff=1.0, max_retry_after=3.0)
    for retry, base in [(0, 0.2), (1, 0.4), (2, 0.8), (3, 1.0), (6, 1.0)]:
        for _ in range(20):
            assert base / 2 <= policy.delay(retry) <= base
    assert policy.delay(0, retry_after=2.0) == 2.0
    assert policy.delay(0, retry_after=100.0) == 3.0
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


async def test_async_client_retries_the_same_way(server: ScriptedServer) -> None:
    server.script("/rank-pair", busy("0"), not_ready(), Reply(body=OK))
    async with AsyncClient(server.url, max_retries=3, backoff=0.01) as c:
        assert (await c.rank_pair(IMG, IMG, "d")).score == pytest.approx(0.4)
    assert len(server.hits("/rank-pair")) == 3
    server.script("/rank-pair", busy("0"))
    async with AsyncClient(server.url, max_retries=1, backoff=0.01) as c:
        with pytest.raises(Overloaded):
            await c.rank_pair(IMG, IMG, "d")


async def test_async_connection_failure() -> None:
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", max_retries=1, backoff=0.01) as c:
        with pytest.raises(ConnectionFailed):
            await c.embed_texts(["a"])
        assert not await c.health()
