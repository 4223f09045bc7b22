"""Work that cannot finish within the request budget is refused with its estimate (413), not run
for the whole budget to end in a 504 while other clients wait behind it."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import httpx

from service.runtime.batcher import DynamicBatcher


def huge_classify(make_image: Any) -> dict[str, Any]:
    """1,000 labels x 64 templates of 1,000 characters: within every count and size limit."""
    templates = [f"{'a very long description ' * 40}{{}} number {i}" for i in range(64)]
    return {"images": [make_image()], "labels": [f"label {i}" for i in range(1000)], "templates": templates}


def test_unfinishable_work_is_refused_with_its_estimate_and_others_are_served(
    tiny_store: Path, serve_app: Any, make_image: Any
) -> None:
    batching = {"request_timeout_s": 2.0, "max_batch_texts": 64}
    with serve_app(store=str(tiny_store), model="tiny@production", batching=batching) as running:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            small = {"images": [make_image()], "labels": ["circle", "square"]}
            assert client.post("/classify", json=small).status_code == 200  # warm: batches measured
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                big = pool.submit(client.post, "/classify", json=huge_classify(make_image))
                others = [client.post("/classify", json=small) for _ in range(5)]
                r = big.result()
            assert all(o.status_code == 200 for o in others), [o.text for o in others]
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["code"] == "payload_too_large"
            assert "more encodes" in error["message"] and "batching.request_timeout_s" in error["message"], error
            metrics = client.get("/metrics").text
            assert 'reason="over_budget"' in metrics


def test_a_large_request_that_fits_its_budget_is_served(tiny_store: Path, serve_app: Any, make_image: Any) -> None:
    """The estimate refuses only what cannot fit: 1,000 labels with the default template run."""
    with serve_app(store=str(tiny_store), model="tiny@production", batching={"max_batch_texts": 64}) as running:
        body = {"images": [make_image()], "labels": [f"label {i}" for i in range(1000)]}
        r = httpx.post(f"{running.url}/classify", json=body, timeout=60)
        assert r.status_code == 200, r.text


def test_the_batcher_measures_full_batches_only() -> None:
    import asyncio

    async def run() -> tuple[float | None, float | None]:
        batcher: DynamicBatcher[int, int] = DynamicBatcher("t", lambda xs: xs, max_batch=4, max_wait_ms=0)
        await batcher.start()
        await batcher.submit([1, 2])
        partial = batcher.full_batch_s
        await batcher.submit([1, 2, 3, 4])
        full = batcher.full_batch_s
        await batcher.stop()
        return partial, full

    partial, full = asyncio.run(run())
    assert partial is None and full is not None and full >= 0
