"""The engine's side of ``workers`` > 1, in one process: the real application behind ``EngineGate``
under uvicorn, sent bodies as a front-end packs them (``service.split.wire``)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from clipcore.models.preprocess import fit_square
from loadtests.local_stack import metric_value
from service.images import decode_image
from service.split.engine import EngineGate
from service.split.wire import FRONT_END_HEADER, GENERATION_HEADER, PREDECODED_HEADER, SPECS_PATH, pack


@pytest.fixture(scope="module")
def gated(tiny_store: Path, serve_app: Any) -> Iterator[Any]:
    with serve_app(
        store=str(tiny_store), model="tiny@production", wrap=lambda app: EngineGate(app, app.state.services.models)
    ) as running:
        yield running


def _jpeg(seed: int) -> bytes:
    pixels = (np.random.default_rng(seed).random((80, 120, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def _table(gated: Any) -> httpx.Response:
    return httpx.get(f"{gated.url}{SPECS_PATH}", headers={FRONT_END_HEADER: "1"})


def _packed(raw: bytes, spec: str, pixels: np.ndarray) -> tuple[bytes, dict[str, str]]:
    digest = hashlib.sha256(raw).hexdigest()
    body, manifest_length = pack(f'{{"images":[{{"sha256":"{digest}"}}]}}'.encode(), {digest: (raw, spec, pixels)})
    return body, {PREDECODED_HEADER: str(manifest_length), "content-type": "application/json"}


def test_the_table_names_the_served_spec_and_every_answer_its_digest(gated: Any) -> None:
    assert httpx.get(f"{gated.url}{SPECS_PATH}").status_code == 404  # not without the front-end's header
    r = _table(gated)
    assert r.status_code == 200
    table = r.json()
    assert table["specs"] == [table["default"]] and table["default"].endswith("/bicubic/shortest")
    assert httpx.get(f"{gated.url}/healthz").headers[GENERATION_HEADER] == r.headers[GENERATION_HEADER]


def test_pixels_of_the_serving_spec_are_used_and_answer_as_the_bytes_do(gated: Any) -> None:
    raw = _jpeg(1)
    spec = _table(gated).json()["default"]
    side = int(spec.split("/")[0])
    pixels = fit_square(decode_image(raw, "image", 10**8, min_side=side), side)
    used = metric_value(gated.url, "clip_predecoded_images_total", outcome="used")
    decoded = metric_value(gated.url, "clip_images_decoded_total")
    body, headers = _packed(raw, spec, pixels)
    r = httpx.post(f"{gated.url}/embed", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert metric_value(gated.url, "clip_predecoded_images_total", outcome="used") == used + 1
    assert metric_value(gated.url, "clip_images_decoded_total") == decoded  # nothing decoded again
    plain = httpx.post(f"{gated.url}/embed", json={"images": [{"data": base64.b64encode(raw).decode()}]})
    assert plain.json()["embeddings"] == r.json()["embeddings"]  # the cache entry the pixels made


def test_pixels_of_another_spec_are_decoded_again_from_the_bytes(gated: Any) -> None:
    raw = _jpeg(2)
    spec = _table(gated).json()["default"]
    side = int(spec.split("/")[0])
    other = spec.replace("shortest", "squash")
    wrong = np.zeros((side, side, 3), np.uint8)  # what a version with other preprocessing would get
    stale = metric_value(gated.url, "clip_predecoded_images_total", outcome="stale")
    body, headers = _packed(raw, other, wrong)
    r = httpx.post(f"{gated.url}/embed", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert metric_value(gated.url, "clip_predecoded_images_total", outcome="stale") == stale + 1
    blank = _packed(_jpeg(3), spec, wrong)
    from_blank = httpx.post(f"{gated.url}/embed", content=blank[0], headers=blank[1]).json()["embeddings"]
    assert r.json()["embeddings"] != from_blank  # the zeros were not what got encoded


def test_a_body_that_does_not_add_up_is_refused(gated: Any) -> None:
    raw = _jpeg(4)
    body, headers = _packed(raw, "64/bicubic/shortest", np.zeros((64, 64, 3), np.uint8))
    r = httpx.post(f"{gated.url}/embed", content=body[:-10], headers=headers)
    assert r.status_code == 500 and "does not add up" in r.text


def test_a_pre_decoded_answer_is_the_bytes_and_headers_of_the_usual_path(gated: Any) -> None:
    raw = _jpeg(5)
    spec = _table(gated).json()["default"]
    side = int(spec.split("/")[0])
    pixels = fit_square(decode_image(raw, "image", 10**8, min_side=side), side)
    plain = httpx.post(f"{gated.url}/embed", json={"images": [{"data": base64.b64encode(raw).decode()}]})
    ok_embed = {"route": "/embed", "method": "POST", "status": "200"}
    answered = metric_value(gated.url, "clip_http_requests_total", **ok_embed)
    body, headers = _packed(raw, spec, pixels)
    direct = httpx.post(f"{gated.url}/embed", content=body, headers=headers)  # the cache entry plain made
    assert direct.status_code == 200 and direct.content == plain.content
    skip = {"date", "x-queue-time", "x-inference-time"}  # no batch ran for a cached image
    assert [(k, v) for k, v in direct.headers.items() if k not in skip] == [
        (k, v) for k, v in plain.headers.items() if k not in skip
    ]
    # counted on its route as any answer (the metrics and the access log are the middleware's)
    assert metric_value(gated.url, "clip_http_requests_total", **ok_embed) == answered + 1


def test_a_pre_decoded_request_that_does_not_validate_gets_fastapis_answer(gated: Any) -> None:
    raw = _jpeg(6)
    digest = hashlib.sha256(raw).hexdigest()
    spec = _table(gated).json()["default"]
    side = int(spec.split("/")[0])
    for request in (
        {"images": [{"sha256": digest}], "encoding_format": "hex"},  # 422 from FastAPI's validation
        {"images": [{"sha256": digest}], "model": "nosuch"},  # 404 from the route (a ClipError)
        {"images": [{"sha256": digest}], "texts": ["both"]},  # 422 from the request model
    ):
        request_json = json.dumps(request).encode()
        body, manifest_length = pack(request_json, {digest: (raw, spec, np.zeros((side, side, 3), np.uint8))})
        headers = {PREDECODED_HEADER: str(manifest_length), "content-type": "application/json"}
        direct = httpx.post(f"{gated.url}/embed", content=body, headers=headers)
        plain_request = {**request, "images": [{"data": base64.b64encode(raw).decode()}]}
        plain = httpx.post(f"{gated.url}/embed", json=plain_request)
        assert direct.status_code == plain.status_code and direct.status_code in (404, 422), direct.text
        assert direct.json() == plain.json()


def test_the_hot_routes_take_the_short_way_and_only_they() -> None:
    from service.api.direct_routes import DIRECT_PATHS, direct_route
    from service.api.routes import classify, dense, embed, models, rank

    routes = [route for module in (classify, dense, embed, models, rank) for route in module.router.routes]
    taken = {route.path for route in routes if direct_route(route) is not None}  # type: ignore[attr-defined]
    assert taken == DIRECT_PATHS  # a signature the short way cannot call would fall out of it here
    assert "/score/dense/heatmap" not in taken


def test_pixels_from_a_front_ends_shared_memory_answer_as_inline_ones(gated: Any) -> None:
    from service.split.pixel_ring import PixelRing

    raw = _jpeg(7)
    spec = _table(gated).json()["default"]
    side = int(spec.split("/")[0])
    pixels = fit_square(decode_image(raw, "image", 10**8, min_side=side), side)
    digest = hashlib.sha256(raw).hexdigest()
    ring = PixelRing(size=1024 * 1024)
    try:
        lease = ring.lease(pixels.nbytes)
        assert lease is not None
        body, manifest_length = pack(
            f'{{"images":[{{"sha256":"{digest}"}}]}}'.encode(), {digest: (raw, spec, pixels)}, lease
        )
        headers = {PREDECODED_HEADER: str(manifest_length), "content-type": "application/json"}
        used = metric_value(gated.url, "clip_predecoded_images_total", outcome="used")
        shared = httpx.post(f"{gated.url}/embed", content=body, headers=headers)
        lease.release()
        assert shared.status_code == 200, shared.text
        assert metric_value(gated.url, "clip_predecoded_images_total", outcome="used") == used + 1
        inline = httpx.post(f"{gated.url}/embed", json={"images": [{"data": base64.b64encode(raw).decode()}]})
        assert inline.json()["embeddings"] == shared.json()["embeddings"]  # the cache entry the shared pixels made
        forged = json.dumps({**json.loads(body[:manifest_length]), "shared": ["clip-pixels-1-ab", 0]}).encode()
        refused = httpx.post(
            f"{gated.url}/embed",
            content=forged + body[manifest_length:],
            headers={**headers, PREDECODED_HEADER: str(len(forged))},
        )
        assert refused.status_code == 500 and "does not add up" in refused.text  # no such ring
    finally:
        ring.close()
