"""Collections under concurrent requests and a failing folder, through a real uvicorn server:
searches and adds racing a DELETE of their collection answer 200 or 404, never 500; a
collections folder that cannot be written answers 503 with the reason."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory, serve_app: Any) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("race-collections")
    with serve_app(store=str(tiny_store), model="tiny@production", collections={"url": f"file://{folder}"}) as running:
        yield running


def test_searches_and_adds_racing_a_delete_answer_200_or_404(server: Any, make_image: Any) -> None:
    item = {"id": "a", "image": make_image("circle", "red")}
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=60) as c, concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(8):
            assert c.put("/collections/race", json={}).status_code == 201
            assert c.post("/collections/race/images", json={"items": [item]}).status_code == 200
            racing = [
                pool.submit(c.post, "/collections/race/search", json={"text": f"a red circle {i}"}) for i in range(6)
            ]
            racing += [pool.submit(c.post, "/collections/race/images", json={"items": [item]}) for _ in range(2)]
            racing.append(pool.submit(c.get, "/collections"))
            racing.append(pool.submit(c.get, "/collections/race"))
            dropped = pool.submit(c.delete, "/collections/race")
            answers += [f.result() for f in racing]
            assert dropped.result().status_code == 200, dropped.result().text
            # The add may have created nothing (it ran after the drop: 404) but never a collection back.
            assert c.get("/collections/race").status_code == 404
    statuses = {r.status_code for r in answers}
    assert statuses <= {200, 404}, [r.text for r in answers if r.status_code not in (200, 404)]
    assert all(r.json()["error"]["code"] == "unknown_collection" for r in answers if r.status_code == 404)


def test_an_unwritable_collections_folder_answers_503(tmp_path: Path, tiny_store: Path, serve_app: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a folder below a file cannot be made, whoever the server runs as
    with (
        serve_app(
            store=str(tiny_store), model="tiny@production", collections={"url": f"file://{blocker}/collections"}
        ) as running,
        httpx.Client(base_url=running.url, timeout=60) as c,
    ):
        r = c.put("/collections/c", json={})
        assert r.status_code == 503, r.text
        body = r.json()["error"]
        assert body["code"] == "not_ready" and "cannot be written" in body["message"]
        assert c.get("/collections").json() == {"collections": []}
        assert c.get("/collections/c").status_code == 404
