"""EmbeddingCache through Redis Sentinel and Redis Cluster (real processes, tests/redis_ha.py).

Failover and node restarts under load are tested through the HTTP service in
tests/service/test_http_cache_ha.py; these check the client side: passwords, the slot spread of a
batch and its round trips.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis.asyncio.cluster import ClusterNode
from redis_ha import SentinelSetup, missing_binaries

from service.runtime import EmbeddingCache, ServiceMetrics
from service.runtime.cache import quantize

from .test_cache import ROOMY_TIMEOUT_S, cache_counts, keys_for, unit_vectors


async def test_sentinel_url_with_passwords_caches_on_the_master(tmp_path: Path) -> None:
    if missing := missing_binaries("redis-server", "redis-sentinel"):
        pytest.skip(f"not installed: {', '.join(missing)}")
    with SentinelSetup(tmp_path, password="master-secret", sentinel_password="sentinel-secret") as setup:
        assert "master-secret" in setup.url and "sentinel-secret" in setup.url
        metrics = ServiceMetrics()
        cache = EmbeddingCache(setup.url, timeout_s=ROOMY_TIMEOUT_S, metrics=metrics)
        assert await cache.ping() and cache.redis_state == "up"
        keys = keys_for(5)
        vecs = unit_vectors(5)
        await cache.put_many(dict(zip(keys, vecs, strict=True)))
        assert setup.master.exists(*keys) == 5

        fresh = EmbeddingCache(setup.url, timeout_s=ROOMY_TIMEOUT_S, metrics=metrics)  # another replica of the service
        got = await fresh.get_many(keys)
        for value, vec in zip(got, vecs, strict=True):
            assert value is not None
            np.testing.assert_array_equal(value, quantize(vec))
        assert cache_counts(metrics, "redis", "hit") == 5
        await cache.close()
        await fresh.close()

        # Wrong master password: an error, and the password appears nowhere in what it says.
        wrong = setup.url.replace("master-secret", "not-the-password")
        broken = EmbeddingCache(wrong, metrics=metrics)
        assert await broken.get_many(keys[:1]) == [None]
        assert broken.redis_state == "down" and broken.last_error is not None
        assert "not-the-password" not in broken.last_error and "sentinel-secret" not in broken.last_error
        await broken.close()


@pytest.mark.slow
async def test_cluster_batch_spreads_over_the_masters_in_one_round_trip_per_node(
    redis_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = ServiceMetrics()
    cache = EmbeddingCache(redis_cluster.url, timeout_s=ROOMY_TIMEOUT_S, metrics=metrics)
    assert await cache.ping()
    keys = keys_for(60)
    vecs = unit_vectors(60)

    round_trips: Counter[str] = Counter()  # pipelines sent, per node
    real_execute_pipeline = ClusterNode.execute_pipeline

    async def counting(self: ClusterNode, commands: Any) -> Any:
        round_trips[self.name] += 1
        return await real_execute_pipeline(self, commands)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", counting)
    await cache.put_many(dict(zip(keys, vecs, strict=True)))
    assert sorted(round_trips.values()) == [1, 1, 1], round_trips  # every node, once
    sizes = [node.dbsize() for node in redis_cluster.nodes]
    assert sum(sizes) == 60 and min(sizes) > 0, sizes  # the keys spread over the masters
    for key in keys[:10]:
        assert redis_cluster.node_for(key).exists(key) == 1

    round_trips.clear()
    fresh = EmbeddingCache(redis_cluster.url, timeout_s=ROOMY_TIMEOUT_S, metrics=metrics)
    got = await fresh.get_many(keys)
    assert sorted(round_trips.values()) == [1, 1, 1], round_trips
    for value, vec in zip(got, vecs, strict=True):
        assert value is not None
        np.testing.assert_array_equal(value, quantize(vec))
    assert cache_counts(metrics, "redis", "hit") == 60 and fresh.redis_state == "up"
    await cache.close()
    await fresh.close()
