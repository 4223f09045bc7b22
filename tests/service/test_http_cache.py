"""The embedding cache seen from outside: hits in /metrics, Redis as a second layer, Redis dying.

Each test uses its own model name so keys in the shared Redis cannot come from another test.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families


def samples(client: httpx.Client, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = client.get("/metrics").text
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def cache_counts(client: httpx.Client) -> dict[str, float]:
    counts = samples(client, "clip_cache_requests_total")
    return {f"{dict(k)['layer']}.{dict(k)['result']}": v for k, v in counts.items()}


def batch_items(client: httpx.Client, batcher: str) -> float:
    for labels, value in samples(client, "clip_batch_size_sum").items():
        if dict(labels).get("batcher") == batcher:
            return value
    return 0.0


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


@pytest.fixture(scope="module")
def cached(
    tmp_path_factory: pytest.TempPathFactory, publish_model: Any, serve_app: Any, service_redis: Any
) -> Iterator[tuple[httpx.Client, Any]]:
    root = tmp_path_factory.mktemp("cache-store")
    publish_model(root, "cachetest", seed=3)
    with (
        serve_app(store=str(root), model="cachetest@production", redis_url=service_redis.url) as running,
        httpx.Client(base_url=running.url, timeout=60) as c,
    ):
        yield c, running


def test_second_classify_takes_label_embeddings_from_cache(
    cached: tuple[httpx.Client, Any], make_image: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = cached
    labels = [
        f"{c} {s}"
        for c in ("red", "orange", "yellow", "green", "cyan", "blue", "purple")
        for s in ("circle", "square", "triangle", "diamond", "cross")
    ]  # 35 labels, 175 prompts
    body = {"images": [make_image("circle", "red")], "labels": labels}
    before = cache_counts(client)
    texts_before = batch_items(client, "text-base")
    t0 = time.perf_counter()
    first = client.post("/classify", json=body)
    t1 = time.perf_counter()
    mid = cache_counts(client)
    texts_mid = batch_items(client, "text-base")
    images_mid = batch_items(client, "image")
    second = client.post("/classify", json=body)
    t2 = time.perf_counter()
    after = cache_counts(client)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert texts_mid - texts_before == 175  # every prompt encoded once
    assert delta(mid, before, "lru.miss") == 176  # 175 prompts + 1 image
    assert delta(after, mid, "lru.hit") == 176  # everything came from the cache the second time
    assert batch_items(client, "text-base") == texts_mid and batch_items(client, "image") == images_mid

    # New image, same labels: only the image is encoded.
    third = client.post("/classify", json={**body, "images": [make_image("square", "blue")]})
    assert third.status_code == 200
    assert batch_items(client, "text-base") == texts_mid
    assert batch_items(client, "image") == images_mid + 1
    with capsys.disabled():
        print(f"\n/classify 175 prompts: first {1000 * (t1 - t0):.1f} ms, cached {1000 * (t2 - t1):.1f} ms")


def test_redis_serves_after_lru_is_cleared(cached: tuple[httpx.Client, Any]) -> None:
    client, running = cached
    texts = ["a purple cross seen from above", "two cyan diamonds"]
    first = client.post("/embed", json={"texts": texts}).json()
    running.services.cache.clear_lru()
    before = cache_counts(client)
    second = client.post("/embed", json={"texts": texts}).json()
    after = cache_counts(client)
    assert first["embeddings"] == second["embeddings"]
    assert delta(after, before, "lru.miss") == 2
    assert delta(after, before, "redis.hit") == 2


def test_redis_killed_mid_stream_all_requests_succeed(
    tmp_path: Path, publish_model: Any, serve_app: Any, private_redis: Any, make_image: Any
) -> None:
    publish_model(tmp_path / "store", "redisdeath", seed=4)
    image = make_image("triangle", "green")
    statuses: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    with serve_app(
        store=str(tmp_path / "store"),
        model="redisdeath@production",
        redis_url=private_redis.url,
        redis_timeout_s=0.2,
        redis_retry_after_s=0.5,
    ) as running:
        assert running.services.cache.redis_state == "up"

        def stream() -> None:
            with httpx.Client(base_url=running.url, timeout=30) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        # Fresh texts every time, so each request goes to Redis.
                        r = c.post("/classify", json={"images": [image], "labels": [f"label {i}", f"other {i}"]})
                        statuses.append(r.status_code)
                    except BaseException as exc:
                        errors.append(exc)

        thread = threading.Thread(target=stream)
        thread.start()
        deadline = time.monotonic() + 30
        while len(statuses) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        private_redis.stop()  # SIGKILL: connections drop mid-command
        killed_at = len(statuses)
        while len(statuses) < killed_at + 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        state_after_kill = running.services.cache.redis_state
        private_redis.start()  # same port: the breaker probes again after retry_after
        restarted_at = len(statuses)
        while len(statuses) < restarted_at + 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.6)
        stop.set()
        thread.join(timeout=30)
        with httpx.Client(base_url=running.url) as c:
            counts = cache_counts(c)
            # A busy machine can time a command out (0.2 s) after the restart too, which opens the
            # breaker again for retry_after: the cache must come back up within a few of those.
            recovery_deadline = time.monotonic() + 15
            for i in itertools.count():
                c.post("/embed", json={"texts": [f"after restart {i}"]})
                state_final = running.services.cache.redis_state
                if state_final == "up" or time.monotonic() > recovery_deadline:
                    break
                time.sleep(0.6)
    assert not errors, errors
    assert len(statuses) >= killed_at + 15
    assert set(statuses) == {200}, statuses
    assert state_after_kill == "down"
    assert counts.get("redis.error", 0) >= 1
    assert state_final == "up"


def test_the_cache_state_is_reported_without_changing_readiness(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    publish_model(tmp_path, "cached", seed=16)
    dead = "redis://127.0.0.1:1/0"  # nothing listens there
    with serve_app(store=str(tmp_path), model="cached@production", redis_url=dead) as running:
        httpx.post(f"{running.url}/embed", json={"texts": ["a red circle"]}).raise_for_status()
        ready = httpx.get(f"{running.url}/readyz")
        assert ready.status_code == 200 and ready.json()["redis"] == "down"  # ready all the same
        cache = httpx.get(f"{running.url}/models").json()["cache"]
        assert cache["redis"] == "down" and "Error" in (cache["last_error"] or "") and cache["lru_items"] >= 1
