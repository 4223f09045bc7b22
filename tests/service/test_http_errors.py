"""Every error of the API contract, through a real uvicorn server: code, status and envelope.

Documented choices asserted here: schema violations and malformed JSON are 422
``validation_error``; semantically bad input (empty lists, bad templates, undecodable data) is
400; anything over a configured limit is 413 ``payload_too_large``. Nothing here may be a 500.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image


def assert_error(r: httpx.Response, status: int, code: str, field: str | type[Any] | None = Any) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"code", "message", "field"}, err
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    if field is not Any:
        assert err["field"] == field, err
    return err


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def red(make_image: Any) -> dict[str, str]:
    return make_image("circle", "red")


def classify(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/classify", json=body)


# ----------------------------------------------------------------------------- 400
def test_bad_base64_is_400_with_field_path(client: httpx.Client, red: dict[str, str]) -> None:
    r = classify(client, images=[red, {"data": "not base64 at all!!"}], labels=["a", "b"])
    assert_error(r, 400, "bad_input", "images.1.data")


def test_of_several_bad_images_the_first_is_reported(client: httpx.Client, red: dict[str, str]) -> None:
    """Inline images are read one after the other: the error names the first bad one, as when
    they were read concurrently."""
    images = [red, {"data": "not base64 at all!!"}, {"data": "also not base64!!"}]
    r = classify(client, images=images, labels=["a", "b"])
    assert_error(r, 400, "bad_input", "images.1.data")


def test_truncated_base64_is_400(client: httpx.Client, red: dict[str, str]) -> None:
    cut = red["data"][:-3]  # no longer a multiple of 4: a padding error
    r = classify(client, images=[{"data": cut}], labels=["a", "b"])
    assert_error(r, 400, "bad_input", "images.0.data")


def test_truncated_image_is_400_bad_image(client: httpx.Client) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(buf, "JPEG")
    data = buf.getvalue()[: len(buf.getvalue()) // 2]
    r = classify(client, images=[{"data": base64.b64encode(data).decode()}], labels=["a", "b"])
    assert_error(r, 400, "bad_image", "images.0.data")


@pytest.mark.parametrize("payload", [b"hello world, not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 20, b"%PDF-1.4\n"])
def test_non_image_bytes_are_400_bad_image(client: httpx.Client, payload: bytes) -> None:
    r = classify(client, images=[{"data": base64.b64encode(payload).decode()}], labels=["a", "b"])
    assert_error(r, 400, "bad_image", "images.0.data")


def test_unsupported_format_is_400(client: httpx.Client) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, "TIFF")
    r = classify(client, images=[{"data": base64.b64encode(buf.getvalue()).decode()}], labels=["a", "b"])
    assert_error(r, 400, "bad_image", "images.0.data")


def test_data_uri_must_be_base64(client: httpx.Client) -> None:
    r = classify(client, images=[{"data": "data:image/png,rawbytes"}], labels=["a", "b"])
    assert_error(r, 400, "bad_input", "images.0.data")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"templates": ["a photo"]}, "templates.0"),
        ({"templates": ["a {} and a {}"]}, "templates.0"),
        ({"templates": []}, "templates"),
        ({"labels": []}, "labels"),
        ({"labels": ["only one"]}, "labels"),
        ({"labels": ["a", "a"]}, "labels.1"),
        ({"labels": ["a", "  "]}, "labels.1"),
        ({"images": []}, "images"),
        ({"descriptions": {"zebra": ["striped"]}}, "descriptions.zebra"),
        ({"descriptions": {"a": [""]}}, "descriptions.a.0"),
        ({"encoder": "nope"}, "encoder"),
        ({"comparatives": [{"a": "a", "b": "b", "text": "x"}]}, "comparatives"),  # without ?comparative=true
    ],
)
def test_bad_classify_input_is_400(client: httpx.Client, red: dict[str, str], body: dict[str, Any], field: str) -> None:
    r = classify(client, **{"images": [red], "labels": ["a", "b"], **body})
    assert_error(r, 400, "bad_input", field)


def test_comparative_label_not_in_labels_is_400(client: httpx.Client, red: dict[str, str]) -> None:
    body = {"images": [red], "labels": ["a", "b"], "comparatives": [{"a": "a", "b": "zebra", "text": "x"}]}
    r = client.post("/classify", params={"comparative": "true"}, json=body)
    assert_error(r, 400, "bad_input", "comparatives.0.b")


def test_empty_lists_elsewhere_are_400(client: httpx.Client, red: dict[str, str]) -> None:
    assert_error(client.post("/embed", json={"texts": []}), 400, "bad_input", "texts")
    assert_error(client.post("/embed", json={"images": []}), 400, "bad_input", "images")
    assert_error(client.post("/rank", json={"images": [red], "difference": "x"}), 400, "bad_input", "images")
    assert_error(client.post("/rank-pair", json={"pairs": []}), 400, "bad_input", "pairs")
    assert_error(client.post("/rank", json={"images": [red, red], "difference": " "}), 400, "bad_input", "difference")


LONE = "\ud800"  # JSON may carry "\\ud800" alone; such a string has no UTF-8 form


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/embed", {"texts": ["a", f"red {LONE} circle"]}, "texts.1"),
        ("/classify", {"labels": ["a", LONE]}, "labels.1"),
        ("/classify", {"labels": ["a", "b"], "templates": [LONE + " {}"]}, "templates.0"),
        ("/classify", {"labels": ["a", "b"], "descriptions": {"a": [LONE]}}, "descriptions.a.0"),
        ("/classify", {"labels": ["a", "b"], "descriptions": {LONE: ["x"]}}, "descriptions.\\ud800"),
        ("/rank-pair", {"difference": LONE}, "difference"),
        ("/rank", {"difference": LONE}, "difference"),
        ("/score/dense", {"texts": [LONE]}, "texts.0"),
        ("/score/dense/heatmap", {"text": "two\nlines " + LONE}, "text"),
    ],
)
def test_a_lone_surrogate_in_any_text_is_400_not_500(
    client: httpx.Client, red: dict[str, str], path: str, body: dict[str, Any], field: str
) -> None:
    images = {"images": [red]} if path == "/classify" else {"images": [red, red]} if path == "/rank" else {}
    if path == "/rank-pair":
        images = {"image_a": red, "image_b": red}
    if path.startswith("/score/dense"):
        images = {"image": red}
    raw = json.dumps({**images, **body})  # ASCII with \\u escapes (httpx's own encoding refuses)
    r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    err = assert_error(r, 400, "bad_input", field)
    assert LONE not in err["message"]


def test_urls_disabled_by_default(client: httpx.Client) -> None:
    r = client.post("/embed", json={"images": [{"url": "https://example.com/cat.png"}]})
    assert_error(r, 400, "urls_disabled", "images.0.url")


# ----------------------------------------------------------------------------- 404 / 405
def test_unknown_model_is_404(client: httpx.Client, red: dict[str, str]) -> None:
    for name in ("other", "tiny@v999", "tiny@staging"):
        assert_error(classify(client, images=[red], labels=["a", "b"], model=name), 404, "unknown_model", "model")
    assert classify(client, images=[red], labels=["a", "b"], model="tiny@v1").status_code == 200
    assert classify(client, images=[red], labels=["a", "b"], model="tiny@production").status_code == 200
    assert classify(client, images=[red], labels=["a", "b"], model="tiny").status_code == 200
    assert_error(client.get("/models/nope"), 404, "unknown_model")
    assert client.get("/models/..%2Fetc").status_code == 404


def test_unknown_sha256_image_is_404(client: httpx.Client) -> None:
    r = client.post("/rank", json={"images": [{"sha256": "0" * 64}, {"sha256": "f" * 64}], "difference": "x"})
    assert_error(r, 404, "unknown_image", "images.0.sha256")


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert_error(client.get("/nope"), 404, "not_found", None)
    assert_error(client.post("/score/nothing", json={}), 404, "not_found", None)
    r = client.get("/classify")
    assert_error(r, 405, "method_not_allowed", None)
    assert "POST" in r.headers.get("allow", "")


# ----------------------------------------------------------------------------- 422
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"labels": "a,b"}, "labels"),
        ({"labels": ["a", 3]}, "labels.1"),
        ({"top_k": "five"}, "top_k"),
        ({"top_k": 0}, "top_k"),
        ({"alpha": 1.5}, "alpha"),
        ({"gate_margin": -0.1}, "gate_margin"),
        ({"lables": ["a", "b"]}, "lables"),
        ({"images": [{"data": "eA==", "sha256": "0" * 64}]}, "images.0"),
        ({"images": [{}]}, "images.0"),
        ({"images": [{"sha256": "xyz"}]}, "images.0.sha256"),
        ({"images": [{"data": "eA==", "extra": 1}]}, "images.0.extra"),
        ({"images": "abc"}, "images"),
        # JSON's types as they are: no string for a number, no number for a boolean
        ({"top_k": "3"}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"alpha": "0.5"}, "alpha"),
        ({"symmetric": 1}, "symmetric"),
        ({"symmetric": "true"}, "symmetric"),
    ],
)
def test_schema_violations_are_422(client: httpx.Client, red: dict[str, str], body: dict[str, Any], field: str) -> None:
    r = classify(client, **{"images": [red], "labels": ["a", "b"], **body})
    assert_error(r, 422, "validation_error", field)


@pytest.mark.parametrize("field", ["gate_margin", "alpha"])
@pytest.mark.parametrize("literal", ["1e999", "-1e999", "Infinity", "-Infinity", "NaN"])
def test_non_finite_numbers_are_422_naming_the_field(
    client: httpx.Client, red: dict[str, str], field: str, literal: str
) -> None:
    # Python's JSON parser reads these as inf / nan (httpx would not send them, hence raw text).
    # The labels match a comparative of the model's library, so the gate runs: an infinite
    # gate_margin used to reach it and fail there (500).
    body = {"images": [red], "labels": ["red circle", "blue circle"]}
    raw = json.dumps(body)[:-1] + f', "{field}": {literal}}}'
    headers = {"Content-Type": "application/json"}
    r = client.post("/classify", params={"comparative": "true"}, content=raw, headers=headers)
    assert_error(r, 422, "validation_error", field)


def test_every_float_field_of_every_request_model_refuses_non_finite_values() -> None:
    import typing

    from pydantic import BaseModel, ValidationError

    from service.api import openai_schemas, schemas

    def holds_float(annotation: Any) -> bool:
        return annotation is float or any(holds_float(a) for a in typing.get_args(annotation))

    models = [
        m
        for mod in (schemas, openai_schemas)
        for m in vars(mod).values()
        if isinstance(m, type) and issubclass(m, BaseModel) and m.model_config.get("extra") == "forbid"
    ]
    checked = 0
    for model in models:
        for name, info in model.model_fields.items():
            if not holds_float(info.annotation):
                continue
            for value in (float("inf"), float("-inf"), float("nan")):
                with pytest.raises(ValidationError) as caught:
                    model.model_validate({name: value})
                assert any(e["loc"] == (name,) and e["type"] == "finite_number" for e in caught.value.errors()), (
                    model.__name__, name, caught.value.errors())  # fmt: skip
            checked += 1
    assert checked >= 2  # alpha and gate_margin of /classify at least


def test_missing_fields_and_bad_query_are_422(client: httpx.Client, red: dict[str, str]) -> None:
    assert_error(client.post("/classify", json={"labels": ["a", "b"]}), 422, "validation_error", "images")
    r = client.post("/classify", params={"comparative": "maybe"}, json={"images": [red], "labels": ["a", "b"]})
    assert_error(r, 422, "validation_error", "query.comparative")
    assert_error(client.post("/classify", json=[1, 2]), 422, "validation_error")
    assert_error(client.post("/classify"), 422, "validation_error")


@pytest.mark.parametrize("raw", [b"{not json", b'{"images": [', b"\xff\xfe", b'{"a": 1,}'])
def test_malformed_json_is_422_without_field(client: httpx.Client, raw: bytes) -> None:
    r = client.post("/classify", content=raw, headers={"content-type": "application/json"})
    err = assert_error(r, 422, "validation_error", None)
    assert "JSON" in err["message"]


def test_one_of_forms(client: httpx.Client, red: dict[str, str]) -> None:
    both = {"image_a": red, "image_b": red, "difference": "x", "pairs": []}
    assert_error(client.post("/rank-pair", json=both), 422, "validation_error")
    assert_error(client.post("/rank-pair", json={"image_a": red}), 422, "validation_error")
    assert_error(client.post("/embed", json={"texts": ["a"], "images": [red]}), 422, "validation_error")
    assert_error(client.post("/embed", json={}), 422, "validation_error")
    assert_error(client.post("/embed", json={"images": [red], "encoder": "base"}), 422, "validation_error")


# ----------------------------------------------------------------------------- 413
def test_decompression_bomb_png_is_413_and_fast(client: httpx.Client) -> None:
    buf = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buf, "PNG")  # 400 megapixels in a few KB
    assert len(buf.getvalue()) < 200_000
    data = base64.b64encode(buf.getvalue()).decode()
    r = classify(client, images=[{"data": data}], labels=["a", "b"])
    assert_error(r, 413, "payload_too_large", "images.0.data")
    assert r.elapsed.total_seconds() < 5


def test_too_many_labels_is_413_not_500(client: httpx.Client, red: dict[str, str]) -> None:
    labels = [f"label {i}" for i in range(1001)]
    assert_error(classify(client, images=[red], labels=labels), 413, "payload_too_large", "labels")


def test_huge_label_count_is_refused(client: httpx.Client, red: dict[str, str]) -> None:
    labels = [f"l{i}" for i in range(100_000)]  # ~1 MB of JSON, under the body cap
    r = classify(client, images=[red], labels=labels)
    assert 400 <= r.status_code < 500
    assert_error(r, 413, "payload_too_large", "labels")


def test_every_error_counted_no_500(client: httpx.Client) -> None:
    text = client.get("/metrics").text
    assert re.search(r'clip_http_requests_total\{[^}]*status="4\d\d"', text)
    five = [line for line in text.splitlines() if re.match(r'clip_http_requests_total\{[^}]*status="50[0-2]"', line)]
    assert not five, five


# ----------------------------------------------------------------------------- small limits
@pytest.fixture(scope="module")
def small(serve_app: Any, tiny_store: Any) -> Iterator[httpx.Client]:
    limits = {
        "max_body_bytes": 64_000,
        "max_image_bytes": 20_000,
        "max_images": 3,
        "max_labels": 4,
        "max_texts": 3,
        "max_text_chars": 50,
        "max_pixels": 200 * 200,
        "max_pairs": 2,
    }
    with (
        serve_app(store=str(tiny_store), model="tiny@production", limits=limits) as running,
        httpx.Client(base_url=running.url, timeout=30) as c,
    ):
        yield c


def test_body_over_content_length_is_413(small: httpx.Client) -> None:
    r = small.post("/embed", content=b"x" * 70_000, headers={"content-type": "application/json"})
    assert_error(r, 413, "payload_too_large", None)


def test_streamed_body_over_limit_is_413(small: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"texts": ["'
        for _ in range(100):
            yield b"a" * 1000
        yield b'"]}'

    r = small.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "payload_too_large", None)


def test_limits_are_413_with_field(small: httpx.Client, make_image: Any) -> None:
    img = make_image("circle", "red", px=64)
    big = Image.effect_noise((100, 100), 80).convert("RGB")
    buf = io.BytesIO()
    big.save(buf, "PNG")
    assert 20_000 < len(buf.getvalue()) < 45_000
    big_data = {"data": base64.b64encode(buf.getvalue()).decode()}
    cases = [
        ("/embed", {"images": [big_data]}, "images.0.data"),
        ("/embed", {"images": [img] * 4}, "images"),
        ("/embed", {"texts": ["a"] * 4}, "texts"),
        ("/embed", {"texts": ["x" * 51]}, "texts.0"),
        ("/classify", {"images": [img], "labels": ["a", "b", "c", "d", "e"]}, "labels"),
        ("/rank-pair", {"pairs": [{"image_a": img, "image_b": img, "difference": "x"}] * 3}, "pairs"),
    ]
    for path, body, field in cases:
        assert_error(small.post(path, json=body), 413, "payload_too_large", field)
    many = Image.new("RGB", (300, 300), (255, 255, 255))
    buf = io.BytesIO()
    many.save(buf, "PNG")
    r = small.post("/embed", json={"images": [{"data": base64.b64encode(buf.getvalue()).decode()}]})
    assert_error(r, 413, "payload_too_large", "images.0.data")


def test_deeply_nested_json_is_a_422_like_any_invalid_body(base_url: str) -> None:
    for body in ("[" * 100_000 + "]" * 100_000, '{"texts": ' + "[" * 5000 + "]" * 5000 + "}"):
        r = httpx.post(f"{base_url}/embed", content=body, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", r.text


def test_the_contract_states_list_minimums_and_one_image_form(base_url: str) -> None:
    schemas = httpx.get(f"{base_url}/openapi.json").json()["components"]["schemas"]
    assert schemas["ClassifyRequest"]["properties"]["labels"]["minItems"] == 2
    assert schemas["RankRequest"]["properties"]["images"]["minItems"] == 2
    assert schemas["DenseRequest"]["properties"]["texts"]["minItems"] == 1
    # Exactly one of data, url or sha256, given (not null): the others left out or null.
    assert schemas["ImageInput"]["oneOf"] == [
        {"required": [given], "properties": {k: {"type": "string" if k == given else "null"} for k in keys}}
        for given, keys in [(k, ["data", "url", "sha256"]) for k in ("data", "url", "sha256")]
    ]
    # What the contract states is what the server enforces (400 with the field, as documented).
    r = httpx.post(f"{base_url}/classify", json={"images": [], "labels": ["a", "b"]})
    assert r.status_code == 400 and r.json()["error"]["field"] == "images"


def test_a_long_model_name_is_echoed_cut(client: httpx.Client) -> None:
    """A 100 KB name must not come back as a 100 KB 404."""
    name = "m" * 100_000
    r = client.post("/embed", json={"texts": ["a red circle"], "model": name})
    assert r.status_code == 404, r.text
    message = r.json()["error"]["message"]
    assert "(100,000 characters)" in message and len(r.content) < 2_000, len(r.content)
    r = client.get(f"/models/{'n' * 5_000}")
    assert r.status_code == 404, r.text
    assert "(5,000 characters)" in r.json()["error"]["message"] and len(r.content) < 2_000
