"""Fixtures: a real redis-server on a free 127.0.0.1 port, in a temporary directory."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process that tests can stop and start again on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._stats_client: redis.Redis | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self) -> None:
        cmd = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self._stats_client is not None:
            self._stats_client.close()
            self._stats_client = None
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def commands_processed(self) -> int:
        """Server-side command count; each call adds exactly one (its own INFO)."""
        # One long-lived connection: a new one would add its handshake commands to the count.
        if self._stats_client is None:
            self._stats_client = self.client()
            self._stats_client.ping()
        return int(self._stats_client.info("stats")["total_commands_processed"])


def _require_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _require_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(shared_redis: RedisServer) -> RedisServer:
    """The session server, emptied for this test."""
    shared_redis.client().flushall()
    return shared_redis


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, for tests that kill and restart it."""
    _require_redis()
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
