"""Readiness, backpressure and hot swaps, with real servers on their own tmp stores.

Hot swap: a client thread sends requests without pause while a new version is published and
promoted; no request may fail and later answers must name the new version. A promoted version
whose weights were damaged after publishing is refused and the old version keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_until
from prometheus_samples import metric_value

from model_store import ModelStore


def _served(ref: str, serving: str, store: str = "ok") -> dict[str, Any]:
    """One entry of /readyz's ``models``: the only, default, model of the set, serving (no canary:
    its primary answers every caller)."""
    return {"ref": ref, "serving": serving, "state": "ready", "default": True, "store": store, "canary": None,
            "answers": serving, "quarantine": None}  # fmt: skip


@pytest.mark.slow
def test_not_ready_until_model_exists(tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any) -> None:
    root = tmp_path / "store"
    root.mkdir()
    with serve_app(
        store=str(root), model="late@production", watch_interval_s=0.2, ready=False, probes_list_models=True
    ) as running:
        r = httpx.get(f"{running.url}/readyz")
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "not_ready" and "late@production" in r.json()["error"]["message"]
        assert r.headers["retry-after"] == "1"
        r = httpx.post(f"{running.url}/classify", json={"images": [make_image()], "labels": ["a", "b"]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert httpx.get(f"{running.url}/healthz").status_code == 200
        assert httpx.get(f"{running.url}/models").json()["models"] == []
        assert httpx.get(f"{running.url}/models").json()["serving"] is None
        publish_model(root, "late", seed=5)
        deadline = time.monotonic() + 30
        while httpx.get(f"{running.url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert httpx.get(f"{running.url}/readyz").json() == {
            "ready": True,
            "model": "late@v1",
            "redis": "disabled",
            "store": "ok",
            "models": [_served("late@production", "late@v1")],
        }


@pytest.mark.slow
def test_queue_full_is_429_with_retry_after(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    publish_model(tmp_path, "busy", seed=6)
    # A long batching window keeps the first request's images queued; the queue holds 2 items.
    batching = {"max_queue": 2, "max_batch_images": 64, "max_wait_ms": 1500}
    with serve_app(store=str(tmp_path), model="busy@production", batching=batching) as running:
        images = [make_image("circle", c) for c in ("red", "blue", "green", "cyan", "purple", "orange")]

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=running.url, timeout=30) as c:
                calls = [c.post("/embed", json={"images": images[2 * i : 2 * i + 2]}) for i in range(3)]
                return await asyncio.gather(*calls)

        responses = asyncio.run(burst())
        statuses = sorted(r.status_code for r in responses)
        assert statuses[0] == 200 and 429 in statuses, statuses
        for r in responses:
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "overloaded"
                assert int(r.headers["retry-after"]) >= 1
        assert metric_value(running.url, "clip_batcher_rejected_total", reason="queue_full") >= 1
        # Refused before decoding: only the accepted request's images were decoded.
        accepted = sum(2 for r in responses if r.status_code == 200)
        assert metric_value(running.url, "clip_images_decoded_total") == accepted


def _client_loop(url: str, body: dict[str, Any], stop: threading.Event, seen: list[tuple[int, str]]) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        while not stop.is_set():
            r = c.post("/classify", json=body)
            seen.append((r.status_code, r.json().get("model", r.text)))


@pytest.mark.slow
def test_hot_swap_without_failed_requests(tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any) -> None:
    root = tmp_path / "store"
    publish_model(root, "swap", seed=7)
    body = {"images": [make_image("circle", "red")], "labels": ["red circle", "blue square", "green cross"]}
    seen: list[tuple[int, str]] = []
    stop = threading.Event()
    with serve_app(store=str(root), model="swap@production", watch_interval_s=0.2) as running:
        threads = [threading.Thread(target=_client_loop, args=(running.url, body, stop, seen)) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        publish_model(root, "swap", seed=8, aliases=())  # v2, not yet promoted
        time.sleep(0.5)
        assert all(model == "swap@v1" for _, model in seen)
        ModelStore(root).promote("swap", "production", "v2", force=True, reason="random weights, never evaluated")
        deadline = time.monotonic() + 30
        while not seen or seen[-1][1] != "swap@v2":
            assert time.monotonic() < deadline, "the new version was never served"
            time.sleep(0.05)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        swaps = metric_value(running.url, "clip_model_swaps_total", result="ok")
        info = httpx.get(f"{running.url}/metrics").text
    assert {status for status, _ in seen} == {200}, [s for s in seen if s[0] != 200][:5]
    models = [m for _, m in seen]
    first_new = models.index("swap@v2")
    assert set(models[:first_new]) == {"swap@v1"}
    assert models.count("swap@v1") > 0 and models.count("swap@v2") > 0
    assert swaps == 1
    assert 'version="v2"' in info and 'version="v1"' not in info


def test_corrupt_version_is_refused_old_keeps_serving(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    root = tmp_path / "store"
    publish_model(root, "guarded", seed=9)
    body = {"images": [make_image("square", "blue")], "labels": ["red circle", "blue square"]}
    seen: list[tuple[int, str]] = []
    stop = threading.Event()
    with serve_app(
        store=str(root), model="guarded@production", watch_interval_s=0.2, probes_list_models=True
    ) as running:
        thread = threading.Thread(target=_client_loop, args=(running.url, body, stop, seen))
        thread.start()
        store = ModelStore(root)
        version = publish_model(root, "guarded", seed=10, aliases=())
        weights = store.version_dir("guarded", version) / "model.safetensors"
        raw = bytearray(weights.read_bytes())
        raw[len(raw) // 2] ^= 0xFF  # bit rot after publishing
        weights.write_bytes(bytes(raw))
        store.verify = lambda *_: None  # type: ignore[method-assign]  # promote would catch it; the server must too
        store.promote("guarded", "production", version, force=True, reason="random weights, never evaluated")
        deadline = time.monotonic() + 30
        while metric_value(running.url, "clip_model_swaps_total", result="refused") < 1:
            assert time.monotonic() < deadline, "the corrupt version was not refused"
            time.sleep(0.1)
        time.sleep(0.6)  # a few more polls: it must not be retried or swapped in
        stop.set()
        thread.join(timeout=60)
        ready = httpx.get(f"{running.url}/readyz").json()
        refused = metric_value(running.url, "clip_model_swaps_total", result="refused")
        models = httpx.get(f"{running.url}/models").json()
    assert ready == {
        "ready": True,
        "model": "guarded@v1",
        "redis": "disabled",
        "store": "ok",
        "models": [_served("guarded@production", "guarded@v1")],
    }
    assert refused == 1
    assert seen and {status for status, _ in seen} == {200}
    assert {m for _, m in seen} == {"guarded@v1"}
    assert models["models"][0]["aliases"] == {"production": "v2"} and models["models"][0]["serving"] == "v1"


def test_pinned_version_is_not_swapped(tmp_path: Path, serve_app: Any, publish_model: Any) -> None:
    publish_model(tmp_path, "pinned", seed=11)
    with serve_app(store=str(tmp_path), model="pinned@v1", watch_interval_s=0.1, probes_list_models=True) as running:
        publish_model(tmp_path, "pinned", seed=12)  # v2 becomes production
        time.sleep(0.5)
        assert httpx.get(f"{running.url}/readyz").json()["model"] == "pinned@v1"
        r = httpx.post(f"{running.url}/embed", json={"texts": ["a"], "model": "pinned@production"})
        assert r.status_code == 404  # the server does not follow the alias, so it does not claim it
        assert json.loads(r.text)["error"]["code"] == "unknown_model"


@pytest.mark.parametrize("redis_url", ["redis://127.0.0.1:1/0"])
def test_unreachable_redis_at_start_still_serves(
    tmp_path: Path, serve_app: Any, publish_model: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    publish_model(tmp_path, "noredis", seed=13)
    with (
        caplog.at_level("WARNING"),
        serve_app(store=str(tmp_path), model="noredis@production", redis_url=redis_url) as running,
    ):
        r = httpx.post(f"{running.url}/embed", json={"texts": ["hello"]})
        assert r.status_code == 200
        assert running.services.cache.redis_state == "down"
    assert any("unreachable" in rec.getMessage() for rec in caplog.records)


def test_version_failing_warm_up_is_refused(tmp_path: Path, serve_app: Any, publish_model: Any) -> None:
    import torch

    from clipcore.models.clip_model import build_model
    from clipcore.models.publish import TrainedModel, publish_bundle

    publish_model(tmp_path, "warm", seed=15)
    with serve_app(
        store=str(tmp_path), model="warm@production", watch_interval_s=0.2, probes_list_models=True
    ) as running:
        config = json.loads((Path(__file__).resolve().parents[2] / "training/configs/shapes-smoke.json").read_text())
        broken = build_model(config)
        with torch.no_grad():
            broken.text_projection.fill_(float("nan"))  # checksums fine, embeddings NaN
        publish_bundle(ModelStore(tmp_path), "warm", TrainedModel(broken, config, fp16=False), aliases=["production"],
                       force=True, reason="random weights, never evaluated")  # fmt: skip
        deadline = time.monotonic() + 30
        while metric_value(running.url, "clip_model_swaps_total", result="refused") < 1:
            assert time.monotonic() < deadline, "a version that fails warm-up was swapped in"
            time.sleep(0.1)
        assert httpx.get(f"{running.url}/readyz").json()["model"] == "warm@v1"
        assert httpx.post(f"{running.url}/embed", json={"texts": ["still fine"]}).status_code == 200


def test_graceful_shutdown_finishes_in_flight_requests(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    publish_model(tmp_path, "drain", seed=16)
    results: list[int] = []
    with serve_app(store=str(tmp_path), model="drain@production", batching={"max_wait_ms": 800}) as running:

        def call() -> None:
            r = httpx.post(f"{running.url}/embed", json={"images": [make_image("cross", "purple")]}, timeout=30)
            results.append(r.status_code)

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.3)  # the request is now waiting in the batcher
        running.server.should_exit = True
        thread.join(timeout=30)
    assert results == [200]


def test_request_past_its_deadline_is_504(tmp_path: Path, serve_app: Any, publish_model: Any) -> None:
    publish_model(tmp_path, "slow", seed=17)
    batching = {"request_timeout_s": 0.05, "max_wait_ms": 1000, "max_batch_texts": 64}
    with serve_app(store=str(tmp_path), model="slow@production", batching=batching) as running:
        r = httpx.post(f"{running.url}/embed", json={"texts": ["waits in the queue past its deadline"]})
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert metric_value(running.url, "clip_batcher_rejected_total", reason="deadline") >= 1


@pytest.mark.slow
def test_the_watcher_survives_an_unreadable_alias_table_and_swaps_afterwards(
    tmp_path: Path, serve_app: Any, publish_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    publish_model(root, "watch", seed=8)
    aliases = root / "watch" / "aliases.json"
    good = aliases.read_bytes()
    with serve_app(store=str(root), model="watch@production", watch_interval_s=0.1, probes_list_models=True) as running:
        manager = running.services.manager
        for broken in (b'{"aliases": {"production": ', b"\xff\xfe not json"):  # half-written, then garbage
            aliases.write_bytes(broken)
            wait_until(lambda: manager.watch_error is not None)
            ready = httpx.get(f"{running.url}/readyz")
            assert ready.status_code == 200
            assert ready.json() == {
                "ready": True,
                "model": "watch@v1",
                "redis": "disabled",
                "store": "unreadable",
                "models": [_served("watch@production", "watch@v1", store="unreadable")],
            }
            assert metric_value(running.url, "clip_store_watch_ok") == 0
            time.sleep(0.3)  # several polls fail; the watcher keeps polling
            assert manager._task is not None and not manager._task.done()
        aliases.unlink()
        aliases.mkdir()  # a directory where the file should be: another error type
        wait_until(lambda: "IsADirectoryError" in (manager.watch_error or ""))
        aliases.rmdir()
        aliases.write_bytes(good)
        wait_until(lambda: manager.watch_error is None)
        assert metric_value(running.url, "clip_store_watch_ok") == 1
        publish_model(root, "watch", seed=9)  # v2, promoted to production
        wait_until(lambda: httpx.get(f"{running.url}/readyz").json()["model"] == "watch@v2")
        assert httpx.get(f"{running.url}/readyz").json()["store"] == "ok"
    assert any("cannot read alias watch@production" in r.getMessage() for r in caplog.records)


def test_readyz_names_no_internal_path(tmp_path: Path, serve_app: Any) -> None:
    missing = tmp_path / "secret-mount" / "store"
    (missing / "gone" / "aliases.json").mkdir(parents=True)  # unreadable: the error names its path
    with serve_app(store=str(missing), model="gone@production", watch_interval_s=0.1, ready=False) as running:
        wait_until(lambda: running.services.manager.last_error is not None)
        assert "secret-mount" in (running.services.manager.last_error or "")  # the log has it
        r = httpx.get(f"{running.url}/readyz")
        assert r.status_code == 503 and "secret-mount" not in r.text and "gone@production" in r.text
        # Nor does any other endpoint that cannot answer yet (a server without keys is open to all).
        r = httpx.post(f"{running.url}/embed", json={"texts": ["a"]})
        assert r.status_code == 503 and "secret-mount" not in r.text and "gone@production" in r.text


def test_a_version_that_cannot_be_read_yet_is_retried_not_refused(
    tmp_path: Path, serve_app: Any, publish_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    publish_model(root, "flaky", seed=14)
    with serve_app(store=str(root), model="flaky@production", watch_interval_s=0.1, probes_list_models=True) as running:
        store = ModelStore(root)
        version = publish_model(root, "flaky", seed=15, aliases=())
        weights = store.version_dir("flaky", version) / "model.safetensors"
        saved = weights.read_bytes()
        weights.unlink()
        weights.mkdir()  # unreadable (EISDIR), as a flaky mount or a copy in progress can be
        store.verify = lambda *_: None  # type: ignore[method-assign]  # promote would catch it; the server must too
        store.promote("flaky", "production", version, force=True, reason="random weights, never evaluated")
        wait_until(lambda: metric_value(running.url, "clip_model_swaps_total", result="retrying") >= 2)
        assert httpx.get(f"{running.url}/readyz").json()["model"] == "flaky@v1"
        weights.rmdir()
        weights.write_bytes(saved)  # readable again: the next try swaps it in
        wait_until(lambda: httpx.get(f"{running.url}/readyz").json()["model"] == "flaky@v2")
        assert metric_value(running.url, "clip_model_swaps_total", result="refused") == 0
        assert metric_value(running.url, "clip_model_swaps_total", result="ok") == 1
    assert any("cannot load flaky@v2 yet" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_the_watcher_backs_off_and_logs_once_while_polls_keep_failing(
    tmp_path: Path, serve_app: Any, publish_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    publish_model(tmp_path, "buggy", seed=16)
    with serve_app(store=str(tmp_path), model="buggy@production", watch_interval_s=0.05) as running:
        manager = running.services.manager
        calls: list[float] = []

        async def failing_poll() -> None:
            calls.append(time.monotonic())
            raise RuntimeError("a bug in one poll")

        manager.reconciler.poll_once = failing_poll  # type: ignore[method-assign]
        time.sleep(2.0)
        assert manager._task is not None and not manager._task.done()
    # 0.05 s between polls would be 40 polls; doubling waits (0.05, 0.1, 0.2, ...) make about 6.
    assert 3 <= len(calls) <= 10, len(calls)
    assert sum("a bug in one poll" in (r.exc_text or "") or r.exc_info is not None for r in caplog.records) == 1


def test_shutdown_stops_a_version_still_draining(tmp_path: Path, serve_app: Any, publish_model: Any) -> None:
    root = tmp_path / "store"
    publish_model(root, "draining", seed=17)
    with serve_app(store=str(root), model="draining@production", watch_interval_s=0.1, drain_timeout_s=600) as running:
        manager = running.services.manager
        old = manager.current
        old.active += 1  # a request that never finishes holds v1 (nothing else touches it meanwhile)
        old.idle.clear()
        publish_model(root, "draining", seed=18)  # v2 = production
        wait_until(lambda: manager.current.ref == "draining@v2")
        assert list(manager.drain.retiring.values()) == [old]
    assert old.executor._shutdown and all(b._closing for b in old.batchers)  # its model thread is gone


def test_shutdown_closes_pipeline_and_cache_even_when_the_model_manager_fails(
    tmp_path: Path, serve_app: Any, publish_model: Any, service_redis: Any
) -> None:
    publish_model(tmp_path, "closing", seed=19)
    with serve_app(store=str(tmp_path), model="closing@production", redis_url=service_redis.url) as running:
        services = running.services
        assert services.cache._redis is not None

        async def failing_close() -> None:
            raise RuntimeError("the watcher had died")

        services.manager.close = failing_close  # type: ignore[method-assign]
    assert services.pipeline.decode_pool._shutdown and services.cache._redis is None


def test_an_unreadable_manifest_is_listed_with_its_error_not_a_failed_listing(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    root = tmp_path / "store"
    publish_model(root, "listed", seed=10, aliases=())  # v1, never served
    publish_model(root, "listed", seed=11)  # v2 = production
    (root / "listed" / "versions" / "v1" / "manifest.json").write_text("{ not json")
    with serve_app(store=str(root), model="listed@production") as running:
        listing = httpx.get(f"{running.url}/models")
        assert listing.status_code == 200, listing.text
        (model,) = listing.json()["models"]
        v1, v2 = model["versions"]
        assert v1["version"] == "v1" and v1["error"].startswith("InvalidManifest") and "Invalid JSON" in v1["error"]
        assert v2["serving"] and v2["error"] is None and v2["aliases"] == ["production"]
        one = httpx.get(f"{running.url}/models/listed")
        assert one.status_code == 200 and one.json()["serving"] == "v2"
        (root / "listed" / "versions" / "v1" / "manifest.json").unlink()
        (root / "listed" / "versions" / "v1" / "manifest.json").mkdir()  # no manifest blob: not a version
        assert [v["version"] for v in httpx.get(f"{running.url}/models/listed").json()["versions"]] == ["v2"]
        aliases = root / "listed" / "aliases.json"
        aliases.rename(root / "aliases.kept")
        aliases.mkdir()  # an OSError names its path, relative to the store
        model = httpx.get(f"{running.url}/models/listed").json()
        assert model["error"] == "IsADirectoryError: [Errno 21] Is a directory: 'listed/aliases.json'"
        aliases.rmdir()
        aliases.write_text("[")  # a corrupt alias table
        model = httpx.get(f"{running.url}/models/listed").json()
        assert model["aliases"] == {} and model["error"] and len(model["versions"]) == 1
        assert str(tmp_path) not in httpx.get(f"{running.url}/models").text
        assert httpx.get(f"{running.url}/models/nothing").status_code == 404


def test_a_swapped_out_version_is_freed(tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any) -> None:
    import gc
    import weakref

    root = tmp_path / "store"
    publish_model(root, "freed", seed=12)
    with serve_app(store=str(root), model="freed@production", watch_interval_s=0.1, drain_timeout_s=2) as running:
        manager = running.services.manager
        old_runtime = weakref.ref(manager.current)
        old_model = weakref.ref(manager.current.bundle.model)
        body = {"images": [make_image("circle", "red")], "labels": ["red circle", "blue square"]}
        assert httpx.post(f"{running.url}/classify", json=body, timeout=30).status_code == 200
        publish_model(root, "freed", seed=13)
        wait_until(lambda: manager.current is not None and manager.current.ref == "freed@v2")
        wait_until(lambda: not manager.drain.retiring)  # drained and stopped
        assert httpx.post(f"{running.url}/classify", json=body, timeout=30).status_code == 200
        deadline = time.monotonic() + 10
        while old_model() is not None or old_runtime() is not None:
            gc.collect()
            assert time.monotonic() < deadline, "the old version is still referenced"
            time.sleep(0.1)
