"""The front-end's decisions (``workers`` > 1): which bodies it decodes, what it hands on, how many
processes ``auto`` makes. The processes themselves: tests/service/test_workers.py."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from clipcore.models.preprocess import fit_square
from service.config import Settings
from service.images import decode_image
from service.split.predecode import choose_spec, rewrite
from service.split.supervisor import engine_threads, workers_for
from service.split.wire import MalformedFrame, unpack

SPEC = "64/bicubic/shortest"
TABLE = {"default": SPEC, "specs": [SPEC]}


def _png(colour: tuple[int, int, int] = (200, 10, 10), size: tuple[int, int] = (90, 70)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_data_images_become_digests_with_the_pixels_the_engine_would_make() -> None:
    red, blue = _png(), _png((0, 0, 250), (40, 300))
    body = json.dumps({"images": [{"data": _b64(red)}, {"data": _b64(blue)}, {"data": _b64(red)}]}).encode()
    result = rewrite("/embed", body, TABLE, Settings())
    assert result is not None
    assert result.images == 3 and result.shared is None  # no ring given
    request_json, images = unpack(result.body, result.manifest_length)
    digests = [hashlib.sha256(raw).hexdigest() for raw in (red, blue, red)]
    assert json.loads(request_json) == {"images": [{"sha256": d} for d in digests]}
    assert list(images) == digests[:2]  # each distinct image once
    for raw in (red, blue):
        entry = images[hashlib.sha256(raw).hexdigest()]
        assert entry.raw == raw and entry.spec == SPEC
        assert np.array_equal(entry.pixels, fit_square(decode_image(raw, "x", 10**8, min_side=64), 64))


def test_pairs_and_single_images_are_found_where_their_routes_put_them() -> None:
    image = {"data": _b64(_png())}
    pair = {"image_a": image, "image_b": {"url": "http://example.com/x.png"}, "difference": "d"}
    result = rewrite("/rank-pair", json.dumps({"pairs": [pair]}).encode(), TABLE, Settings())
    assert result is not None and result.images == 1  # the URL stays for the engine to fetch
    dense = rewrite("/score/dense", json.dumps({"image": image, "texts": ["t"]}).encode(), TABLE, Settings())
    assert dense is not None and dense.images == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"images": [{"data": _b64(_png())}, {"data": "bm90IGJhc2U2NA!!"}]}),  # one malformed: all as sent
        ("/embed", {"images": [{"data": _b64(b"not an image")}]}),
        ("/embed", {"images": [{"data": _b64(_png()), "sha256": "0" * 64}]}),  # not one image object
        ("/embed", {"texts": ["no images"]}),
        ("/score/dense/heatmap", {"image": {"data": _b64(_png())}, "text": "t"}),  # draws the picture itself
        ("/embed", [1, 2]),
    ],
)
def test_anything_off_goes_to_the_engine_as_sent(path: str, body: object) -> None:
    assert rewrite(path, json.dumps(body).encode(), TABLE, Settings()) is None


def test_more_images_than_a_request_may_carry_are_not_decoded() -> None:
    body = json.dumps({"images": [{"data": _b64(_png())}] * 3}).encode()
    assert rewrite("/embed", body, TABLE, Settings(limits={"max_images": 2})) is None


def test_the_spec_is_the_shared_one_or_the_default_for_a_request_without_model() -> None:
    two = {"default": SPEC, "specs": [SPEC, "224/bicubic/shortest"]}
    assert choose_spec(two, {}) == SPEC
    assert choose_spec(two, {"model": "other"}) is None
    assert choose_spec(TABLE, {"model": "other"}) == SPEC
    assert choose_spec(None, {}) is None


def test_a_truncated_frame_is_refused() -> None:
    body = json.dumps({"images": [{"data": _b64(_png())}]}).encode()
    result = rewrite("/embed", body, TABLE, Settings())
    assert result is not None
    with pytest.raises(MalformedFrame):
        unpack(result.body[:-1], result.manifest_length)


def test_auto_workers_and_the_engine_threads_never_exceed_the_cores() -> None:
    cpu = Settings(workers="auto")
    assert workers_for(cpu, available=2) == 1  # a small CPU node: one process
    assert workers_for(cpu, available=16) == 4
    assert workers_for(cpu, available=64) == 8
    assert workers_for(Settings(workers="auto", device="cuda"), available=16) == 8
    assert workers_for(Settings(workers=3), available=2) == 3  # asked for: as asked
    for available in (2, 8, 16, 64):
        n = workers_for(cpu, available=available)
        threads = engine_threads(cpu, n, available=available)
        assert threads is not None and (n == 1 or threads + n <= available)
    assert engine_threads(Settings(torch_threads=2), 4, available=16) is None  # set: kept


def test_a_front_end_imports_no_model_code() -> None:
    script = (
        "import sys, service.split.frontend, service.split.supervisor\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'open_clip', 'fastapi')))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
