"""Multipart form uploads on the image endpoints, against the real app under uvicorn.

A form must get the answer its JSON twin gets, the same limits (body bytes, images per request,
pixels) and the same error envelope; the ``curl -F`` examples of docs/api.md are run as written
by ``tests/service/test_api_doc_curl.py``.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from service.config import Limits

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "models"
LARGER = "The first image contains a larger shape, while the second contains a smaller shape."


def png(image: dict[str, str]) -> bytes:
    return base64.b64decode(image["data"])


@pytest.fixture(scope="module")
def default_url(serve_app: Any, service_redis: Any) -> Iterator[str]:
    """The committed default model (it has every component: DCSM, YUKINO, text encoders)."""
    if not (STORE / "default" / "aliases.json").exists():
        pytest.skip(f"the committed default model is not in {STORE}")
    with serve_app(store=str(STORE), model="default@production", redis_url=service_redis.url) as running:
        yield running.url


@pytest.fixture(scope="module")
def small_url(serve_app: Any, tiny_store: Path) -> Iterator[str]:
    limits = Limits(max_body_bytes=60_000, max_images=3, max_pixels=300 * 300)
    with serve_app(store=str(tiny_store), model="tiny@production", limits=limits, api_keys=["k"]) as running:
        yield running.url


AUTH = {"Authorization": "Bearer k"}


def both_forms(url: str, path: str, body: dict[str, Any], files: list[tuple[str, Any]]) -> tuple[Any, Any]:
    as_json = httpx.post(f"{url}{path}", json=body, timeout=120)
    as_form = httpx.post(f"{url}{path}", files=files, timeout=120)
    assert as_json.status_code == 200, as_json.text
    assert as_form.status_code == 200, as_form.text
    return as_json, as_form


@pytest.mark.slow
def test_rank_pair_form_equals_json(default_url: str, make_image: Any) -> None:
    a, b = make_image("circle", "red", "large"), make_image("circle", "red", "small")
    body = {"image_a": a, "image_b": b, "difference": LARGER}
    files = [
        ("image_a", ("a.png", png(a), "image/png")),
        ("image_b", ("b.png", png(b))),
        ("difference", (None, LARGER)),
    ]
    as_json, as_form = both_forms(default_url, "/rank-pair", body, files)
    assert as_form.json() == as_json.json()
    assert as_form.json()["first"] == "a"


def test_classify_form_with_repeated_fields_and_query(default_url: str, make_image: Any) -> None:
    images = [make_image("circle", "red", "large"), make_image("square", "blue", "large")]
    labels = ["circle", "square", "triangle"]
    body = {"images": images, "labels": labels, "top_k": 2}
    files = [("images", (f"{i}.png", png(img))) for i, img in enumerate(images)]
    files += [("labels", (None, label)) for label in labels] + [("top_k", (None, "2"))]
    as_json, as_form = both_forms(default_url, "/classify", body, files)
    assert as_form.json() == as_json.json()
    assert [r["label"] for r in as_form.json()["results"]] == ["circle", "square"]
    comps = [{"a": "circle", "b": "square", "text": "a circle is round, while a square has corners"}]
    form = files + [("comparatives", (None, json.dumps(comps)))]
    r = httpx.post(f"{default_url}/classify?comparative=true", files=form, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["comparative"]["source"] == "request"


def test_rank_dense_heatmap_and_embed_forms_equal_json(default_url: str, make_image: Any) -> None:
    images = [make_image("circle", "red", s) for s in ("small", "large", "medium")]
    files = [("images", (f"{i}.png", png(img))) for i, img in enumerate(images)] + [("difference", (None, LARGER))]
    as_json, as_form = both_forms(default_url, "/rank", {"images": images, "difference": LARGER}, files)
    assert as_form.json() == as_json.json()

    texts = ["a red circle", "a blue square"]
    body = {"image": images[0], "texts": texts, "return_maps": True}
    files = [("image", ("x.png", png(images[0])))] + [("texts", (None, t)) for t in texts]
    as_json, as_form = both_forms(default_url, "/score/dense", body, files + [("return_maps", (None, "true"))])
    assert as_form.json() == as_json.json()

    heat_files = [("image", ("x.png", png(images[0]))), ("text", (None, "a red circle"))]
    as_json, as_form = both_forms(default_url, "/score/dense/heatmap", {"image": images[0], "text": "a red circle"},
                                  heat_files)  # fmt: skip
    assert as_form.headers["content-type"] == "image/png" and as_form.content == as_json.content

    files = [("images", (f"{i}.png", png(img))) for i, img in enumerate(images)]
    body = {"images": images, "encoding_format": "float16"}
    as_json, as_form = both_forms(default_url, "/embed", body, files + [("encoding_format", (None, "float16"))])
    assert as_form.json() == as_json.json()


def error(r: httpx.Response) -> tuple[int, str, str | None]:
    e = r.json()["error"]
    return r.status_code, e["code"], e["field"]


def small_png(px: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (px, px), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # images per request: the route's own 413, with the field, as for JSON
        ([("images", ("x.png", small_png()))] * 4 + [("difference", (None, LARGER))],
         (413, "payload_too_large", "images")),
        # far over it: the form parser stops at once
        ([("images", ("x.png", small_png(8)))] * 40 + [("difference", (None, LARGER))],
         (413, "payload_too_large", None)),
        # pixels, from the image header
        ([("images", ("x.png", small_png(400)))] * 2 + [("difference", (None, LARGER))],
         (413, "payload_too_large", "images.0.data")),
        # a text where a file belongs, a file where a text belongs, a typo
        ([("images", (None, "not a file")), ("difference", (None, LARGER))], (422, "validation_error", "images")),
        ([("images", ("x.png", small_png()))] * 2 + [("difference", ("d.txt", b"x"))],
         (422, "validation_error", "difference")),
        ([("images", ("x.png", small_png()))] * 2 + [("difference", (None, LARGER)), ("difrence", (None, "x"))],
         (422, "validation_error", "difrence")),
        # not an image at all (fields are the JSON paths: images.0.data is the first file)
        ([("images", ("x.png", b"hello"))] * 2 + [("difference", (None, LARGER))], (400, "bad_image", "images.0.data")),
    ],
)  # fmt: skip
def test_form_limits_and_errors_match_json(small_url: str, files: list[Any], expected: tuple[Any, ...]) -> None:
    r = httpx.post(f"{small_url}/rank", files=files, headers=AUTH, timeout=60)
    assert error(r) == expected, r.text


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity", "1e999"])
def test_non_finite_number_in_a_form_is_a_422_naming_the_field(small_url: str, value: str) -> None:
    # These texts read as an infinite float (or NaN). The labels match a comparative of the
    # model's library, so the gate runs: an infinite gate_margin used to reach it and fail (500).
    files = [("images", ("x.png", small_png())), ("labels", (None, "red circle")),
             ("labels", (None, "blue circle")), ("gate_margin", (None, value))]  # fmt: skip
    r = httpx.post(f"{small_url}/classify?comparative=true", files=files, headers=AUTH, timeout=60)
    assert error(r) == (422, "validation_error", "gate_margin"), r.text


def classify_form(extra: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [("images", ("x.png", small_png())), ("labels", (None, "a")), ("labels", (None, "b")), *extra]


@pytest.mark.parametrize(
    ("field", "value"),
    [("symmetric", "yes"), ("symmetric", "1"), ("top_k", "two"), ("top_k", "2.5"), ("alpha", "null"),
     ("descriptions", "null")],
)  # fmt: skip
def test_form_values_are_read_as_the_json_types_the_schema_states(small_url: str, field: str, value: str) -> None:
    # The form schema types these fields as the JSON body does (boolean, integer, number, object);
    # a text that is not one is refused naming the field, as the same value in a JSON body is.
    r = httpx.post(f"{small_url}/classify", files=classify_form([(field, (None, value))]), headers=AUTH, timeout=60)
    assert error(r) == (422, "validation_error", field), r.text


def test_form_numbers_and_booleans_in_their_json_spelling_are_served(small_url: str) -> None:
    extra = [("top_k", (None, "2.0")), ("alpha", (None, "1")), ("gate_margin", (None, "0.5")),
             ("symmetric", (None, "false")), ("descriptions", (None, '{"a": ["the first letter"]}'))]  # fmt: skip
    r = httpx.post(f"{small_url}/classify", files=classify_form(extra), headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["results"][0]["top_k"]) == 2


def test_the_form_schema_states_what_the_form_takes(small_url: str) -> None:
    spec = httpx.get(f"{small_url}/openapi.json", headers=AUTH).json()

    def form(path: str) -> dict[str, Any]:
        return spec["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]  # type: ignore[no-any-return]

    classify = form("/classify")
    fields = classify["schema"]["properties"]
    assert classify["schema"]["additionalProperties"] is False
    assert (fields["top_k"]["type"], fields["top_k"]["minimum"]) == ("integer", 1)
    assert (fields["alpha"]["type"], fields["alpha"]["maximum"]) == ("number", 1)
    assert fields["gate_margin"]["type"] == "number" and fields["symmetric"]["type"] == "boolean"
    assert (fields["labels"]["minItems"], fields["labels"]["uniqueItems"]) == (2, True)
    assert fields["labels"]["items"]["minLength"] == 1 and "pattern" in fields["labels"]["items"]
    assert fields["descriptions"]["type"] == "object"
    as_json = {"contentType": "application/json"}
    assert classify["encoding"] == {"comparatives": as_json, "descriptions": as_json}
    assert form("/score/dense")["schema"]["properties"]["return_maps"]["type"] == "boolean"
    assert form("/rank")["schema"]["properties"]["images"]["minItems"] == 2
    # An empty list sends no part: a list's minimum holds where a one-of form requires it, and a
    # form that leaves the list out admits it empty (the JSON body keeps minItems on the field).
    embed = form("/embed")["schema"]
    assert "minItems" not in embed["properties"]["texts"] and "minItems" not in embed["properties"]["images"]
    assert embed["oneOf"] == [
        {"required": ["texts"], "properties": {"images": {"maxItems": 0}, "texts": {"minItems": 1}}},
        {"required": ["images"], "properties": {"texts": {"maxItems": 0}, "encoder": False, "images": {"minItems": 1}}},
    ]
    assert form("/rank-pair")["schema"]["oneOf"] == [
        {"required": ["image_a", "image_b", "difference"], "properties": {"pairs": {"maxItems": 0}}},
        {
            "required": ["pairs"],
            "properties": {"image_a": False, "image_b": False, "difference": False, "pairs": {"minItems": 1}},
        },
    ]
    assert "minItems" not in classify["schema"]["properties"]["templates"]  # optional: empty is left out


def test_a_json_field_given_as_null_is_refused(small_url: str) -> None:
    # A form has no null (its schema admits none): "null" used to read as a field left out, so a
    # form with both forms of /rank-pair was served as the single one.
    files = [("image_a", ("a.png", small_png())), ("image_b", ("b.png", small_png())),
             ("difference", (None, LARGER)), ("pairs", (None, "null"))]  # fmt: skip
    r = httpx.post(f"{small_url}/rank-pair", files=files, headers=AUTH, timeout=60)
    assert error(r) == (422, "validation_error", "pairs"), r.text


def test_body_cap_counts_the_upload(small_url: str) -> None:
    noise = Image.frombytes("RGB", (200, 200), bytes(range(256)) * 468 + bytes(192))
    buf = io.BytesIO()
    noise.save(buf, "BMP")  # uncompressed: 120 KB, over the 60 KB cap
    files = [("image_a", ("a.bmp", buf.getvalue())), ("image_b", ("b.png", small_png())), ("difference", (None, "d"))]
    r = httpx.post(f"{small_url}/rank-pair", files=files, headers=AUTH, timeout=60)
    assert error(r)[:2] == (413, "payload_too_large")


def test_unauthenticated_upload_is_refused_before_parsing(small_url: str) -> None:
    files = [("images", ("x.png", small_png()))] * 2 + [("difference", (None, LARGER))]
    r = httpx.post(f"{small_url}/rank", files=files, timeout=60)
    assert error(r)[:2] == (401, "unauthorized")


def test_malformed_multipart_is_a_422(small_url: str) -> None:
    headers = {**AUTH, "content-type": "multipart/form-data; boundary=xyz"}
    r = httpx.post(f"{small_url}/rank", content=b"--xyz\r\nContent-Disposition: form-data\r\n\r\nhi\r\n--xyz--\r\n",
                   headers=headers, timeout=60)  # fmt: skip
    assert error(r)[:2] == (422, "validation_error")


def test_json_fields_in_a_form_must_be_json(default_url: str, make_image: Any) -> None:
    image = make_image("circle", "red", "large")
    files = [("images", ("x.png", png(image))), ("labels", (None, "circle")), ("labels", (None, "square")),
             ("descriptions", (None, "{not json"))]  # fmt: skip
    r = httpx.post(f"{default_url}/classify", files=files, timeout=60)
    assert error(r) == (422, "validation_error", "descriptions")
    # Nested deeper than the JSON parser can go: a 422 like the same text in a JSON body, not a 500.
    files[-1] = ("descriptions", (None, "[" * 100_000 + "]" * 100_000))
    r = httpx.post(f"{default_url}/classify", files=files, timeout=60)
    assert error(r) == (422, "validation_error", "descriptions")


def test_every_route_documenting_a_form_takes_one(small_url: str) -> None:
    spec = httpx.get(f"{small_url}/openapi.json", headers=AUTH).json()
    documented = [
        path
        for path, item in spec["paths"].items()
        if "multipart/form-data" in item.get("post", {}).get("requestBody", {}).get("content", {})
    ]
    assert {"/classify", "/rank-pair", "/rank", "/score/dense", "/score/dense/heatmap", "/embed"} <= set(documented)
    # Read as a form, the body reaches the schema, which names a missing field; a route that did not
    # read forms would see a body that is not JSON (as /v1/embeddings, which documents none, does).
    for path in [*documented, "/v1/embeddings"]:
        r = httpx.post(f"{small_url}{path}", files=[("no_such_field", (None, "1"))], headers=AUTH, timeout=60)
        error = r.json()["error"]
        assert r.status_code == 422 and error["code"] == "validation_error", (path, r.text)
        assert (error["field"] is not None) == (path in documented), (path, r.text)
