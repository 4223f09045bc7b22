"""Adding a server-side dataset to a collection through a real uvicorn server: a folder and a
JSONL manifest under an allowed root, added by a background job with progress; paths outside
the roots (``..``, a symbolic link out, a manifest line pointing out) refused before any work."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clipcore.errors import ClipError, ErrorCode
from loadtests.local_stack import metric_value
from service.collections.imports import allowed


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, make_image: Any) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    (root / "catalogue" / "sub").mkdir(parents=True)
    pictures = {"red-circle": ("circle", "red"), "blue-square": ("square", "blue"), "green": ("triangle", "green")}
    for name, (shape, colour) in pictures.items():
        (root / "catalogue" / f"{name}.png").write_bytes(base64.b64decode(make_image(shape, colour)["data"]))
    (root / "catalogue" / "green.png").rename(root / "catalogue" / "sub" / "green.png")
    (root / "catalogue" / "notes.txt").write_text("not an image")
    lines = [
        {"path": "catalogue/red-circle.png", "id": "sku-1", "metadata": {"colour": "red"}},
        {"path": "catalogue/blue-square.png", "metadata": {"colour": "blue"}},
    ]
    (root / "manifest.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    return root


@pytest.fixture(scope="module")
def client(tiny_store: Path, dataset: Path, tmp_path_factory: pytest.TempPathFactory, serve_app: Any) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("import-collections")
    settings = {"url": f"file://{folder}", "import_roots": [str(dataset)], "max_items_per_add": 2}
    with (
        serve_app(store=str(tiny_store), model="tiny@production", collections=settings) as running,
        httpx.Client(base_url=running.url, timeout=60) as c,
    ):
        yield c


def finished(c: httpx.Client, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (info := c.get(f"/collections/{name}").json())["job"]["state"] == "running":
        assert time.monotonic() < deadline, info
        time.sleep(0.05)
    return info  # type: ignore[no-any-return]


def error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()["error"]
    assert body["code"] == code, body
    return body


def test_a_folder_is_imported_by_a_job_every_image_under_its_relative_path(
    client: httpx.Client, dataset: Path, make_image: Any
) -> None:
    assert client.put("/collections/folder", json={}).status_code == 201
    started = client.post("/collections/folder/imports", json={"path": str(dataset / "catalogue")})
    assert started.status_code == 202, started.text
    assert (started.json()["job"]["kind"], started.json()["job"]["total"]) == ("import", 3)
    info = finished(client, "folder")
    assert (info["job"]["state"], info["job"]["done"], info["count"]) == ("done", 3, 3), info
    r = client.post("/collections/folder/search", json={"image": make_image("triangle", "green"), "limit": 3})
    hits = r.json()["hits"]
    assert sorted(h["id"] for h in hits) == ["blue-square.png", "red-circle.png", "sub/green.png"]
    assert hits[0]["id"] == "sub/green.png" and hits[0]["scores"]["cosine"] == pytest.approx(1, abs=3e-3)
    assert 'clip_collection_job_images_total{kind="import"}' in client.get("/metrics").text
    # Imported again: what the collection holds with the same bytes and metadata is done already,
    # and only a changed image is embedded again.
    embedded = metric_value(str(client.base_url), "clip_collection_job_images_total", kind="import")
    assert client.post("/collections/folder/imports", json={"path": str(dataset / "catalogue")}).status_code == 202
    info = finished(client, "folder")
    assert (info["job"]["state"], info["job"]["done"], info["count"]) == ("done", 3, 3), info
    assert metric_value(str(client.base_url), "clip_collection_job_images_total", kind="import") == embedded
    changed = dataset / "catalogue" / "red-circle.png"
    original = changed.read_bytes()
    changed.write_bytes(base64.b64decode(make_image("circle", "blue")["data"]))
    try:
        assert client.post("/collections/folder/imports", json={"path": str(dataset / "catalogue")}).status_code == 202
        assert finished(client, "folder")["job"]["done"] == 3
        assert metric_value(str(client.base_url), "clip_collection_job_images_total", kind="import") == embedded + 1
        body = {"image": make_image("circle", "blue"), "limit": 1}
        (hit,) = client.post("/collections/folder/search", json=body).json()["hits"]
        assert hit["id"] == "red-circle.png" and hit["scores"]["cosine"] == pytest.approx(1, abs=3e-3)
    finally:
        changed.write_bytes(original)


def test_a_manifest_gives_ids_and_metadata(client: httpx.Client, dataset: Path, make_image: Any) -> None:
    from clipdiff import Client

    with Client(str(client.base_url)) as sdk:
        sdk.create_collection("manifest")
        job = sdk.import_to_collection("manifest", str(dataset / "manifest.jsonl")).job
        assert job is not None and (job.kind, job.total) == ("import", 2)
    assert finished(client, "manifest")["count"] == 2
    body = {"image": make_image("circle", "red"), "filters": {"colour": "blue"}}
    (hit,) = client.post("/collections/manifest/search", json=body).json()["hits"]
    assert (hit["id"], hit["metadata"]) == ("catalogue/blue-square.png", {"colour": "blue"})  # id left out: the path


def test_paths_outside_the_roots_and_bad_manifests_are_refused_before_any_work(
    client: httpx.Client, dataset: Path, tmp_path: Path
) -> None:
    assert client.put("/collections/refused", json={}).status_code == 201
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"\x89PNG")
    (dataset / "link-out").symlink_to(outside)
    bad_lines = dataset / "bad.jsonl"
    bad_lines.write_text('{"path": "catalogue/red-circle.png"}\n{"path": "../' + outside.name + '/secret.png"}\n')
    try:
        url = "/collections/refused/imports"
        for path in (str(dataset / ".." / outside.name), str(dataset / "link-out"), str(outside)):
            error(client.post(url, json={"path": path}), 403, "forbidden")
        moved = dataset.parent / f"{dataset.name}-sibling"  # a prefix of the root's name is not inside it
        moved.mkdir()
        error(client.post(url, json={"path": str(moved)}), 403, "forbidden")
        assert error(client.post(url, json={"path": str(bad_lines)}), 403, "forbidden")["field"] == "path: line 2"
        bad_lines.write_text('{"path": "catalogue/red-circle.png", "metadata": {"k": [1]}}\n')
        assert "line 1" in error(client.post(url, json={"path": str(bad_lines)}), 400, "bad_input")["message"]
        bad_lines.write_text('{"path": "catalogue/red-circle.png", "metadata": {"1k": 1}}\n')
        error(client.post(url, json={"path": str(bad_lines)}), 400, "bad_input")
        error(client.post(url, json={"path": "catalogue"}), 400, "bad_input")  # relative
        error(client.post(url, json={"path": str(dataset / "absent")}), 404, "not_found")
        error(client.post(url, json={"path": str(dataset / "catalogue" / "notes.txt")}), 400, "bad_input")
        error(client.post("/collections/absent/imports", json={"path": str(dataset)}), 404, "unknown_collection")
        info = client.get("/collections/refused").json()
        assert info["count"] == 0 and info["job"] is None
    finally:
        (dataset / "link-out").unlink()
        bad_lines.unlink()


def test_no_roots_no_imports(tmp_path: Path) -> None:
    with pytest.raises(ClipError) as refused:
        allowed(str(tmp_path), [])
    assert refused.value.code == ErrorCode.forbidden
    assert allowed(str(tmp_path / "a" / ".." / "b"), [str(tmp_path)]) == (tmp_path / "b").resolve()


def test_an_add_as_a_multipart_form_is_the_same_add_as_json(client: httpx.Client, dataset: Path) -> None:
    assert client.put("/collections/form", json={}).status_code == 201
    red, blue = (dataset / "catalogue" / f"{n}.png" for n in ("red-circle", "blue-square"))
    files = [
        ("images", ("r.png", red.read_bytes(), "image/png")),
        ("images", ("b.png", blue.read_bytes(), "image/png")),
    ]
    items = [{"id": "r", "metadata": {"colour": "red"}}, {"id": "b"}]
    r = client.post("/collections/form/images", files=files, data={"items": json.dumps(items)})
    assert r.status_code == 200, r.text
    assert (r.json()["added"], r.json()["count"]) == (["r", "b"], 2)
    body = {"image": {"data": base64.b64encode(red.read_bytes()).decode()}, "limit": 1}
    (hit,) = client.post("/collections/form/search", json=body).json()["hits"]
    assert (hit["id"], hit["metadata"]) == ("r", {"colour": "red"})
    url = "/collections/form/images"
    assert (
        error(client.post(url, files=files, data={"items": json.dumps(items[:1])}), 422, "validation_error")["field"]
        == "items"
    )  # one entry per file
    assert error(client.post(url, files=files), 422, "validation_error")["field"] == "items"
    bad = [{"id": "r", "metadata": {"1k": 1}}, {"id": "b"}]
    assert error(client.post(url, files=files, data={"items": json.dumps(bad)}), 400, "bad_input")["field"] == (
        "items.0.metadata.1k"
    )
    assert error(
        client.post("/collections/nope/images", files=files, data={"items": json.dumps(items)}),
        404,
        ("unknown_collection"),
    )
    # Bytes the server never had cannot be kept: a reference is refused, with its field.
    ref = {"items": [{"id": "x", "image": {"sha256": "0" * 64}}]}
    assert error(client.post(url, json=ref), 400, "bad_input")["field"] == "items.0.image.sha256"
    assert client.get("/collections/form").json()["count"] == 2


def test_dropping_a_collection_stops_its_import(client: httpx.Client, dataset: Path, tmp_path: Path) -> None:
    for _ in range(3):
        assert client.put("/collections/dropped", json={}).status_code == 201
        r = client.post("/collections/dropped/imports", json={"path": str(dataset / "catalogue")})
        assert r.status_code == 202, r.text
        assert client.delete("/collections/dropped").status_code == 200
        assert client.get("/collections/dropped").status_code == 404
        # A collection made again under the name gets nothing from the dropped one's job.
        assert client.put("/collections/dropped", json={}).status_code == 201
        time.sleep(0.3)
        info = client.get("/collections/dropped").json()
        assert (info["count"], info["job"]) == (0, None)
        assert client.delete("/collections/dropped").status_code == 200


def test_a_form_add_takes_as_many_files_as_an_add_takes_items(
    tiny_store: Path, dataset: Path, tmp_path: Path, serve_app: Any
) -> None:
    picture = (dataset / "catalogue" / "red-circle.png").read_bytes()
    settings = {"url": f"file://{tmp_path}", "max_items_per_add": 5}
    with (
        serve_app(store=str(tiny_store), model="tiny@production", limits={"max_images": 1}, collections=settings) as s,
        httpx.Client(base_url=s.url, timeout=60) as c,
    ):
        assert c.put("/collections/many", json={}).status_code == 201
        files = [("images", (f"{i}.png", picture, "image/png")) for i in range(5)]
        items = json.dumps([{"id": str(i)} for i in range(5)])
        r = c.post("/collections/many/images", files=files, data={"items": items})
        assert r.status_code == 200 and r.json()["count"] == 5, r.text
