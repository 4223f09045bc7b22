"""A re-embedding survives its server: a real ``python -m service`` killed with SIGKILL mid-job and
started again takes the job up by itself from the record kept with the collection, goes on from
its staged copy (the images embedded before the kill are not embedded again), shows its progress
in ``GET /collections/{name}``, and the collection answers 503 + Retry-After until it has
switched, never from the old version nor a mix; on the embedded store and on PostgreSQL. Two
replicas on one PostgreSQL run a job once: one holds its lease, the other takes it up if it dies."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from pgvector_server import pgvector_server_fixture, pgvector_url_fixture  # noqa: F401
from polling import wait_ready, wait_until

from loadtests.local_stack import free_port, metric_value, stop_process
from service.collections.leases import LEASE_POLL_S
from service.collections.postgres import LEASE_SPACE

pytestmark = pytest.mark.slow  # three server processes a backend

REPO = Path(__file__).resolve().parents[2]
IMAGES = 45  # enough batches of one image that a kill lands mid-job
KILL_AFTER = 6  # images re-embedded before the kill


@contextmanager
def server(
    store: Path, collections_url: str, images: Path, batch: int, import_root: Path | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m service`` on ``tiny@production`` with its collections at ``collections_url``
    (importing from ``import_root``); stopped (SIGTERM) at the end unless the test killed it."""
    with servers(1, store, collections_url, images, batch, import_root) as (started,):
        yield started


@contextmanager
def servers(
    count: int, store: Path, collections_url: str, images: Path, batch: int, import_root: Path | None = None
) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    """``count`` such servers, all started before any is waited for (replicas starting together)."""
    env = {**os.environ, "CLIP_COLLECTIONS__URL": collections_url, "CLIP_COLLECTIONS__IMAGE_FOLDER": str(images),
           "CLIP_COLLECTIONS__MAX_ITEMS_PER_ADD": str(batch), "CLIP_LOG_LEVEL": "warning",
           "CLIP_TORCH_THREADS": "1",
           "CLIP_COLLECTIONS__IMPORT_ROOTS": json.dumps([str(import_root)] if import_root else [])}  # fmt: skip
    env.pop("CLIP_REDIS_URL", None)
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for _ in range(count):
            port = free_port()
            cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--store",
                   str(store), "--model", "tiny@production"]  # fmt: skip
            started.append((subprocess.Popen(cmd, cwd=REPO, env=env), f"http://127.0.0.1:{port}"))
        for _, url in started:
            wait_ready(url, timeout=120)
        yield started
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                stop_process(proc)


def pictures(make_image: Any) -> dict[str, dict[str, str]]:
    out = {}
    for shape in ("circle", "square", "triangle"):
        for colour in ("red", "blue", "green"):
            for step in range(IMAGES // 9):
                out[f"{shape}-{colour}-{step}"] = make_image(shape, colour, x=0.3 + 0.04 * step)
    assert len(out) == IMAGES
    return out


def collection_on_v1_and_v2_published(
    store: Path, url: str, tmp_path: Path, publish_model: Any, make_image: Any
) -> tuple[dict[str, dict[str, str]], str]:
    """Collection ``c`` holding ``pictures`` embedded by ``tiny`` v1, then v2 published (the next
    server serves it): the images and v2's reference."""
    publish_model(store, "tiny", seed=0)
    images = pictures(make_image)
    with server(store, url, tmp_path / "images", batch=64) as (_, base), httpx.Client(base_url=base, timeout=60) as c:
        assert c.put("/collections/c", json={}).status_code == 201
        items = [{"id": i, "image": image} for i, image in images.items()]
        assert c.post("/collections/c/images", json={"items": items}).status_code == 200
    return images, f"tiny@{publish_model(store, 'tiny', seed=1)}"


def collections_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("pgvector_url") if backend == "postgres" else f"file://{tmp_path / 'collections'}"


@pytest.mark.parametrize("backend", ["embedded", "postgres"])
def test_a_reembedding_killed_mid_job_is_taken_up_after_the_restart_and_never_served_mixed(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, publish_model: Any, make_image: Any
) -> None:
    store = tmp_path / "store"
    publish_model(store, "tiny", seed=0)
    url = request.getfixturevalue("pgvector_url") if backend == "postgres" else f"file://{tmp_path / 'collections'}"
    images = pictures(make_image)
    with server(store, url, tmp_path / "images", batch=64) as (_, base), httpx.Client(base_url=base, timeout=60) as c:
        assert c.put("/collections/c", json={}).status_code == 201
        items = [{"id": i, "image": image, "metadata": {"i": n}} for n, (i, image) in enumerate(images.items())]
        for start in range(0, IMAGES, 64):
            assert c.post("/collections/c/images", json={"items": items[start : start + 64]}).status_code == 200
        v1 = c.get("/collections/c").json()["model"]
    v2 = f"tiny@{publish_model(store, 'tiny', seed=1)}"  # the next server serves it: the collection is on v1

    # Batches of one image, so the job is many small steps.
    with server(store, url, tmp_path / "images", batch=1) as (proc, base), httpx.Client(base_url=base, timeout=60) as c:
        started = c.post("/collections/c/reembed")
        assert started.status_code == 202, started.text
        wait_until(lambda: c.get("/collections/c").json()["job"]["done"] >= KILL_AFTER, what="the job's progress")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    with server(store, url, tmp_path / "images", batch=1) as (_, base), httpx.Client(base_url=base, timeout=60) as c:
        # Every batch records its progress: the job goes on from at least what was shown before the kill.
        job = c.get("/collections/c").json()["job"]
        assert job is not None and (job["kind"], job["model"]) == ("reembed", v2), job
        assert job["state"] in ("running", "done") and job["done"] >= KILL_AFTER and job["total"] == IMAGES, job
        answers = set()
        while (info := c.get("/collections/c").json())["job"]["state"] == "running":
            r = c.post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3})
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "not_ready" and r.headers["retry-after"], r.text
            answers.add((r.status_code, r.json().get("model")))
        assert info["job"]["state"] == "done" and info["job"]["error"] is None, info
        assert (info["model"], info["count"], info["job"]["done"]) == (v2, IMAGES, IMAGES)
        # 503 until the switch, v2's answers after it (a search may land just after): never v1's
        # answer, nor a version_mismatch.
        assert answers <= {(503, None), (200, v2)}, answers
        assert (503, None) in answers or job["state"] == "done", answers
        hits = c.post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3}).json()
        assert hits["model"] == v2 and hits["hits"][0]["id"] == "circle-red-0", hits
        assert hits["hits"][0]["scores"]["cosine"] == pytest.approx(1, abs=3e-3)  # stored by v2: the query's own
        # Taken up from the staged copy: this server embedded only what the killed one had not.
        embedded_here = metric_value(base, "clip_collection_job_images_total", kind="reembed")
        assert 0 < embedded_here <= IMAGES - KILL_AFTER
        assert v1 != v2


def test_a_reembedding_stopped_with_its_server_is_taken_up_by_the_next(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    """A graceful stop (a rollout) mid-job: the job stops at its next batch, keeps its record,
    and the next server goes on with it."""
    store = tmp_path / "store"
    publish_model(store, "tiny", seed=0)
    folder = tmp_path / "collections"
    images = {f"{n}": make_image(shape, colour, x=0.3 + 0.01 * n) for n, (shape, colour) in enumerate(
        [(s, c) for s in ("circle", "square", "triangle") for c in ("red", "blue", "green")] * 12)}  # fmt: skip

    def settings(batch: int) -> dict[str, Any]:
        return {"store": str(store), "model": "tiny@production",
                "collections": {"url": f"file://{folder}", "max_items_per_add": batch}}  # fmt: skip

    with serve_app(**settings(64)) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        assert c.put("/collections/c", json={}).status_code == 201
        items = [{"id": i, "image": image} for i, image in images.items()]
        for start in range(0, len(items), 64):
            assert c.post("/collections/c/images", json={"items": items[start : start + 64]}).status_code == 200
    v2 = f"tiny@{publish_model(store, 'tiny', seed=1)}"
    with serve_app(**settings(1)) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        assert c.post("/collections/c/reembed").status_code == 202
        wait_until(lambda: c.get("/collections/c").json()["job"]["done"] >= KILL_AFTER, what="the job's progress")
    # Left mid-job: the server stopped (its shutdown stops the job at its next batch).
    with serve_app(**settings(1)) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        job = c.get("/collections/c").json()["job"]
        assert job is not None and (job["kind"], job["model"]) == ("reembed", v2), job
        assert job["done"] >= KILL_AFTER and job["total"] == len(images), job
        wait_until(lambda: c.get("/collections/c").json()["job"]["state"] != "running", what="the job's end")
        info = c.get("/collections/c").json()
        assert (info["job"]["state"], info["model"], info["count"]) == ("done", v2, len(images)), info


def test_two_replicas_on_one_database_run_a_reembedding_once_and_the_survivor_of_a_kill_finishes_it(
    request: pytest.FixtureRequest, tmp_path: Path, publish_model: Any, make_image: Any
) -> None:
    """Two servers on one PostgreSQL, one asked to re-embed: it holds the job's lease and embeds,
    the other follows the job (503 for the collection, the holder's progress in its status); the
    holder SIGKILLed, PostgreSQL frees its lease and the other finishes the job from the staged copy."""
    store, url = tmp_path / "store", request.getfixturevalue("pgvector_url")
    images, v2 = collection_on_v1_and_v2_published(store, url, tmp_path, publish_model, make_image)

    with ExitStack() as stack:
        replicas = [stack.enter_context(server(store, url, tmp_path / "images", batch=1)) for _ in range(2)]
        clients = [stack.enter_context(httpx.Client(base_url=base, timeout=60)) for _, base in replicas]
        started = clients[0].post("/collections/c/reembed")
        assert started.status_code == 202 and started.json()["job"]["model"] == v2, started.text
        wait_until(lambda: clients[0].get("/collections/c").json()["job"]["done"] >= 1, what="the job's first batch")
        # The other replica, never asked to re-embed, answers 503 (not 409) and follows the job;
        # asked to re-embed too, it answers with that job.
        joined = clients[1].post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3})
        assert joined.status_code == 503 and "another server" in joined.json()["error"]["message"], joined.text
        again = clients[1].post("/collections/c/reembed")
        assert again.status_code == 202 and again.json()["job"]["model"] == v2, again.text

        def jobs() -> list[dict[str, Any]]:
            return [c.get("/collections/c").json()["job"] for c in clients]

        def holder_past_kill_point() -> bool:
            held = [job for job in jobs() if job["runs_here"]]
            return len(held) == 1 and held[0]["done"] >= KILL_AFTER

        wait_until(holder_past_kill_point, what="one replica's job past the kill point")
        owner = next(n for n, job in enumerate(jobs()) if job["runs_here"])
        other, (owner_proc, owner_url) = 1 - owner, replicas[owner]
        # Exactly one embedded: the waiting replica embedded nothing, and answers 503 meanwhile.
        assert metric_value(replicas[other][1], "clip_collection_job_images_total", kind="reembed") == 0
        r = clients[other].post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3})
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        waiting = clients[other].get("/collections/c").json()["job"]
        assert (waiting["state"], waiting["runs_here"], waiting["total"]) == ("running", False, IMAGES), waiting
        embedded_by_owner = metric_value(owner_url, "clip_collection_job_images_total", kind="reembed")
        owner_proc.send_signal(signal.SIGKILL)
        owner_proc.wait(timeout=30)

        c = clients[other]
        answers = set()
        while (info := c.get("/collections/c").json())["job"]["state"] == "running":
            r = c.post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3})
            answers.add((r.status_code, r.json().get("model")))
        assert (info["job"]["state"], info["job"]["runs_here"], info["model"], info["count"]) == (
            "done", True, v2, IMAGES), info  # fmt: skip
        assert answers <= {(503, None), (200, v2)}, answers
        # Taken up from the staged copy: at most what the killed replica had not embedded.
        embedded_here = metric_value(replicas[other][1], "clip_collection_job_images_total", kind="reembed")
        assert 0 < embedded_here <= IMAGES - embedded_by_owner, (embedded_here, embedded_by_owner)
        hits = c.post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3}).json()
        assert hits["model"] == v2 and hits["hits"][0]["id"] == "circle-red-0", hits


@pytest.mark.parametrize("backend", ["embedded", "postgres"])
def test_an_import_killed_mid_job_is_taken_up_after_the_restart_and_adds_no_image_twice(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, publish_model: Any, make_image: Any
) -> None:
    """A folder import SIGKILLed mid-job: the restarted server takes the job up from its record,
    embeds only the images the killed one had not added, and ends with every image once."""
    store = tmp_path / "store"
    publish_model(store, "tiny", seed=0)
    url = collections_url(backend, request, tmp_path)
    images = pictures(make_image)
    dataset = tmp_path / "datasets" / "catalogue"
    dataset.mkdir(parents=True)
    for item_id, image in images.items():
        (dataset / f"{item_id}.png").write_bytes(base64.b64decode(image["data"]))
    kept, root = tmp_path / "images", tmp_path / "datasets"

    with server(store, url, kept, batch=1, import_root=root) as (proc, base), httpx.Client(base_url=base) as c:
        assert c.put("/collections/c", json={}).status_code == 201
        started = c.post("/collections/c/imports", json={"path": str(dataset)})
        assert started.status_code == 202, started.text
        wait_until(lambda: c.get("/collections/c").json()["job"]["done"] >= KILL_AFTER, what="the import's progress")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    with server(store, url, kept, batch=1, import_root=root) as (_, base), httpx.Client(base_url=base) as c:
        job = c.get("/collections/c").json()["job"]
        assert job is not None and job["kind"] == "import" and job["total"] == IMAGES, job
        assert job["done"] >= KILL_AFTER - 1, job  # the record is written after each batch
        wait_until(lambda: c.get("/collections/c").json()["job"]["state"] != "running", what="the import's end")
        info = c.get("/collections/c").json()
        assert (info["job"]["state"], info["job"]["done"], info["count"]) == ("done", IMAGES, IMAGES), info
        embedded_here = metric_value(base, "clip_collection_job_images_total", kind="import")
        assert 0 < embedded_here <= IMAGES - KILL_AFTER, embedded_here
        for item_id in ("circle-red-0", "triangle-green-4"):
            body = {"image": images[item_id], "limit": 1}
            (hit,) = c.post("/collections/c/search", json=body).json()["hits"]
            assert hit["id"] == f"{item_id}.png" and hit["scores"]["cosine"] == pytest.approx(1, abs=3e-3)
    # Nothing recorded any more: the next start takes up no job.
    with server(store, url, kept, batch=1, import_root=root) as (_, base), httpx.Client(base_url=base) as c:
        assert c.get("/collections/c").json()["job"] is None
        assert c.get("/collections/c").json()["count"] == IMAGES


def test_replicas_started_together_while_a_reembedding_is_recorded_run_it_once(
    request: pytest.FixtureRequest, tmp_path: Path, publish_model: Any, make_image: Any
) -> None:
    """A re-embedding left by a killed server, two replicas started together on its database
    while the job's lease is held (as by a server not yet known dead): both take the recorded job
    up and wait, embedding nothing, answering 503; once the lease is free one runs it, and
    together they embed only what the killed server left."""
    store, url = tmp_path / "store", request.getfixturevalue("pgvector_url")
    images, v2 = collection_on_v1_and_v2_published(store, url, tmp_path, publish_model, make_image)
    with server(store, url, tmp_path / "images", batch=1) as (proc, base), httpx.Client(base_url=base, timeout=60) as c:
        assert c.post("/collections/c/reembed").status_code == 202
        wait_until(lambda: c.get("/collections/c").json()["job"]["done"] >= KILL_AFTER, what="the job's progress")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    holder = psycopg.connect(url, autocommit=True)  # the lease as a server would hold it
    (key,) = holder.execute("SELECT key FROM clip_collections WHERE name = 'c'").fetchone()  # type: ignore[misc]
    assert holder.execute("SELECT pg_try_advisory_lock(%s, %s)", (LEASE_SPACE, key)).fetchone() == (True,)
    with servers(2, store, url, tmp_path / "images", batch=1) as replicas:
        clients = [httpx.Client(base_url=base, timeout=60) for _, base in replicas]
        try:
            for c in clients:  # both took the recorded job up, and wait for its lease
                job = c.get("/collections/c").json()["job"]
                assert (job["kind"], job["model"], job["state"], job["runs_here"]) == ("reembed", v2, "running", False)
                r = c.post("/collections/c/search", json={"image": images["circle-red-0"], "limit": 3})
                assert r.status_code == 503, r.text
            time.sleep(2 * LEASE_POLL_S)  # both tried the lease again meanwhile
            assert [metric_value(base, "clip_collection_job_images_total", kind="reembed") for _, base in replicas] == [
                0, 0]  # fmt: skip
            holder.close()  # its session ends: the lease is free
            wait_until(
                lambda: all(c.get("/collections/c").json()["job"]["state"] != "running" for c in clients),
                what="the job's end on both replicas",
            )
            infos = [c.get("/collections/c").json() for c in clients]
            assert {(i["model"], i["count"], i["job"]["state"]) for i in infos} == {(v2, IMAGES, "done")}, infos
            embedded = [metric_value(base, "clip_collection_job_images_total", kind="reembed") for _, base in replicas]
            # One ran it: the other embedded nothing, and the two only what the killed one left.
            assert min(embedded) == 0 and 0 < max(embedded) <= IMAGES - KILL_AFTER, embedded
        finally:
            holder.close()
            for c in clients:
                c.close()
