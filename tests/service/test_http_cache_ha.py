"""The shared cache on a highly available Redis, through the real service under load.

Redis Sentinel: the master is killed (SIGKILL) while clients stream requests; the Sentinels
promote the replica and the cache must follow it. Redis Cluster: one of three masters is killed
and restarted from its nodes.conf under the same load. Either way no request may fail (Redis is an
optimisation, never a dependency) and the cache must be used again afterwards: writes reach the
new master or the restarted node, and reads hit Redis.

Each test prints what it saw (failover time, requests during it, recovery) on one line.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis_ha import wait_until

from service.runtime.cache import embedding_key, text_digest

CLIENTS = 4


def redis_hits(client: httpx.Client) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            if s.name == "clip_cache_requests_total" and s.labels == {"layer": "redis", "result": "hit"}:
                return s.value
    return 0.0


class Load:
    """``CLIENTS`` threads posting /embed with texts never sent before, so every request asks
    Redis (a miss) and writes to it, until stopped. Records every outcome."""

    def __init__(self, url: str, texts_per_request: int) -> None:
        self.url = url
        self.texts_per_request = texts_per_request
        self.outcomes: list[tuple[float, int | str]] = []  # (monotonic time, status or exception)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(CLIENTS)]

    def _run(self, client: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            i = 0
            while not self._stop.is_set():
                i += 1
                texts = [f"load {client} {i} {j}" for j in range(self.texts_per_request)]
                try:
                    status: int | str = c.post("/embed", json={"texts": texts}).status_code
                except Exception as exc:  # a failed request, whatever the cause
                    status = repr(exc)
                self.outcomes.append((time.monotonic(), status))

    def count(self, since: float = 0.0) -> int:
        return sum(1 for t, _ in list(self.outcomes) if t >= since)

    def failures(self) -> list[tuple[float, int | str]]:
        return [(t, s) for t, s in list(self.outcomes) if s != 200]

    @contextmanager
    def running(self) -> Iterator[Load]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join(timeout=30)


@contextmanager
def state_changes(cache: Any) -> Iterator[list[tuple[float, str]]]:
    """The cache's Redis states (up, down, probing) as they change, sampled every 10 ms."""
    changes: list[tuple[float, str]] = [(time.monotonic(), cache.redis_state)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            if cache.redis_state != changes[-1][1]:
                changes.append((time.monotonic(), cache.redis_state))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield changes
    finally:
        stop.set()
        thread.join(timeout=5)


def timeline(changes: list[tuple[float, str]], since: float) -> str:
    return ", ".join(f"{state} at {t - since:+.2f}s" for t, state in changes)


def text_key(model_ref: str, text: str) -> str:
    return embedding_key(model_ref, "text", "base", text_digest(text))


def hits_from_redis(running: Any, texts: list[str]) -> float:
    """Embed ``texts`` (cached on the way), forget the in-process LRU, embed them again: the
    Redis hits of the second request."""
    with httpx.Client(base_url=running.url, timeout=30) as c:
        c.post("/embed", json={"texts": texts}).raise_for_status()
        running.services.cache.clear_lru()
        before = redis_hits(c)
        c.post("/embed", json={"texts": texts}).raise_for_status()
        return redis_hits(c) - before


@pytest.mark.slow
def test_sentinel_failover_under_load_fails_no_request_and_the_new_master_is_used(
    tmp_path: Path, publish_model: Any, serve_app: Any, redis_sentinel: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    version = publish_model(tmp_path / "store", "sentinelha", seed=21)
    ref = f"sentinelha@{version}"
    with serve_app(
        store=str(tmp_path / "store"),
        model="sentinelha@production",
        redis_url=redis_sentinel.url,
        redis_retry_after_s=0.5,
    ) as running:
        cache = running.services.cache
        assert cache.redis_state == "up"
        redis_sentinel.wait_ready()  # the Sentinels found each other while the service started
        old, new = redis_sentinel.roles()
        load = Load(running.url, texts_per_request=2)
        with load.running(), state_changes(cache) as changes:
            wait_until(lambda: load.count() >= 20 and old.dbsize() > 0, 30, "requests cached on the master")
            killed = time.monotonic()
            old.kill()
            failover_s = redis_sentinel.wait_for_master(new)
            fresh = (f"after failover {i}" for i in itertools.count())

            def written_to_new_master() -> bool:
                text = next(fresh)
                probe.post("/embed", json={"texts": [text]}).raise_for_status()
                return cache.redis_state == "up" and new.exists(text_key(ref, text)) == 1

            with httpx.Client(base_url=running.url, timeout=30) as probe:
                wait_until(written_to_new_master, 20, "the cache writing to the new master")
            back_s = time.monotonic() - killed
            during = load.count(since=killed)
        assert hits_from_redis(running, [f"hits after failover {i}" for i in range(4)]) == 4
        assert cache.redis_state == "up"

    failures = load.failures()
    with capsys.disabled():
        print(
            f"\nsentinel failover: promoted {failover_s:.2f}s after SIGKILL, cache on the new master "
            f"{back_s:.2f}s after; cache states {timeline(changes, killed)}; {during} requests since the kill, "
            f"{len(load.outcomes)} in all, {len(failures)} failed"
        )
    assert failures == []
    assert "down" in {state for _, state in changes}  # the cache did lose Redis for a while
    assert during >= 2 * CLIENTS  # the load went on through the failover


@pytest.mark.slow
def test_cluster_node_restart_under_load_fails_no_request_and_hits_recover(
    tmp_path: Path, publish_model: Any, serve_app: Any, redis_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    version = publish_model(tmp_path / "store", "clusterha", seed=22)
    ref = f"clusterha@{version}"
    victim = redis_cluster.nodes[1]
    with serve_app(
        store=str(tmp_path / "store"),
        model="clusterha@production",
        redis_url=redis_cluster.url,
        redis_retry_after_s=0.5,
    ) as running:
        cache = running.services.cache
        assert cache.redis_state == "up"
        load = Load(running.url, texts_per_request=3)
        with load.running(), state_changes(cache) as changes:
            wait_until(
                lambda: load.count() >= 20 and min(n.dbsize() for n in redis_cluster.nodes) > 0,
                30,
                "requests cached on every master",
            )
            spread = [n.dbsize() for n in redis_cluster.nodes]
            # Texts whose keys live on the victim, to see when the cache writes to it again.
            fresh = (t for i in itertools.count() if redis_cluster.node_for(text_key(ref, t := f"back {i}")) is victim)
            killed = time.monotonic()
            victim.kill()
            time.sleep(1.5)  # down longer than cluster-node-timeout (1 s): the cluster marks it failed
            restart_s = redis_cluster.restart(victim)  # empty: nothing is persisted

            def written_to_restarted_node() -> bool:
                text = next(fresh)
                probe.post("/embed", json={"texts": [text]}).raise_for_status()
                return cache.redis_state == "up" and victim.exists(text_key(ref, text)) == 1

            with httpx.Client(base_url=running.url, timeout=30) as probe:
                wait_until(written_to_restarted_node, 20, "the cache writing to the restarted node")
            back_s = time.monotonic() - killed
            during = load.count(since=killed)
        texts = [f"hits after restart {i}" for i in range(12)]
        assert hits_from_redis(running, texts) == len(texts)
        keys = [text_key(ref, t) for t in texts]
        on_victim = [k for k in keys if redis_cluster.node_for(k) is victim]
        assert on_victim and sum(victim.exists(k) for k in on_victim) == len(on_victim)  # one slot each
        assert cache.redis_state == "up"

    failures = load.failures()
    with capsys.disabled():
        print(
            f"\ncluster node restart: keys per master before {spread}; node down 1.5s, serving "
            f"{restart_s:.2f}s after its restart, cache writing to it {back_s:.2f}s after the kill; "
            f"cache states {timeline(changes, killed)}; {during} requests since the kill, {len(load.outcomes)} in all, "
            f"{len(failures)} failed"
        )
    assert failures == []
    assert "down" in {state for _, state in changes}  # the cache did lose Redis for a while
    assert during >= 2 * CLIENTS
