"""A collection whose model is hot-swapped to a new version, through a real uvicorn server: it is
re-embedded from the image bytes it kept (on request, or automatically), searched all along, and
never answers from a mix of the two versions' embeddings."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pgvector_server import pgvector_server_fixture, pgvector_url_fixture  # noqa: F401

from service.api.vector_encoding import decode_rows

pytestmark = pytest.mark.slow  # a model swap each

SCENES = [("red-circle", "circle", "red"), ("blue-square", "square", "blue"), ("green-triangle", "triangle", "green")]


def embed(c: httpx.Client, images: list[dict[str, str]]) -> tuple[str, np.ndarray]:
    r = c.post("/embed", json={"images": images})
    assert r.status_code == 200, r.text
    vectors = decode_rows(r.json()["embeddings"], r.json()["encoding_format"])
    return r.json()["model"], vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@contextmanager
def swapped_server(
    tmp_path: Path, serve_app: Any, publish_model: Any, reembed: str, url: str | None = None
) -> Iterator[Any]:
    """``url``: the collections' backend, the embedded folder when left out."""
    store = tmp_path / "store"
    publish_model(store, "tiny", seed=0)
    folder = tmp_path / "collections"
    settings = {
        "url": url or f"file://{folder}",
        "image_folder": str(folder),
        "reembed": reembed,
        "max_items_per_add": 2,
    }
    with (
        serve_app(store=str(store), model="tiny@production", watch_interval_s=0.2, collections=settings) as running,
        httpx.Client(base_url=running.url, timeout=60) as c,
    ):

        def swap() -> str:
            version = publish_model(store, "tiny", seed=1)
            deadline = time.monotonic() + 60
            while c.get("/models").json()["served"][0]["serving"] != f"tiny@{version}":
                assert time.monotonic() < deadline, "the new version was not swapped in"
                time.sleep(0.2)
            return f"tiny@{version}"

        yield c, swap


def fill(c: httpx.Client, images: dict[str, dict[str, str]]) -> str:
    assert c.put("/collections/c", json={}).status_code == 201
    items = [{"id": i, "image": images[i], "metadata": {"n": n}} for n, i in enumerate(images)]
    for start in range(0, len(items), 2):  # max_items_per_add: 2, the re-embedding's batches too
        r = c.post("/collections/c/images", json={"items": items[start : start + 2]})
        assert r.status_code == 200, r.text
    model: str = r.json()["model"]
    return model


def check_search(c: httpx.Client, images: dict[str, dict[str, str]], query: str) -> tuple[int, str | None]:
    """A search by one of the images: 503 while re-embedding, else every hit's cosine is the one
    the answering version's /embed gives (a stored embedding of the other version would not be)."""
    r = c.post("/collections/c/search", json={"image": images[query], "limit": len(images)})
    if r.status_code != 200:
        return r.status_code, r.json()["error"]["code"]
    body = r.json()
    model, g = embed(c, [images[h["id"]] for h in body["hits"]] + [images[query]])
    if model != body["model"]:  # /embed answered after a swap: nothing to compare with
        return 200, None
    np.testing.assert_allclose([h["scores"]["cosine"] for h in body["hits"]], g[:-1] @ g[-1], atol=3e-3)
    assert body["hits"][0]["scores"]["cosine"] == pytest.approx(1, abs=3e-3)  # the query image itself
    return 200, body["model"]


def test_a_hot_swapped_collection_is_reembedded_on_request_and_never_served_mixed(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    images = {i: make_image(shape, colour) for i, shape, colour in SCENES}
    images["red-circle-again"] = images["red-circle"]  # the same bytes under a second id: kept once
    with swapped_server(tmp_path, serve_app, publish_model, "manual") as (c, swap):
        v1 = fill(c, images)
        kept = list((tmp_path / "collections" / "c.images").glob("*/*"))
        assert len(kept) == len(SCENES)
        assert check_search(c, images, "blue-square") == (200, v1)
        v2 = swap()
        r = c.post("/collections/c/search", json={"text": "a red circle"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "version_mismatch"
        assert "/reembed" in r.json()["error"]["message"]
        stop, seen = threading.Event(), []

        def search_all_along() -> None:
            while not stop.is_set():
                for query in images:
                    seen.append(check_search(c, images, query))

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            searching = [pool.submit(search_all_along) for _ in range(2)]
            started = c.post("/collections/c/reembed")
            assert started.status_code == 202, started.text
            assert started.json()["job"]["kind"] == "reembed" and started.json()["job"]["model"] == v2
            deadline = time.monotonic() + 60
            while (info := c.get("/collections/c").json())["job"]["state"] == "running":
                assert time.monotonic() < deadline, info
                time.sleep(0.05)
            time.sleep(0.5)  # searches after the switch too
            stop.set()
            for f in searching:
                f.result()  # a mixed answer failed its assertion there
        assert info["job"] | {"started_at": None, "finished_at": None} == {
            "kind": "reembed", "model": v2, "state": "done", "done": 4, "total": 4, "error": None,
            "runs_here": True, "started_at": None, "finished_at": None,
        }  # fmt: skip
        assert (info["model"], info["count"]) == (v2, 4)
        assert set(seen) <= {(200, v1), (503, "not_ready"), (409, "version_mismatch"), (200, v2), (200, None)}
        assert (200, v2) in seen
        assert check_search(c, images, "green-triangle") == (200, v2)
        from clipdiff import Client

        with Client(str(c.base_url)) as sdk:
            assert sdk.collection("c").job.state == "done"  # type: ignore[union-attr]
            again = sdk.reembed_collection("c").job  # already on v2: a job with nothing to embed
            assert again is not None and (again.kind, again.model) == ("reembed", v2)
            deadline = time.monotonic() + 30
            while (job := sdk.collection("c").job) is not None and job.state == "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert job is not None and (job.state, job.total) == ("done", 4)
        metrics = c.get("/metrics").text
        assert 'clip_collection_job_images_total{kind="reembed"} 4.0' in metrics
        assert 'clip_collection_jobs_total{kind="reembed",result="done"} 2.0' in metrics


@pytest.mark.parametrize("backend", ["embedded", "postgres"])
def test_with_reembed_auto_the_first_request_after_a_swap_starts_it(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    images = {i: make_image(shape, colour) for i, shape, colour in SCENES}
    url = request.getfixturevalue("pgvector_url") if backend == "postgres" else None
    with swapped_server(tmp_path, serve_app, publish_model, "auto", url) as (c, swap):
        fill(c, images)
        assert c.delete("/collections/c/images/green-triangle").status_code == 200
        v2 = swap()
        r = c.post("/collections/c/search", json={"text": "a red circle"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready", r.text
        assert "re-embedded" in r.json()["error"]["message"] and r.headers["retry-after"]
        deadline = time.monotonic() + 60
        while (info := c.get("/collections/c").json())["job"]["state"] == "running":
            assert time.monotonic() < deadline, info
            time.sleep(0.05)
        assert (info["job"]["state"], info["job"]["done"], info["model"], info["count"]) == ("done", 2, v2, 2)
        assert check_search(c, {i: images[i] for i in ("red-circle", "blue-square")}, "red-circle") == (200, v2)
        # The removed item's image file went with the re-embedding.
        assert len(list((tmp_path / "collections" / "c.images").glob("*/*"))) == 2
        assert c.delete("/collections/c").status_code == 200
        assert not (tmp_path / "collections" / "c.images").exists()
