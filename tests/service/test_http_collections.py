"""/collections through a real uvicorn server: the tiny model with a random DCSM scorer (contract,
scores against the endpoints that compute the same math, bounds and errors) on the embedded and
the PostgreSQL backends alike, a version change
(409, never mixed), and the committed default model (DCSM re-ranking of compositional queries)."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from dense_model import publish_dense
from pgvector_server import pgvector_database_fixture, pgvector_server_fixture  # noqa: F401
from PIL import Image

from clipcore.methods.pairwise_rank import pair_scores
from service.api.vector_encoding import decode_rows

SCENES = [  # (id, shape, colour, metadata)
    ("red-circle", "circle", "red", {"colour": "red", "n": 1}),
    ("blue-circle", "circle", "blue", {"colour": "blue", "n": 2}),
    ("red-square", "square", "red", {"colour": "red", "n": 3}),
    ("green-triangle", "triangle", "green", {"colour": "green", "n": 4}),
    ("blue-square", "square", "blue", {"colour": "blue", "n": 5, "sale": True}),
]


@pytest.fixture(scope="module")
def dense_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coll-store")
    publish_dense(root)
    return root


@pytest.fixture(scope="module", params=["embedded", "postgres"])
def server(
    request: pytest.FixtureRequest, dense_store: Path, tmp_path_factory: pytest.TempPathFactory, serve_app: Any
) -> Iterator[Any]:
    """The tests that use it run on each backend: the embedded folder and PostgreSQL + pgvector."""
    folder = tmp_path_factory.mktemp("collections")
    url = f"file://{folder}" if request.param == "embedded" else request.getfixturevalue("pgvector_database")
    with serve_app(
        store=str(dense_store),
        model="dense@production",
        collections={"url": url, "image_folder": str(folder), "max_items_per_add": 8, "max_results": 50},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def images(make_image: Any) -> dict[str, dict[str, str]]:
    return {i: make_image(shape, colour) for i, shape, colour, _ in SCENES}


@pytest.fixture(scope="module")
def shop(client: httpx.Client, images: dict[str, dict[str, str]]) -> str:
    """A collection holding the five scenes."""
    r = client.put("/collections/shop", json={})
    assert r.status_code == 201, r.text
    items = [{"id": i, "image": images[i], "metadata": meta} for i, _, _, meta in SCENES]
    r = client.post("/collections/shop/images", json={"items": items})
    assert r.status_code == 200, r.text
    assert r.json()["count"] == len(SCENES)
    return "shop"


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["code"] == code, body
    return body  # type: ignore[no-any-return]


def png(picture: Any) -> str:
    buf = io.BytesIO()
    picture.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def embed(client: httpx.Client, **body: Any) -> np.ndarray:
    out = ok(client.post("/embed", json=body))
    vectors = decode_rows(out["embeddings"], out["encoding_format"])
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


# ----------------------------------------------------------------------------- lifecycle
def test_create_list_inspect_and_drop(client: httpx.Client) -> None:
    created = client.put("/collections/tmp-1", json={"model": "dense"})
    assert created.status_code == 201, created.text
    info = created.json()
    version = ok(client.get("/models"))["served"][0]["serving"]
    assert info["model"] == version and info["entry"] == "dense@production"
    assert (info["count"], info["dim"], info["dense"]) == (0, 32, True) or info["dim"] > 0
    assert info["dense"] is True and info["count"] == 0
    assert ok(client.get("/collections/tmp-1")) == info
    assert "tmp-1" in [c["name"] for c in ok(client.get("/collections"))["collections"]]
    error(client.put("/collections/tmp-1", json={}), 409, "collection_exists")
    pinned = client.put("/collections/tmp-1b", json={"model": version})  # the version it serves now
    assert pinned.status_code == 201 and pinned.json()["model"] == version
    ok(client.delete("/collections/tmp-1b"))
    refused = client.patch("/collections/tmp-1")
    assert refused.status_code == 405
    assert set(refused.headers["allow"].split(", ")) >= {"PUT", "GET", "DELETE"}  # every route of the path
    assert ok(client.delete("/collections/tmp-1"))["removed"] == "tmp-1"
    error(client.get("/collections/tmp-1"), 404, "unknown_collection")
    error(client.delete("/collections/tmp-1"), 404, "unknown_collection")


def test_an_hnsw_collection_answers_as_an_exact_one_on_the_embedded_store(
    client: httpx.Client, shop: str, images: Any, request: pytest.FixtureRequest
) -> None:
    body = {"index": {"kind": "hnsw", "m": 8, "ef_search": 40}}
    if request.node.callspec.params["server"] == "postgres":  # one index for the database: collections.url's
        assert error(client.put("/collections/tmp-hnsw", json=body), 400, "bad_input")["field"] == "index"
        assert ok(client.get(f"/collections/{shop}"))["index"]["kind"] == "exact"
        assert len(ok(client.post(f"/collections/{shop}/search", json={"text": "x", "ef_search": 50}))["hits"]) == 5
        return
    from clipdiff import Client

    with Client(str(client.base_url)) as sdk:  # the SDK sends the index as given
        assert sdk.create_collection("tmp-hnsw-sdk", index={"kind": "hnsw"}).index == {
            "kind": "hnsw", "m": 32, "ef_construction": 128, "ef_search": 100
        }  # fmt: skip
        sdk.drop_collection("tmp-hnsw-sdk")
    created = client.put("/collections/tmp-hnsw", json=body)
    assert created.status_code == 201, created.text
    index = {"kind": "hnsw", "m": 8, "ef_construction": 128, "ef_search": 40}  # the knob left out: its default
    assert created.json()["index"] == index and ok(client.get("/collections/tmp-hnsw"))["index"] == index
    assert ok(client.get(f"/collections/{shop}"))["index"] == {
        "kind": "exact",
        "m": None,
        "ef_construction": None,
        "ef_search": None,
    }
    items = [{"id": i, "image": images[i], "metadata": meta} for i, _, _, meta in SCENES]
    ok(client.post("/collections/tmp-hnsw/images", json={"items": items}))
    ok(client.delete("/collections/tmp-hnsw/images/red-square"))
    for search in (
        {"text": "a red circle"},
        {"image": images["blue-square"], "ef_search": 1},
        {"text": "a shape", "filters": {"colour": "red"}},
        {"text": "a shape", "limit": 2, "offset": 1},
    ):
        want = ok(client.post(f"/collections/{shop}/search", json=search))
        got = ok(client.post("/collections/tmp-hnsw/search", json=search))
        want["hits"] = [h for h in want["hits"] if h["id"] != "red-square"][: len(got["hits"])]
        assert [h["id"] for h in got["hits"]] == [h["id"] for h in want["hits"]]
        np.testing.assert_allclose(
            [h["scores"]["cosine"] for h in got["hits"]], [h["scores"]["cosine"] for h in want["hits"]], atol=1e-6
        )
    ok(client.delete("/collections/tmp-hnsw"))


def test_adding_an_id_again_replaces_it_and_removal_is_by_id(client: httpx.Client, images: Any) -> None:
    assert client.put("/collections/tmp-2", json={}).status_code == 201
    add = {"items": [{"id": "x", "image": images["red-circle"], "metadata": {"v": 1}}]}
    assert ok(client.post("/collections/tmp-2/images", json=add))["count"] == 1
    add["items"][0].update(image=images["blue-square"], metadata={"v": 2})
    assert ok(client.post("/collections/tmp-2/images", json=add))["count"] == 1
    # An id twice in one add: the last one is kept.
    twice = [{"id": "y", "image": images["red-circle"]}, {"id": "y", "image": images["green-triangle"]}]
    assert ok(client.post("/collections/tmp-2/images", json={"items": twice}))["count"] == 2
    (hit,) = ok(client.post("/collections/tmp-2/search", json={"image": images["green-triangle"], "limit": 1}))["hits"]
    assert hit["id"] == "y" and hit["scores"]["cosine"] == pytest.approx(1, abs=1e-3)
    ok(client.delete("/collections/tmp-2/images/y"))
    (hit,) = ok(client.post("/collections/tmp-2/search", json={"image": images["blue-square"]}))["hits"]
    assert hit["id"] == "x" and hit["metadata"] == {"v": 2} and hit["scores"]["cosine"] == pytest.approx(1, abs=1e-3)
    assert ok(client.delete("/collections/tmp-2/images/x"))["removed"] == "x"
    error(client.delete("/collections/tmp-2/images/x"), 404, "not_found")
    assert ok(client.post("/collections/tmp-2/search", json={"image": images["blue-square"]}))["hits"] == []
    ok(client.delete("/collections/tmp-2"))


def test_an_add_runs_one_tower_pass_and_stores_what_two_passes_give(
    server: Any, client: httpx.Client, make_image: Any
) -> None:
    """The pooled embedding and the DCSM tokens of an added image come from one dense batch: the
    pooled image batcher runs nothing, and the stored values are the two towers' own."""
    added = {f"p{i}": make_image(shape, "yellow", x=0.4) for i, shape in enumerate(("circle", "square"))}
    batches = {b: batch_count(server.url, b) for b in ("image", "dense-image")}
    assert client.put("/collections/one-pass", json={}).status_code == 201
    items = [{"id": i, "image": image} for i, image in added.items()]
    ok(client.post("/collections/one-pass/images", json={"items": items}))
    assert batch_count(server.url, "image") == batches["image"]
    assert batch_count(server.url, "dense-image") > batches["dense-image"]
    bundle = server.services.models.resolve("dense").entry.current.bundle
    decoded = [Image.open(io.BytesIO(base64.b64decode(i["data"]))).convert("RGB") for i in added.values()]
    pixels = np.stack([bundle.preprocess(image) for image in decoded])
    store = server.app.state.collections.store
    stored = {h.id: h.vector for h in store.search("one-pass", bundle.encode_images(pixels)[0], 10, {})}
    np.testing.assert_allclose([stored[i] for i in added], bundle.encode_images(pixels), atol=1e-3)
    np.testing.assert_allclose(
        store.dense_tokens("one-pass", list(added)), bundle.encode_dense_images(pixels), atol=1e-3
    )
    ok(client.delete("/collections/one-pass"))


def batch_count(url: str, batcher: str) -> float:
    """Batches the server's ``batcher`` has run (``clip_batch_size`` observations)."""
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("clip_batch_size_count{") and f'batcher="{batcher}"' in line
    )


# ----------------------------------------------------------------------------- search
def test_search_by_image_finds_it_first_with_cosines_of_embed(client: httpx.Client, shop: str, images: Any) -> None:
    body = ok(client.post(f"/collections/{shop}/search", json={"image": images["red-square"], "limit": 5}))
    assert body["model"] == ok(client.get("/models"))["served"][0]["serving"]
    assert body["candidates"] == 5
    ids = [h["id"] for h in body["hits"]]
    assert ids[0] == "red-square" and sorted(ids) == sorted(i for i, *_ in SCENES)
    g = embed(client, images=[images[i] for i in ids])
    np.testing.assert_allclose([h["scores"]["cosine"] for h in body["hits"]], g @ g[0], atol=2e-3)
    assert all(h["stage"] == "cosine" and set(h["scores"]) == {"cosine"} for h in body["hits"])
    assert body["hits"][0]["metadata"] == {"colour": "red", "n": 3}


def test_search_by_text_ranks_by_cosine_with_its_encoder(client: httpx.Client, shop: str, images: Any) -> None:
    text = "a red square"
    body = ok(client.post(f"/collections/{shop}/search", json={"text": text, "limit": 5}))
    ids = [h["id"] for h in body["hits"]]
    g = embed(client, images=[images[i] for i in ids])
    f = embed(client, texts=[text])[0]
    cosines = [h["scores"]["cosine"] for h in body["hits"]]
    np.testing.assert_allclose(cosines, g @ f, atol=2e-3)
    assert cosines == sorted(cosines, reverse=True)


def test_filters_and_pages(client: httpx.Client, shop: str, images: Any) -> None:
    url = f"/collections/{shop}/search"
    red = ok(client.post(url, json={"image": images["blue-circle"], "filters": {"colour": "red"}}))
    assert sorted(h["id"] for h in red["hits"]) == ["red-circle", "red-square"]
    assert ok(client.post(url, json={"image": images["red-circle"], "filters": {"sale": True}}))["hits"][0]["id"] == (
        "blue-square"
    )
    # Equality is exact, type included: 1 is neither "1" nor true.
    assert [h["id"] for h in ok(client.post(url, json={"text": "x", "filters": {"n": 1}}))["hits"]] == ["red-circle"]
    assert ok(client.post(url, json={"text": "x", "filters": {"n": "1"}}))["hits"] == []
    assert ok(client.post(url, json={"text": "x", "filters": {"sale": 1}}))["hits"] == []
    assert ok(client.post(url, json={"text": "x", "filters": {"nothing": "y"}}))["hits"] == []
    everything = [h["id"] for h in ok(client.post(url, json={"text": "a shape", "limit": 5}))["hits"]]
    pages = [
        h["id"]
        for offset in (0, 2, 4)
        for h in ok(client.post(url, json={"text": "a shape", "limit": 2, "offset": offset}))["hits"]
    ]
    assert pages == everything


def test_difference_search_ranks_by_the_pcclip_difference(client: httpx.Client, shop: str, images: Any) -> None:
    difference = "the first is blue, while the second is red"
    query = images["red-circle"]
    body = ok(client.post(f"/collections/{shop}/search", json={"image": query, "difference": difference, "k": 5}))
    assert body["candidates"] == 5
    ids = [h["id"] for h in body["hits"]]
    g = embed(client, images=[images[i] for i in ids])
    g_q = embed(client, images=[query])[0]
    f = embed(client, texts=[difference])[0]  # this model's default encoder: it has no pcclip variant
    want = pair_scores(g, np.broadcast_to(g_q, g.shape), f)
    got = [h["scores"]["difference"] for h in body["hits"]]
    np.testing.assert_allclose(got, want, atol=5e-3)
    assert got == sorted(got, reverse=True)
    assert all(h["stage"] == "difference" for h in body["hits"])
    assert dict(zip(ids, got, strict=True))["red-circle"] == pytest.approx(0, abs=1e-6)  # no difference to itself


def test_dense_rerank_scores_as_score_dense_does(client: httpx.Client, shop: str, images: Any) -> None:
    text = "a red square to the left of a blue circle"
    body = ok(client.post(f"/collections/{shop}/search", json={"text": text, "rerank": "dense", "k": 5, "limit": 5}))
    assert all(h["stage"] == "dense" for h in body["hits"])
    dense = [h["scores"]["dense"] for h in body["hits"]]
    assert dense == sorted(dense, reverse=True)
    for hit in body["hits"]:
        single = ok(client.post("/score/dense", json={"image": images[hit["id"]], "texts": [text]}))
        assert hit["scores"]["dense"] == pytest.approx(single["scores"][0], abs=1e-4)
        assert hit["scores"]["cosine"] == pytest.approx(single["cosine"][0], abs=2e-3)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("a red circle without a blue square", ["a red circle", "a blue square"]),
        ("there is no red square.", ["red square"]),
    ],
)
def test_a_negated_rerank_takes_its_candidates_near_the_shown_part_and_away_from_the_absent_one(
    client: httpx.Client, shop: str, images: Any, text: str, parts: list[str]
) -> None:
    body = ok(client.post(f"/collections/{shop}/search", json={"text": text, "rerank": "dense", "k": 3, "limit": 3}))
    f = embed(client, texts=parts)
    query = f[0] - f[1] if len(parts) == 2 else -f[0]
    query /= np.linalg.norm(query)
    ids = [i for i, *_ in SCENES]
    g = embed(client, images=[images[i] for i in ids])
    nearest = np.argsort(-(g @ query), kind="stable")[:3]
    assert {h["id"] for h in body["hits"]} == {ids[i] for i in nearest}
    for hit in body["hits"]:
        assert hit["stage"] == "dense"
        assert hit["scores"]["cosine"] == pytest.approx(float(g[ids.index(hit["id"])] @ query), abs=2e-3)
    plain = ok(client.post(f"/collections/{shop}/search", json={"text": text, "limit": 5}))["hits"]
    # A search without a re-rank ranks by the whole text's cosine, as plain CLIP search does.
    whole = embed(client, texts=[text])[0]
    cosines = [h["scores"]["cosine"] for h in plain]
    np.testing.assert_allclose(cosines, g[[ids.index(h["id"]) for h in plain]] @ whole, atol=2e-3)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("put", "/collections/Bad Name", {}, 422, "validation_error"),
        ("put", "/collections/ok", {"model": "nope"}, 404, "unknown_model"),
        ("post", "/collections/nope/search", {"text": "x"}, 404, "unknown_collection"),
        ("post", "/collections/shop/search", {}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "image": {"sha256": "0" * 64}}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "difference": "y"}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "rerank": "sparse"}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "limit": 0}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "ef_search": 0}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "ef_search": 1001}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "ef_search": "64"}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "hnsw", "m": 1}}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "hnsw", "m": 101}}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "hnsw", "ef_construction": 3}}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "hnsw", "ef_search": 0}}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "exact", "m": 16}}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "ivf"}}, 422, "validation_error"),
        ("put", "/collections/ok", {"index": {"kind": "hnsw", "M": 16}}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"text": "x", "limit": 40, "offset": 20}, 413, "payload_too_large"),
        ("post", "/collections/shop/search", {"text": "x", "k": 51}, 413, "payload_too_large"),
        ("post", "/collections/shop/search", {"text": "x", "filters": {"a.b": 1}}, 400, "bad_input"),
        ("post", "/collections/shop/search", {"text": "x", "filters": {"a": [1]}}, 422, "validation_error"),
        ("post", "/collections/shop/search", {"image": {"sha256": "0" * 64}}, 404, "unknown_image"),
        ("post", "/collections/shop/search", {"image": {"data": "bm90IGFuIGltYWdl"}}, 400, "bad_image"),
        ("post", "/collections/shop/images", {"items": []}, 400, "bad_input"),
        ("post", "/collections/shop/images", {"items": [{"id": "a"}]}, 422, "validation_error"),
    ],
)
def test_bad_requests_get_a_4xx(
    client: httpx.Client, shop: str, method: str, path: str, body: dict[str, Any], status: int, code: str
) -> None:
    error(getattr(client, method)(path, json=body) if method != "get" else client.get(path), status, code)


def test_image_search_with_dense_rerank_is_refused(client: httpx.Client, shop: str, images: Any) -> None:
    body = {"image": images["red-circle"], "rerank": "dense"}
    assert error(client.post(f"/collections/{shop}/search", json=body), 400, "bad_input")["field"] == "rerank"


def test_add_bounds(client: httpx.Client, shop: str, images: Any) -> None:
    url = f"/collections/{shop}/images"
    item = {"id": "a", "image": images["red-circle"]}
    error(client.post(url, json={"items": [item] * 9}), 413, "payload_too_large")
    error(client.post(url, json={"items": [{**item, "id": "x" * 129}]}), 413, "payload_too_large")
    error(client.post(url, json={"items": [{**item, "metadata": {"k": "v" * 5000}}]}), 413, "payload_too_large")
    error(client.post(url, json={"items": [{**item, "metadata": {"1k": 1}}]}), 400, "bad_input")
    error(client.post(url, json={"items": [{**item, "metadata": {"k": {"nested": 1}}}]}), 422, "validation_error")
    # A lone surrogate (JSON's "\ud800" escape) cannot be stored or answered as UTF-8.
    surrogate = '{"items": [{"id": "\\ud800", "image": {"sha256": "%s"}}]}' % ("0" * 64)
    headers = {"Content-Type": "application/json"}
    assert error(client.post(url, content=surrogate, headers=headers), 422, "validation_error")["field"] == "items.0.id"
    surrogate = '{"items": [{"id": "s", "image": {"sha256": "%s"}, "metadata": {"k": "\\udc00"}}]}' % ("0" * 64)
    assert (
        error(client.post(url, content=surrogate, headers=headers), 400, "bad_input")["field"] == "items.0.metadata.k"
    )
    filters = '{"text": "x", "filters": {"k": "\\udc00"}}'
    error(client.post(url.replace("/images", "/search"), content=filters, headers=headers), 400, "bad_input")
    bad = {"id": "b", "image": {"data": "bm90IGFuIGltYWdl"}}
    error(client.post(url, json={"items": [item | {"id": "c"}, bad]}), 400, "bad_image")
    assert ok(client.get(url.removesuffix("/images")))["count"] == len(SCENES)  # nothing of a refused add


# ----------------------------------------------------------------------------- versions
@pytest.mark.slow
def test_a_collection_refuses_adds_and_searches_once_its_model_serves_another_version(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    store = tmp_path / "store"
    v1 = publish_model(store, "tiny", seed=0)
    with (
        serve_app(
            store=str(store),
            model="tiny@production",
            watch_interval_s=0.2,
            collections={"url": f"file://{tmp_path / 'collections'}"},
        ) as running,
        httpx.Client(base_url=running.url, timeout=60) as c,
    ):
        assert c.put("/collections/c", json={"model": "tiny@production"}).status_code == 201
        item = {"id": "a", "image": make_image("circle", "red")}
        ok(c.post("/collections/c/images", json={"items": [item]}))
        v2 = publish_model(store, "tiny", seed=1)
        deadline = time.monotonic() + 60
        while ok(c.get("/models"))["served"][0]["serving"] != f"tiny@{v2}":
            assert time.monotonic() < deadline, "the new version was not swapped in"
            time.sleep(0.2)
        for r in (
            c.post("/collections/c/images", json={"items": [item]}),
            c.post("/collections/c/search", json={"text": "a red circle"}),
        ):
            message = error(r, 409, "version_mismatch")["message"]
            assert f"tiny@{v1}" in message and f"tiny@{v2}" in message
        info = ok(c.get("/collections/c"))
        assert (info["model"], info["count"]) == (f"tiny@{v1}", 1)  # still listed, never mixed
        created = c.put("/collections/c2", json={})
        assert created.status_code == 201 and created.json()["model"] == f"tiny@{v2}"


def test_collections_need_the_api_key(tmp_path: Path, tiny_store: Path, serve_app: Any) -> None:
    with serve_app(
        store=str(tiny_store),
        model="tiny@production",
        api_keys=["k1"],
        collections={"url": f"file://{tmp_path}"},
    ) as running:
        assert httpx.get(f"{running.url}/collections").status_code == 401
        assert httpx.put(f"{running.url}/collections/a", json={}).status_code == 401
        r = httpx.get(f"{running.url}/collections", headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200 and r.json() == {"collections": []}


# ----------------------------------------------------------------------------- the committed model
DEFAULT_STORE = Path(__file__).resolve().parents[2] / "models"
HARD_NEGATIVES = 24


@pytest.mark.slow
def test_dense_rerank_on_the_default_model_puts_the_true_scene_first_where_cosine_does_not(
    tmp_path: Path, serve_app: Any
) -> None:
    """Each held-out hard negative adds two shapes-world scenes: the one its caption is true of
    and the minimally different one its hard negative is true of (colours swapped, relation
    flipped, the negated object shown). Searching by the caption within the pair (a metadata
    filter), cosine is near chance on these; DCSM re-ranking must find the true scene clearly
    more often, reordering the pairs cosine got wrong."""
    from model_store import ModelNotFound, ModelStore
    from training.world.hard_negatives import hard_negative_set
    from training.world.render import draw_scene_pil
    from training.world.scene import Split

    store = ModelStore(DEFAULT_STORE)
    try:
        name, version = store.resolve("default@production")
    except ModelNotFound:
        pytest.skip("default@production is not published")
    if "dcsm" not in store.manifest(name, version).components:
        pytest.skip(f"{name}@{version} has no DCSM scorer")
    items = hard_negative_set(Split.TEST, seed=7, n=HARD_NEGATIVES)
    with (
        serve_app(
            store=str(DEFAULT_STORE), model="default@production", collections={"url": f"file://{tmp_path}"}
        ) as running,
        httpx.Client(base_url=running.url, timeout=120) as c,
    ):
        assert c.put("/collections/scenes", json={}).status_code == 201
        for i, item in enumerate(items):
            pair = [
                {
                    "id": f"{i}-{side}",
                    "image": {"data": png(draw_scene_pil(scene, size=224))},
                    "metadata": {"item": i},
                }
                for side, scene in (("true", item.scene), ("false", item.negative_scene))
            ]
            ok(c.post("/collections/scenes/images", json={"items": pair}))
        cosine_right, dense_right = [], []
        for i, item in enumerate(items):
            query = {"text": item.positive, "filters": {"item": i}, "k": 2, "limit": 2}
            plain = ok(c.post("/collections/scenes/search", json=query))["hits"]
            reranked = ok(c.post("/collections/scenes/search", json={**query, "rerank": "dense"}))["hits"]
            assert {h["id"] for h in plain} == {h["id"] for h in reranked} == {f"{i}-true", f"{i}-false"}
            cosine_right.append(plain[0]["id"] == f"{i}-true")
            dense_right.append(reranked[0]["id"] == f"{i}-true")
    cosine, dense = np.mean(cosine_right), np.mean(dense_right)
    print(f"true scene first of {len(items)} pairs: cosine {cosine:.2f}, DCSM rerank {dense:.2f}")
    assert dense >= 0.6 and dense > cosine, f"true scene first: DCSM {dense:.2f}, cosine {cosine:.2f}"
    assert any(d and not c for c, d in zip(cosine_right, dense_right, strict=True))


# ----------------------------------------------------------------------------- SDK
def test_the_sdk_manages_and_searches_a_collection(server: Any, images: Any) -> None:
    from clipdiff import AsyncClient, Client, NotFound

    with Client(server.url) as client:
        info = client.create_collection("sdk")
        assert (info.name, info.count, info.dense) == ("sdk", 0, True)
        added = client.add_to_collection(
            "sdk", [("a", images["red-circle"], {"colour": "red"}), ("b", images["blue-square"])]
        )
        assert (added.added, added.count) == (["a", "b"], 2)
        assert [c.name for c in client.collections()].count("sdk") == 1
        hits = client.search_collection("sdk", image=images["red-circle"], limit=1, ef_search=20).hits
        assert [(h.id, h.stage, h.metadata) for h in hits] == [("a", "cosine", {"colour": "red"})]
        assert info.index is not None and info.index["kind"] == "exact"
        found = client.search_collection("sdk", text="a red circle", rerank="dense", k=2, filters={"colour": "red"})
        assert [h.id for h in found.hits] == ["a"] and found.hits[0].scores.dense is not None
        diff = client.search_collection("sdk", image=images["red-circle"], difference="bluer", k=2)
        assert {h.stage for h in diff.hits} == {"difference"} and diff.candidates == 2
        client.remove_from_collection("sdk", "b")
        assert client.collection("sdk").count == 1
        with pytest.raises(NotFound):
            client.remove_from_collection("sdk", "b")

    async def drop() -> None:
        async with AsyncClient(server.url) as aclient:
            assert (await aclient.collection("sdk")).count == 1
            await aclient.drop_collection("sdk")
            with pytest.raises(NotFound):
                await aclient.collection("sdk")

    asyncio.run(drop())
