"""EmbeddingCache: keys, value format, LRU, a real Redis, and Redis failures."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from service.runtime import EmbeddingCache, ServiceMetrics, bytes_digest, embedding_key, text_digest
from service.runtime.cache import decode_value, embedding_key_prefix, encode_value, quantize, stored_value

from .conftest import RedisServer, free_port

# Tests of what is cached where (not of the timeout) give Redis a roomy budget: a fresh client's
# first command also opens its connection (AUTH, Sentinel discovery, CLUSTER SLOTS), which on a
# loaded two-core machine can take longer than the service's 250 ms and would read as a miss.
ROOMY_TIMEOUT_S = 5.0


def unit_vectors(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def keys_for(n: int, model_ref: str = "default@v3") -> list[str]:
    return [embedding_key(model_ref, "text", "pcclip", text_digest(f"text {i}")) for i in range(n)]


def cache_counts(metrics: ServiceMetrics, layer: str, result: str) -> float:
    value = metrics.registry.get_sample_value("clip_cache_requests_total", {"layer": layer, "result": result})
    return value or 0.0


# -- keys and values ------------------------------------------------------------------------


def test_key_carries_model_version_kind_and_variant() -> None:
    d = text_digest("a red circle")
    assert d == hashlib.sha256(b"a red circle").hexdigest()
    assert embedding_key("default@v3", "text", "pcclip", d) == f"emb:v1:default@v3:text:pcclip:{d}"
    assert embedding_key("default@v3", "text", "base", d) != embedding_key("default@v4", "text", "base", d)
    assert embedding_key("m@1", "image", "base", d.upper()).endswith(d)
    assert bytes_digest(b"abc") == text_digest("abc")


@pytest.mark.parametrize(
    "args",
    [
        ("default", "text", "base"),  # no version
        ("default@", "text", "base"),
        ("default@v1:x", "text", "base"),
        ("default@v1", "te:xt", "base"),
        ("default@v1", "text", ""),
    ],
)
def test_bad_key_parts_are_rejected(args: tuple[str, str, str]) -> None:
    with pytest.raises(ValueError):
        embedding_key(*args, text_digest("x"))
    with pytest.raises(ValueError):
        embedding_key_prefix(*args)


def test_key_prefix_and_digest_make_the_key() -> None:
    """The pipeline keys a request's many texts as prefix + digest: the same keys as one by one."""
    d = text_digest("a red circle")
    assert embedding_key_prefix("default@v3", "text", "pcclip") + d == embedding_key("default@v3", "text", "pcclip", d)


def test_bad_digest_is_rejected() -> None:
    with pytest.raises(ValueError):
        embedding_key("m@1", "text", "base", "not-a-digest")


@pytest.mark.parametrize("shape", [(64,), (3, 64), (2, 5, 7), ()])
def test_value_round_trip_keeps_shape_within_float16_precision(shape: tuple[int, ...]) -> None:
    arr = np.random.default_rng(1).uniform(-1, 1, size=shape).astype(np.float32)
    data = encode_value(arr)
    assert data[0] == 0x01 and len(data) == 2 + 4 * len(shape) + 2 * arr.size
    out = decode_value(data)
    assert out.dtype == np.float32 and out.shape == arr.shape
    np.testing.assert_allclose(out, arr, atol=1e-3)
    np.testing.assert_array_equal(out, quantize(arr))
    assert not out.flags.writeable
    stored = stored_value(arr)  # what the LRU holds for it, made without the bytes
    assert stored.dtype == np.float32 and stored.shape == arr.shape and not stored.flags.writeable
    np.testing.assert_array_equal(stored, out)


@pytest.mark.parametrize("data", [b"", b"\x02\x01", b"\x01\x01\x04\x00\x00\x00\x00"])
def test_malformed_values_are_rejected(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_value(data)


# -- LRU only -------------------------------------------------------------------------------


async def test_lru_only_round_trip_and_eviction() -> None:
    metrics = ServiceMetrics()
    cache = EmbeddingCache(None, lru_items=3, metrics=metrics)
    assert cache.redis_state == "disabled" and not await cache.ping()
    keys = keys_for(4)
    vecs = unit_vectors(4)
    await cache.put_many({k: v for k, v in zip(keys[:3], vecs[:3], strict=True)})
    await cache.get_many([keys[0]])  # touch 0: key 1 is now the least recently used
    await cache.put_many({keys[3]: vecs[3]})
    got = await cache.get_many(keys)
    assert got[1] is None
    for i in (0, 2, 3):
        value = got[i]
        assert value is not None
        np.testing.assert_allclose(value, vecs[i], atol=1e-3)
    assert len(cache) == 3
    assert cache_counts(metrics, "lru", "hit") == 4 and cache_counts(metrics, "lru", "miss") == 1
    await cache.close()


async def test_lru_is_bounded_by_bytes() -> None:
    cache = EmbeddingCache(None, lru_items=100, lru_max_bytes=3 * 64 * 4)
    keys = keys_for(5)
    await cache.put_many(dict(zip(keys, unit_vectors(5), strict=True)))
    assert len(cache) == 3
    assert (await cache.get_many(keys[:2])) == [None, None]


async def test_lru_hit_latency_benchmark() -> None:
    """Prints lookup latency; no assertion on timing (shared CI machines vary)."""
    cache = EmbeddingCache(None)
    keys = keys_for(1000)
    await cache.put_many(dict(zip(keys, unit_vectors(1000, dim=512), strict=True)))
    samples: list[float] = []
    for i in range(5000):
        t0 = time.perf_counter()
        value = await cache.get_many([keys[i % 1000]])
        samples.append(time.perf_counter() - t0)
        assert value[0] is not None
    q = statistics.quantiles(samples, n=100)
    batch = keys[:64]
    t0 = time.perf_counter()
    for _ in range(200):
        await cache.get_many(batch)
    per_batch = (time.perf_counter() - t0) / 200
    print(
        f"\nLRU hit, 1 key: p50 {q[49] * 1e6:.1f} us, p99 {q[98] * 1e6:.1f} us; "
        f"64 keys: {per_batch * 1e6:.1f} us per call"
    )


# -- with a real Redis ----------------------------------------------------------------------


async def test_redis_hits_after_lru_is_cleared_and_refill_lru(redis_server: RedisServer) -> None:
    metrics = ServiceMetrics()
    cache = EmbeddingCache(redis_server.url, ttl_s=3600, timeout_s=ROOMY_TIMEOUT_S, metrics=metrics)
    keys = keys_for(3)
    vecs = unit_vectors(3)
    dense = np.random.default_rng(2).standard_normal((4, 30)).astype(np.float32)
    dense_key = embedding_key("default@v3", "dense", "base", text_digest("map"))
    await cache.put_many({**dict(zip(keys, vecs, strict=True)), dense_key: dense})
    assert cache.redis_state == "up" and await cache.ping()
    assert 3500 < redis_server.client().ttl(keys[0]) <= 3600

    fresh = EmbeddingCache(redis_server.url, timeout_s=ROOMY_TIMEOUT_S, metrics=metrics)  # e.g. another replica
    got = await fresh.get_many([*keys, dense_key, keys_for(4)[3]])
    assert got[3] is not None and got[3].shape == (4, 30)
    np.testing.assert_allclose(got[3], dense, atol=2e-3)
    assert got[4] is None
    for i in range(3):
        value = got[i]
        assert value is not None
        np.testing.assert_array_equal(value, quantize(vecs[i]))
    assert cache_counts(metrics, "redis", "hit") == 4
    assert cache_counts(metrics, "redis", "miss") == 1

    before = redis_server.commands_processed()
    again = await fresh.get_many(keys)  # now served by the refilled LRU: no Redis command
    assert redis_server.commands_processed() - before == 1  # only the INFO call itself
    assert all(a is b for a, b in zip(again, got[:3], strict=True))
    # The writer's own LRU holds the values a reader gets from Redis: a result never depends on the layer.
    mine = await cache.get_many([*keys, dense_key])
    for value, from_redis in zip(mine, got[:4], strict=True):
        assert value is not None and from_redis is not None and not value.flags.writeable
        assert value.dtype == from_redis.dtype and value.shape == from_redis.shape
        np.testing.assert_array_equal(value, from_redis)
    await cache.close()
    await fresh.close()


async def test_many_keys_take_one_round_trip(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = EmbeddingCache(redis_server.url, timeout_s=ROOMY_TIMEOUT_S)
    assert await cache.ping()  # connection set-up commands happen here, not below
    keys = keys_for(200)
    client: Any = cache._redis
    executes = 0
    real_pipeline = client.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        async def execute(*a: Any, **kw: Any) -> Any:
            nonlocal executes
            executes += 1
            return await real_execute(*a, **kw)

        pipe.execute = execute
        return pipe

    monkeypatch.setattr(client, "pipeline", counting_pipeline)
    await cache.put_many(dict(zip(keys, unit_vectors(200), strict=True)))
    assert executes == 1
    assert redis_server.client().dbsize() == 200

    cache.clear_lru()
    before = redis_server.commands_processed()
    got = await cache.get_many(keys)
    delta = redis_server.commands_processed() - before
    assert all(v is not None for v in got)
    assert delta == 2  # one MGET + the INFO that measured it
    await cache.close()


async def test_redis_killed_degrades_to_misses_then_recovers(private_redis: RedisServer) -> None:
    metrics = ServiceMetrics()
    cache = EmbeddingCache(private_redis.url, timeout_s=0.2, retry_after_s=0.5, metrics=metrics)
    keys = keys_for(4)
    await cache.put_many({keys[0]: unit_vectors(1)[0]})
    assert cache.redis_state == "up"
    cache.clear_lru()

    private_redis.stop()
    t0 = time.perf_counter()
    assert await cache.get_many(keys[:2]) == [None, None]
    assert time.perf_counter() - t0 < 1.0
    assert cache.redis_state == "down"
    t0 = time.perf_counter()
    await cache.put_many({keys[1]: unit_vectors(2)[1]})  # breaker open: LRU only, no wait
    assert (await cache.get_many([keys[1]]))[0] is not None
    assert await cache.get_many([keys[2]]) == [None]
    assert time.perf_counter() - t0 < 0.2
    assert cache_counts(metrics, "redis", "error") >= 2

    private_redis.start()
    assert cache.redis_state == "down"  # the breaker waits out retry_after_s
    await asyncio.sleep(0.6)
    await cache.put_many({keys[3]: unit_vectors(4)[3]})
    assert cache.redis_state == "probing"  # one success is not trusted yet
    assert private_redis.client().exists(keys[3]) == 1
    cache.clear_lru()
    assert (await cache.get_many([keys[3]]))[0] is not None  # answered by Redis while probing
    await cache.get_many([keys[2]])
    assert cache.redis_state == "up"  # three successes in a row
    await cache.close()


async def test_a_redis_restarted_on_its_port_is_used_again_within_one_probe_interval(
    private_redis: RedisServer,
) -> None:
    """kill -9 and a restart on the same port leave every pooled socket dead. The first request
    on one fails and opens the breaker; after one pause the cache must be back, its probes on
    fresh sockets: a dead socket from before the restart is no reason to double the pause."""
    interval = 1.0
    metrics = ServiceMetrics()
    cache = EmbeddingCache(private_redis.url, timeout_s=0.5, retry_after_s=interval, metrics=metrics)
    vector = unit_vectors(1)[0]
    keys = iter(keys_for(2000))
    # Concurrent requests leave several connections in the client's pool, as a busy service does.
    await asyncio.gather(*(cache.put_many({next(keys): vector}) for _ in range(6)))
    admin = private_redis.client()
    assert len(admin.client_list()) >= 7  # six pooled connections and this one

    private_redis.stop()  # SIGKILL
    private_redis.start()  # same port, answering again
    admin = private_redis.client()
    back = time.monotonic()
    pauses: set[float] = set()
    recovered_after: float | None = None
    while recovered_after is None and time.monotonic() - back < 10 * interval:
        # Traffic as a service sees it: a lone request, then a burst of concurrent ones.
        await cache.put_many({next(keys): vector})
        burst = [next(keys) for _ in range(6)]
        await asyncio.gather(*(cache.put_many({key: vector}) for key in burst))
        pauses.add(cache._pause_s)
        if cache.redis_state == "up" and admin.exists(*burst) == len(burst):
            recovered_after = time.monotonic() - back
        await asyncio.sleep(0.02)

    assert pauses == {interval}, f"the pause grew: {sorted(pauses)}"
    assert recovered_after is not None and recovered_after < 2 * interval, recovered_after
    cache.clear_lru()
    hits = cache_counts(metrics, "redis", "hit")
    assert all(v is not None for v in await cache.get_many(burst))
    assert cache_counts(metrics, "redis", "hit") - hits == len(burst)  # reads reach Redis too
    await cache.close()


async def test_a_failure_after_a_successful_probe_keeps_the_pause(private_redis: RedisServer) -> None:
    """Redis answered a probe, then a connection was refused (it restarted again): the server
    is there, so the breaker waits the same pause again rather than twice as long."""
    cache = EmbeddingCache(private_redis.url, timeout_s=0.5, retry_after_s=0.5)
    keys = keys_for(4)
    await cache.put_many({keys[0]: unit_vectors(1)[0]})
    private_redis.stop()
    await cache.get_many(keys[1:2])
    assert cache.redis_state == "down" and cache._pause_s == pytest.approx(0.5)
    private_redis.start()
    await asyncio.sleep(0.55)
    await cache.put_many({keys[2]: unit_vectors(3)[2]})
    assert cache.redis_state == "probing"  # one success
    private_redis.stop()
    await cache.put_many({keys[3]: unit_vectors(4)[3]})  # refused
    assert cache.redis_state == "down" and cache._pause_s == pytest.approx(0.5)
    await cache.close()


async def test_unreachable_redis_is_a_miss_and_ping_reports_it() -> None:
    cache = EmbeddingCache(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.1)
    t0 = time.perf_counter()
    assert await cache.get_many(keys_for(2)) == [None, None]
    assert not await cache.ping()
    assert time.perf_counter() - t0 < 1.0
    assert cache.redis_state == "down"
    await cache.close()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts TCP connections and never answers: the slow-Redis case."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


async def test_silent_redis_times_out_within_timeout(silent_server: int) -> None:
    metrics = ServiceMetrics()
    cache = EmbeddingCache(f"redis://127.0.0.1:{silent_server}/0", timeout_s=0.1, metrics=metrics)
    t0 = time.perf_counter()
    assert await cache.get_many(keys_for(3)) == [None, None, None]
    await cache.put_many({keys_for(1)[0]: unit_vectors(1)[0]})
    assert cache.redis_state == "up"  # two timeouts: slow, maybe, not dead
    assert await cache.get_many(keys_for(6)[4:]) == [None, None]
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    assert cache.redis_state == "down"  # the third timeout in a row opens the breaker
    assert cache_counts(metrics, "redis", "error") == 3 + 1 + 2
    assert "TimeoutError" in (cache.last_error or "")
    await cache.close()


@pytest.mark.slow
async def test_a_slow_moment_does_not_open_the_breaker_and_a_restart_does_not_flap(
    private_redis: RedisServer,
) -> None:
    cache = EmbeddingCache(private_redis.url, timeout_s=0.15, retry_after_s=0.3)
    keys = keys_for(3)
    await cache.put_many({keys[0]: unit_vectors(1)[0]})
    admin = private_redis.client()
    for _ in range(2):  # Redis healthy but stalled (as under CPU load): a timeout, not an outage
        admin.execute_command("CLIENT", "PAUSE", "400", "ALL")
        cache.clear_lru()
        assert await cache.get_many(keys[:1]) == [None]
        time.sleep(0.45)
        cache.clear_lru()
        assert (await cache.get_many(keys[:1]))[0] is not None  # a success resets the count
        assert cache.redis_state == "up"
    # A dead server opens it at once; probes keep failing: the pause doubles.
    private_redis.stop()
    await cache.get_many(keys[1:2])
    assert cache.redis_state == "down"
    await asyncio.sleep(0.35)
    await cache.get_many(keys[1:2])  # probe fails
    assert cache.redis_state == "down" and cache._pause_s == pytest.approx(0.6)
    private_redis.start()
    await asyncio.sleep(0.65)
    states = []
    for k in keys:
        await cache.put_many({k: unit_vectors(3)[keys.index(k)]})
        states.append(cache.redis_state)
    assert states == ["probing", "probing", "up"]
    assert cache._pause_s == pytest.approx(0.3)  # back to the configured pause
    await cache.close()
