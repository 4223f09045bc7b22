"""The service on a store in S3 (a real SeaweedFS server on 127.0.0.1): it loads through the
local blob cache, watches the alias in the bucket and hot-swaps under continuous traffic
without failing a request, exactly as on a directory store."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_samples import metric_value

from model_store import ModelStore


def _client_loop(url: str, body: dict[str, Any], stop: threading.Event, seen: list[tuple[int, str]]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            try:
                response = client.post("/classify", json=body)
                seen.append((response.status_code, response.json().get("model", response.text)))
            except httpx.HTTPError as exc:  # a refused or dropped connection is a lost request too
                seen.append((0, f"{type(exc).__name__}: {exc}"))


@pytest.mark.slow
def test_hot_swap_through_s3_under_traffic_loses_no_request(
    s3_env: Any, tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    location = s3_env.new_location()
    publish_model(location, "swap", seed=7)
    body = {"images": [make_image("circle", "red")], "labels": ["red circle", "blue square", "green cross"]}
    seen: list[tuple[int, str]] = []
    stop = threading.Event()
    cache_dir = tmp_path / "pod-cache"
    with serve_app(store=location, model="swap@production", watch_interval_s=0.2, store_cache_dir=cache_dir) as running:
        threads = [threading.Thread(target=_client_loop, args=(running.url, body, stop, seen)) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        publish_model(location, "swap", seed=8, aliases=())  # v2 in the bucket, not yet promoted
        time.sleep(0.5)
        assert all(model == "swap@v1" for _, model in seen)
        # From another client, as a Job would (forced: random weights, never evaluated).
        ModelStore(location).promote("swap", "production", "v2", force=True, reason="random weights, never evaluated")
        deadline = time.monotonic() + 60
        while not seen or seen[-1][1] != "swap@v2":
            assert time.monotonic() < deadline, "the new version was never served"
            time.sleep(0.05)
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        swaps = metric_value(running.url, "clip_model_swaps_total", result="ok")
        cache = running.services.store.backend.cache
    assert {status for status, _ in seen} == {200}, [s for s in seen if s[0] != 200][:5]
    models = [model for _, model in seen]
    first_new = models.index("swap@v2")
    assert set(models[:first_new]) == {"swap@v1"} and set(models[first_new:]) == {"swap@v2"}
    assert models.count("swap@v1") > 0 and models.count("swap@v2") > 0
    assert swaps == 1
    # Both versions' weights came through the pod's cache, downloaded once each.
    assert cache.root == cache_dir and cache.fills >= 2 and len(list((cache_dir / "blobs").iterdir())) >= 2


@pytest.mark.slow
def test_a_restarted_server_loads_from_its_cache(
    s3_env: Any, tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    location = s3_env.new_location()
    publish_model(location, "cached", seed=3)
    cache_dir = tmp_path / "pod-cache"
    body = {"images": [make_image("square", "blue")], "labels": ["blue square", "red circle"]}
    answers = []
    for _ in range(2):  # the second run is the same pod after a restart
        with serve_app(store=location, model="cached@production", store_cache_dir=cache_dir) as running:
            response = httpx.post(f"{running.url}/classify", json=body, timeout=60)
            assert response.status_code == 200, response.text
            answers.append(response.json())
            cache = running.services.store.backend.cache
    assert cache.fills == 0 and cache.hits > 0  # nothing downloaded the second time
    assert answers[0]["model"] == answers[1]["model"] == "cached@v1"
    assert answers[0]["results"] == answers[1]["results"]
