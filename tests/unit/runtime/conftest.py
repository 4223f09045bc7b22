"""Fixtures: a real redis-server on a free 127.0.0.1 port, in a temporary directory."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from loadtests.local_stack import RedisProcess, free_port

__all__ = ["RedisServer", "free_port"]  # test_cache.py imports both from here


class RedisServer(RedisProcess):
    """A redis-server process that tests can stop and start again on the same port, with a client
    and a count of the commands it processed."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self._stats_client: redis.Redis | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def stop(self) -> None:
        if self._stats_client is not None:
            self._stats_client.close()
            self._stats_client = None
        super().stop()

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
