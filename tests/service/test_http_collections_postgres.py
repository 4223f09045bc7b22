"""/collections on PostgreSQL through a real uvicorn server while its database cannot be reached
and then can: 503 ``not_ready`` with Retry-After (never a 500), the replica still ready and
scoring, and the collections answering by themselves once the database is there (no restart)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import psycopg
import pytest
from pgvector_server import pgvector_server_fixture  # noqa: F401


@pytest.mark.slow
def test_collections_answer_503_until_the_database_is_there_then_work_without_a_restart(
    pgvector_server: str, tiny_store: Path, serve_app: Any, make_image: Any, tmp_path: Path
) -> None:
    # A database that does not exist yet: every connection is refused until it is created.
    name = f"later_{uuid.uuid4().hex[:12]}"
    url = urlunparse(urlparse(pgvector_server)._replace(path=f"/{name}")) + "&pool_wait_s=0.5"
    with (
        serve_app(
            store=str(tiny_store), model="tiny@production", collections={"url": url, "image_folder": str(tmp_path)}
        ) as running,
        httpx.Client(base_url=running.url, timeout=60) as c,
    ):
        for r in (c.get("/collections"), c.put("/collections/a", json={})):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "not_ready" and "Retry-After" in r.headers
            assert name in r.json()["error"]["message"]
        assert c.get("/readyz").status_code == 200  # the models serve: collections are no part of readiness
        assert c.post("/embed", json={"texts": ["a red circle"]}).status_code == 200
        with psycopg.connect(pgvector_server, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        deadline = time.monotonic() + 60  # the pool retries with a backoff of a few seconds
        while (r := c.put("/collections/a", json={})).status_code == 503:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        assert r.status_code == 201, r.text
        add = {"items": [{"id": "x", "image": make_image("circle", "red"), "metadata": {"k": 1}}]}
        assert c.post("/collections/a/images", json=add).json()["count"] == 1
        hits = c.post("/collections/a/search", json={"text": "a red circle", "filters": {"k": 1}}).json()["hits"]
        assert [h["id"] for h in hits] == ["x"]
