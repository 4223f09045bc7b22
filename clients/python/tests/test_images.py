"""Image inputs: every accepted form becomes exactly one API image object."""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clipdiff import ImageRef, image_bytes, image_id, image_input, image_sha256

PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def decoded(obj: dict[str, str]) -> bytes:
    return base64.b64decode(obj["data"])


def test_bytes_are_base64_encoded_unchanged() -> None:
    assert decoded(image_input(PNG_1PX)) == PNG_1PX
    assert decoded(image_input(bytearray(PNG_1PX))) == PNG_1PX
    assert decoded(image_input(memoryview(PNG_1PX))) == PNG_1PX


def test_paths_as_str_and_path(tmp_path: Path) -> None:
    p = tmp_path / "x.png"
    p.write_bytes(PNG_1PX)
    assert decoded(image_input(p)) == PNG_1PX
    assert decoded(image_input(str(p))) == PNG_1PX
    with pytest.raises(FileNotFoundError):
        image_input(tmp_path / "missing.png")


def test_pil_images_are_sent_as_lossless_png() -> None:
    img = Image.new("RGB", (5, 4), (10, 200, 30))
    sent = Image.open(io.BytesIO(decoded(image_input(img))))
    assert sent.format == "PNG"
    assert np.array_equal(np.asarray(sent.convert("RGB")), np.asarray(img))
    # Palette / CMYK images are converted rather than rejected.
    assert image_input(img.convert("P"))["data"]


def test_uint8_arrays_go_through_pillow() -> None:
    arr = np.zeros((3, 4, 3), dtype=np.uint8)
    arr[1, 2] = (255, 0, 0)
    sent = np.asarray(Image.open(io.BytesIO(decoded(image_input(arr)))).convert("RGB"))
    assert np.array_equal(sent, arr)


def test_references_and_prebuilt_dicts() -> None:
    digest = hashlib.sha256(b"abc").hexdigest()
    assert image_input(ImageRef.sha256(digest.upper())) == {"sha256": digest}
    assert image_input({"sha256": digest}) == {"sha256": digest}
    assert image_input({"data": "AAAA"}) == {"data": "AAAA"}
    assert image_input("https://example.org/a.png") == {"url": "https://example.org/a.png"}
    assert image_input(ImageRef.url("http://h/a.png")) == {"url": "http://h/a.png"}
    uri = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()
    assert image_input(uri) == {"data": uri}
    assert image_input(ImageRef.data(PNG_1PX)) == {"data": base64.b64encode(PNG_1PX).decode()}


@pytest.mark.parametrize(
    "bad", [{}, {"data": "x", "sha256": "y"}, {"data": 3}, {"data": "x", "extra": 1}, {"file": "a.png"}]
)
def test_bad_dicts_are_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        image_input(bad)


def test_bad_references_and_types() -> None:
    with pytest.raises(ValueError):
        ImageRef.sha256("abc")
    with pytest.raises(ValueError):
        ImageRef.url("ftp://h/a.png")
    with pytest.raises(TypeError):
        image_input(12345)
    with pytest.raises(TypeError):
        image_bytes(ImageRef.sha256("0" * 64))


def test_ids_match_the_bytes_the_server_sees() -> None:
    assert image_sha256(PNG_1PX) == hashlib.sha256(PNG_1PX).hexdigest()
    img = Image.new("RGB", (6, 6), (1, 2, 3))
    sent = decoded(image_input(img))
    assert image_id(img) == image_sha256(sent)
    assert image_id(PNG_1PX) == image_sha256(PNG_1PX)
    assert image_id({"data": base64.b64encode(PNG_1PX).decode()}) == image_sha256(PNG_1PX)
    uri = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()
    assert image_id({"data": uri}) == image_sha256(PNG_1PX)
    assert image_id(ImageRef.sha256("a" * 64)) == "a" * 64
