"""Canary routing with real servers, real forward passes and real alias moves through ModelStore.

The store holds the tiny DCSM model twice: v1 (production) and v2 (the same weights); the
versions are told apart by the ``model`` every answer names. A canary of v2 answers its share of
the callers, picked by a stable hash of ``X-Canary-Key`` (else the API key), exactly as
``model_store.routing.route`` picks; a widened canary keeps its callers; rollback and promote
under load fail no request and apply at the first poll after the move; a canary that cannot load
is refused and the primary answers everything.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_until
from prometheus_samples import metric_value

from model_store import ModelStore
from model_store.routing import route

UNEVALUATED = "random weights, never evaluated"  # the evaluation gate has nothing to compare: moves are forced


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any) -> Path:
    root = tmp_path_factory.mktemp("canary-store")
    publish_dense_model(root, "split")  # v1, production
    publish_dense_model(root, "split", aliases=())  # v2: the same weights
    return root


@pytest.fixture
def store_root(published: Path, tmp_path: Path) -> Path:
    """A copy of the published store for this test's alias moves."""
    root = tmp_path / "store"
    shutil.copytree(published, root)
    return root


def _canary(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return httpx.get(f"{url}/models/split", headers=headers).json().get("canary") or {}


async def _embed_as(url: str, keys: list[str], headers: dict[str, str], concurrency: int = 8) -> list[str]:
    """The version answering an /embed of a short text from each caller key, in order."""
    slots = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, key: str) -> str:
        async with slots:
            r = await client.post("/embed", json={"texts": ["a red circle"]}, headers={**headers, "X-Canary-Key": key})
        assert r.status_code == 200, r.text
        assert r.headers["x-model"] == r.json()["model"]
        return str(r.json()["model"])

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return list(await asyncio.gather(*(one(client, key) for key in keys)))


@pytest.mark.slow
def test_a_canary_answers_its_share_of_the_callers_by_key(
    store_root: Path, serve_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    api_keys = [f"secret-key-{i:02d}" for i in range(20)]
    auth = {"Authorization": f"Bearer {api_keys[0]}"}
    store = ModelStore(store_root)
    with (
        caplog.at_level("INFO"),
        serve_app(store=str(store_root), model="split@production", watch_interval_s=0.2, api_keys=api_keys) as running,
    ):
        url = running.url
        store.canary("split", "production", "v2", 10, force=True, reason=UNEVALUATED)
        wait_until(lambda: _canary(url, auth).get("loaded"))
        assert _canary(url, auth) == {"version": "v2", "weight": 10.0, "loaded": True, "problem": None}
        entry = store.alias_entry("split", "production")
        assert entry is not None
        rng = random.Random(7)
        callers = [f"caller-{rng.getrandbits(64):016x}" for _ in range(2000)]
        versions = asyncio.run(_embed_as(url, callers, auth))
        share = versions.count("split@v2") / len(versions)
        assert 0.07 <= share <= 0.13, share
        # Exactly the store's routing function, on the key's bytes: every replica routes alike.
        assert versions == [f"split@{route(entry, key)}" for key in callers]
        assert asyncio.run(_embed_as(url, callers[:300], auth)) == versions[:300]  # one caller, one version
        assert metric_value(url, "clip_version_requests_total", version="v2", role="canary", status="200") == (
            versions.count("split@v2") + versions[:300].count("split@v2")
        )
        assert metric_value(url, "clip_version_requests_total", version="v1", role="primary") > 0
        assert metric_value(url, "clip_canary_weight_ratio", version="v2") == 0.1
        # One meaning of `model`: the served-set entry, on the versioned series as on the others.
        entry = {"model": "split@production"}
        assert metric_value(url, "clip_model_info", **entry, version="v1", encoder="base") == 1
        assert metric_value(url, "clip_canary_weight_ratio", **entry, version="v2") == 0.1
        assert metric_value(url, "clip_version_requests_total", **entry, version="v1", role="primary") > 0

        # Widening the canary (picked up at the next poll) keeps every caller it had.
        store.canary("split", "production", "v2", 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: _canary(url, auth).get("weight") == 50)
        wider_entry = store.alias_entry("split", "production")
        assert wider_entry is not None
        wider = asyncio.run(_embed_as(url, callers[:500], auth))
        assert wider == [f"split@{route(wider_entry, key)}" for key in callers[:500]]
        assert all(w == "split@v2" for w, v in zip(wider, versions, strict=False) if v == "split@v2")
        assert 0.4 <= wider.count("split@v2") / 500 <= 0.6

        # Without X-Canary-Key the API key routes: each key stays on one version.
        from service.runtime.canary import caller_key

        by_key: dict[str, set[str]] = {}
        with httpx.Client(base_url=url, timeout=60) as client:
            for key in api_keys:
                for _ in range(2):
                    headers = {"Authorization": f"Bearer {key}"}
                    r = client.post("/embed", json={"texts": ["a red circle"]}, headers=headers)
                    assert r.status_code == 200, r.text
                    by_key.setdefault(key, set()).add(r.json()["model"])
        assert all(len(seen) == 1 for seen in by_key.values()), by_key
        expected = {key: f"split@{route(wider_entry, caller_key(None, f'Bearer {key}'))}" for key in api_keys}
        assert {key: seen.pop() for key, seen in by_key.items()} == expected
        assert set(expected.values()) == {"split@v1", "split@v2"}
        exported = httpx.get(f"{url}/metrics").text
    # The key is only hashed: neither the metrics nor any log line holds it.
    assert not [key for key in api_keys if key in exported]
    assert not [r.getMessage() for r in caplog.records if any(key in r.getMessage() for key in api_keys)]


def test_every_endpoint_names_the_version_that_answered(store_root: Path, serve_app: Any, make_image: Any) -> None:
    store = ModelStore(store_root)
    red, blue = make_image("circle", "red"), make_image("square", "blue")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/classify", {"images": [red, blue], "labels": ["red circle", "blue square"]}),
        ("/rank-pair", {"image_a": red, "image_b": blue, "difference": "the first is red"}),
        ("/rank", {"images": [red, blue], "difference": "more red"}),
        ("/score/dense", {"image": red, "texts": ["a red circle", "a blue square"]}),
        ("/embed", {"texts": ["a red circle"]}),
        ("/embed", {"images": [red]}),
        ("/v1/embeddings", {"input": ["a red circle"], "model": "split"}),
        ("/embed", {"texts": ["a red circle"], "model": "split@production"}),  # the alias: whoever answers
        ("/embed", {"texts": ["a red circle"], "model": "split"}),
    ]
    with serve_app(store=str(store_root), model="split@production", watch_interval_s=0.2) as running:
        url = running.url
        store.canary("split", "production", "v2", 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: _canary(url).get("loaded"))
        entry = store.alias_entry("split", "production")
        assert entry is not None
        key_of = {route(entry, key): key for key in (f"caller-{i}" for i in range(64))}
        assert set(key_of) == {"v1", "v2"}
        with httpx.Client(base_url=url, timeout=60) as client:
            for version, key in sorted(key_of.items()):
                headers, answered = {"X-Canary-Key": key}, f"split@{version}"
                for path, body in calls:
                    r = client.post(path, json=body, headers=headers)
                    assert r.status_code == 200, (path, r.text)
                    assert (r.json()["model"], r.headers["x-model"]) == (answered, answered), path
                r = client.post("/score/dense/heatmap", json={"image": red, "text": "a red circle"}, headers=headers)
                assert r.status_code == 200 and r.headers["content-type"] == "image/png"
                assert r.headers["x-model"] == answered  # a PNG has no body field: the header names it
                # /v1/models lists the served set: the model name (whichever version answers the
                # caller) and the primary's exact version; a canary is reached through the name.
                models = client.get("/v1/models", headers=headers).json()
                assert {"split", "split@v1"} <= {m["id"] for m in models["data"]}
                r = client.post("/embed", json={"texts": ["a"]}, headers={**headers, "X-Canary-Key": ""})
                assert r.status_code == 200  # an empty key is no key: routed at random


@pytest.mark.slow
def test_rollback_and_promote_under_load_fail_no_request(store_root: Path, serve_app: Any) -> None:
    store = ModelStore(store_root)
    seen: list[tuple[float, int, str]] = []  # (sent at, status, version that answered)
    stop = threading.Event()

    def client(seed: int, url: str) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                key = f"caller-{rng.getrandbits(64):x}"  # a new caller each time: both versions get traffic
                sent = time.monotonic()
                r = c.post("/embed", json={"texts": ["a red circle"]}, headers={"X-Canary-Key": key})
                seen.append((sent, r.status_code, r.json().get("model", r.text)))

    def answered_since(moment: float) -> set[str]:
        return {model for sent, _, model in list(seen) if sent > moment}

    with serve_app(
        store=str(store_root), model="split@production", watch_interval_s=0.2, probes_list_models=True
    ) as running:
        url, manager = running.url, running.services.manager
        polls: list[tuple[float, float]] = []  # (started, finished) of each poll of the alias
        poll = manager.reconciler.poll_once

        async def timed_poll() -> None:
            started = time.monotonic()
            await poll()
            polls.append((started, time.monotonic()))

        manager.reconciler.poll_once = timed_poll  # type: ignore[method-assign]

        def applied(moved_at: float) -> float:
            """When the first poll that began after the move ended: it read the move."""
            wait_until(lambda: any(started > moved_at for started, _ in polls))
            return min(finished for started, finished in polls if started > moved_at)

        threads = [threading.Thread(target=client, args=(seed, url)) for seed in range(4)]
        for t in threads:
            t.start()
        store.canary("split", "production", "v2", 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: _canary(url).get("loaded"))
        loaded = time.monotonic()
        wait_until(lambda: answered_since(loaded) == {"split@v1", "split@v2"})

        store.rollback("split", "production")  # the canary ends at 0 %
        moved = time.monotonic()  # once written: a poll that begins later reads it
        converged = applied(moved)
        wait_until(lambda: len([s for s, _, _ in list(seen) if s > converged]) >= 40)
        assert answered_since(converged) == {"split@v1"}

        store.canary("split", "production", "v2", 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: _canary(url).get("loaded"))
        loaded = time.monotonic()
        wait_until(lambda: "split@v2" in answered_since(loaded))
        store.promote("split", "production", "v2", force=True, reason=UNEVALUATED)  # the canary ends at 100 %
        moved = time.monotonic()
        converged = applied(moved)
        wait_until(lambda: len([s for s, _, _ in list(seen) if s > converged]) >= 40)
        assert answered_since(converged) == {"split@v2"}
        stop.set()
        for t in threads:
            t.join(timeout=60)
        ready = httpx.get(f"{url}/readyz").json()
        canary_loads = metric_value(url, "clip_side_loads_total", role="canary", result="ok")
    assert len(seen) > 200 and {status for _, status, _ in seen} == {200}, [s for s in seen if s[1] != 200][:5]
    assert ready["model"] == "split@v2"
    assert canary_loads == 2  # promoted as it was loaded: nothing loaded again for the promotion


def test_a_canary_that_cannot_load_is_refused_and_the_primary_answers_everything(
    store_root: Path, serve_app: Any, publish_dense_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    broken = publish_dense_model(store_root, "split", broken=True, aliases=())  # NaN scorer: fails warm-up
    store = ModelStore(store_root)
    with serve_app(store=str(store_root), model="split@production", watch_interval_s=0.1) as running:
        url = running.url
        store.canary("split", "production", broken, 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: metric_value(url, "clip_side_loads_total", role="canary", result="refused") == 1)
        callers = [f"caller-{i}" for i in range(40)]
        assert set(asyncio.run(_embed_as(url, callers, {}))) == {"split@v1"}
        assert _canary(url) == {
            "version": broken, "weight": 50.0, "loaded": False, "problem": f"{broken} refused: ValueError"
        }  # fmt: skip
        time.sleep(0.5)  # several polls: a refused version is not tried again
        assert metric_value(url, "clip_side_loads_total", role="canary", result="refused") == 1
        assert metric_value(url, "clip_canary_weight_ratio") == 0  # no split is exported for a canary not loaded
    assert any(f"refusing canary split@{broken}" in r.getMessage() for r in caplog.records)


def test_a_request_naming_a_version_gets_it_and_v1_models_names_the_callers_version(
    store_root: Path, serve_app: Any
) -> None:
    store = ModelStore(store_root)
    with serve_app(store=str(store_root), model="split@production", watch_interval_s=0.2) as running:
        url = running.url
        store.canary("split", "production", "v2", 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: _canary(url).get("loaded"))
        entry = store.alias_entry("split", "production")
        assert entry is not None
        key_of = {route(entry, key): key for key in (f"caller-{i}" for i in range(64))}
        with httpx.Client(base_url=url, timeout=60) as client:
            # A version the request names answers it, whichever version the caller's key routes to:
            # the canary's as well as the primary's.
            for routed, key in sorted(key_of.items()):
                headers = {"X-Canary-Key": key}
                for named in ("v1", "v2"):
                    for path, body in (
                        ("/embed", {"texts": ["a red circle"], "model": f"split@{named}"}),
                        ("/v1/embeddings", {"input": ["a red circle"], "model": f"split@{named}"}),
                    ):
                        r = client.post(path, json=body, headers=headers)
                        assert r.status_code == 200, r.text
                        assert r.json()["model"] == r.headers["x-model"] == f"split@{named}", (path, routed)
                # /v1/models and /models say which version answers this caller.
                r = client.get("/v1/models", headers=headers)
                assert "X-Canary-Key" in r.headers["vary"]
                listed = {m["id"]: m for m in r.json()["data"]}
                assert listed["split"]["answers"] == f"split@{routed}"
                assert listed["split"]["canary"] == "split@v2" and listed["split"]["serving"] == "split@v1"
                assert listed["split@v1"]["answers"] == "split@v1"
                assert listed["split@v2"]["answers"] == "split@v2" and listed["split@v2"]["created"] > 0
                served = client.get("/models", headers=headers).json()["served"]
                assert [(s["ref"], s["serving"], s["canary"], s["answers"]) for s in served] == [
                    ("split@production", "split@v1", "split@v2", f"split@{routed}")
                ]
                # What it says is what answers a request naming the model.
                r = client.post("/embed", json={"texts": ["a blue square"], "model": "split"}, headers=headers)
                assert r.json()["model"] == f"split@{routed}"
            # Without a key the callers are split at random: no version is named.
            listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
            assert listed["split"]["answers"] is None and listed["split@v2"]["answers"] == "split@v2"
            # The API key routes when there is no X-Canary-Key, here as for the requests.
            from service.runtime.canary import caller_key

            token = next(
                t for t in (f"token-{i}" for i in range(64)) if route(entry, caller_key(None, f"Bearer {t}")) == "v2"
            )
            listed = {
                m["id"]: m
                for m in client.get("/v1/models", headers={"Authorization": f"Bearer {token}"}).json()["data"]
            }
            assert listed["split"]["answers"] == "split@v2"

            # Once the canary ends, its version is no longer served: naming it is a 404 listing the set.
            store.rollback("split", "production")
            wait_until(lambda: running.services.manager.view().canary is None)
            r = client.post("/embed", json={"texts": ["a red circle"], "model": "split@v2"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"
            assert "split@production (split@v1)" in r.json()["error"]["message"]
            listed = {
                m["id"]: m for m in client.get("/v1/models", headers={"X-Canary-Key": key_of["v2"]}).json()["data"]
            }
            assert set(listed) == {"split", "split@v1"} and listed["split"]["answers"] == "split@v1"
