"""Shadow runs with real servers, real forward passes and real alias moves through ModelStore.

The store holds the tiny DCSM model three times: v1 (production), v2 (the same weights, a copy)
and v3 (another seed). Every request is re-run on the shadow after its answer was sent: a copy
agrees on every decision with cosine and correlation 1, another seed does not; the answers sent
are the same with or without a shadow; under a burst, shadow work is dropped, never the answers.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_until
from prometheus_samples import metric_value

from model_store import ModelStore

pytestmark = pytest.mark.slow

DECIDING = ("/classify", "/rank-pair", "/rank", "/score/dense")


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any) -> Path:
    root = tmp_path_factory.mktemp("shadow-store")
    publish_dense_model(root, "split")  # v1, production
    publish_dense_model(root, "split", aliases=())  # v2: a copy
    publish_dense_model(root, "split", seed=1, aliases=())  # v3: another seed
    return root


@pytest.fixture
def store_root(published: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(published, root)
    return root


def _shadow(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/models/split").json().get("shadow") or {}


def _settled(url: str) -> int:
    """Sampled requests the shadow has finished with (compared, dropped or failed)."""
    endpoints = _shadow(url).get("endpoints", {}).values()
    return sum(e["compared"] + e["dropped"] + e["failed"] for e in endpoints)


def _calls(make_image: Any) -> list[tuple[str, dict[str, Any]]]:
    shapes = [(s, c) for s in ("circle", "square", "triangle", "cross") for c in ("red", "blue")]
    images = [make_image(s, c) for s, c in shapes]
    labels = [f"{c} {s}" for s, c in shapes[:6]]
    return [
        ("/classify", {"images": images, "labels": labels}),
        ("/rank-pair", {"pairs": [{"image_a": a, "image_b": b, "difference": "the first is larger"}
                                  for a, b in zip(images[0::2], images[1::2], strict=True)]}),
        ("/rank", {"images": images[:4], "difference": "more red"}),
        ("/score/dense", {"image": images[0], "texts": ["a red circle", "a blue square", "a green cross",
                                                        "a red circle to the left of a blue square"]}),
        ("/embed", {"texts": ["a red circle", "a blue square", "two green crosses"]}),
        ("/embed", {"images": images[:3], "encoding_format": "base64"}),
        ("/v1/embeddings", {"input": ["a red circle", "a blue square"], "model": "split", "encoding_format": "base64"}),
    ]  # fmt: skip


def _answers(url: str, calls: list[tuple[str, dict[str, Any]]], *, one_by_one: bool) -> list[dict[str, Any]]:
    """Each call's answer; ``one_by_one``: wait for the shadow to finish each before the next (so
    none is dropped as busy)."""
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, body in calls:
            before = _settled(url) if one_by_one else 0
            r = client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            out.append(r.json())
            if one_by_one:
                wait_until(lambda before=before: _settled(url) > before)  # type: ignore[misc]
    return out


def test_a_shadow_copy_agrees_another_seed_does_not_and_answers_never_change(
    store_root: Path, serve_app: Any, make_image: Any
) -> None:
    store = ModelStore(store_root)
    calls = _calls(make_image)
    endpoints = {path for path, _ in calls}
    with serve_app(store=str(store_root), model="split@production", watch_interval_s=0.2) as running:
        url = running.url
        sent = _answers(url, calls, one_by_one=False)  # no shadow yet
        assert {answer["model"] for answer in sent} == {"split@v1"}

        store.shadow("split", "production", "v2", fraction=1.0)
        wait_until(lambda: _shadow(url).get("loaded"))
        assert _answers(url, calls, one_by_one=True) == sent  # the shadow never changes an answer
        copy = _shadow(url)
        assert copy["version"] == "v2" and copy["fraction"] == 1.0 and set(copy["endpoints"]) == endpoints
        for path, stats in copy["endpoints"].items():
            runs = sum(p == path for p, _ in calls)
            assert (stats["compared"], stats["dropped"], stats["failed"]) == (runs, 0, 0), path
            if path in DECIDING:
                assert stats["agreement"] == 1.0, path
            else:
                assert stats["mean_cosine"] == pytest.approx(1.0, abs=1e-6), path
        assert copy["endpoints"]["/score/dense"]["mean_correlation"] == pytest.approx(1.0, abs=1e-6)
        assert metric_value(url, "clip_shadow_requests_total", version="v2", outcome="compared") == len(calls)
        assert metric_value(url, "clip_shadow_agreement_total", version="v2", result="disagree") == 0
        assert metric_value(url, "clip_shadow_sample_ratio", version="v2") == 1.0

        store.shadow("split", "production", "v3", fraction=1.0)
        wait_until(lambda: _shadow(url).get("version") == "v3" and _shadow(url).get("loaded"))
        assert _answers(url, calls, one_by_one=True) == sent
        other = _shadow(url)["endpoints"]
        assert {path: stats["compared"] for path, stats in other.items()} == {
            path: sum(p == path for p, _ in calls) for path in endpoints
        }
        assert other["/classify"]["agreement"] < 1.0
        assert other["/embed"]["mean_cosine"] < 0.99 and other["/v1/embeddings"]["mean_cosine"] < 0.99
        assert other["/score/dense"]["mean_correlation"] < 0.99
        assert metric_value(url, "clip_shadow_agreement_total", version="v3", result="disagree") > 0
        # v2 is no longer loaded: its series went with it.
        exported = httpx.get(f"{url}/metrics").text
        wait_until(lambda: 'version="v2"' not in httpx.get(f"{url}/metrics").text)
        labels = 'endpoint="/classify",model="split@production",outcome="compared",version="v3"'
        series = f"clip_shadow_requests_total{{{labels}}}"
        assert series in exported

        store.shadow("split", "production", None)
        wait_until(lambda: not httpx.get(f"{url}/models/split").json()["shadow"])
        before = metric_value(url, "clip_shadow_requests_total")
        _answers(url, calls[:2], one_by_one=False)
        time.sleep(0.3)
        assert metric_value(url, "clip_shadow_requests_total") == before  # no shadow: nothing sampled

        store.shadow("split", "production", "v3", fraction=1.0)  # again: its summary starts afresh
        wait_until(lambda: _shadow(url).get("loaded"))
        assert _shadow(url)["endpoints"] == {}
        _answers(url, calls[:1], one_by_one=True)
        assert _shadow(url)["endpoints"]["/classify"]["compared"] == 1


def test_shadow_work_is_dropped_first_under_a_burst(store_root: Path, serve_app: Any) -> None:
    store = ModelStore(store_root)
    burst = 24
    # A batching window long enough that the burst is answered together: its offers then find
    # the shadow's small queue full.
    batching = {"max_wait_ms": 300}
    with serve_app(store=str(store_root), model="split@production", watch_interval_s=0.2, batching=batching) as running:
        url = running.url
        store.shadow("split", "production", "v3", fraction=1.0)
        wait_until(lambda: _shadow(url).get("loaded"))

        async def send() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                calls = [client.post("/embed", json={"texts": [f"burst text {i}"]}) for i in range(burst)]
                return await asyncio.gather(*calls)

        responses = asyncio.run(send())
        assert [r.status_code for r in responses] == [200] * burst
        assert {r.json()["model"] for r in responses} == {"split@v1"}
        wait_until(lambda: _settled(url) == burst)
        stats = _shadow(url)["endpoints"]["/embed"]
        assert stats["dropped"] > 0 and stats["failed"] == 0
        assert stats["compared"] + stats["dropped"] == burst
        dropped = sum(
            metric_value(url, "clip_shadow_requests_total", outcome=reason) for reason in ("queue_full", "busy", "gone")
        )
        assert dropped == stats["dropped"]
