"""Image shapes and orientation: long thin pictures cost no more than ordinary ones (or are refused
by the aspect-ratio limit, from their header), and EXIF orientation is applied everywhere."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from clipcore.errors import ClipError, ErrorCode
from clipcore.models.preprocess import fit_square, upright
from service.images import decode_image

REPO = Path(__file__).resolve().parents[2]


def encoded(image: Image.Image, fmt: str = "PNG", **save: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return buf.getvalue()


# ----------------------------------------------------------------------------- thin images
PEAK_RSS_SCRIPT = """
import resource, sys
from PIL import Image
from clipcore.models.preprocess import fit_square
image = Image.open(sys.argv[1]); image.load()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = fit_square(image, 224)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) / 1024, out.shape)
"""


@pytest.mark.parametrize("size", [(20_000, 1), (1, 20_000), (160_000, 2)])
@pytest.mark.slow
def test_a_thin_image_is_preprocessed_without_its_upscaled_whole(size: tuple[int, int], tmp_path: Path) -> None:
    """``shortest`` resizes only the region its crop keeps: a 20000x1 picture once became a
    4.5M x 224 intermediate (3 GB) before the crop. Peak RSS growth of the preprocessing alone, in
    a fresh process (the training paths preprocess without the service's aspect limit)."""
    path = tmp_path / "thin.png"
    path.write_bytes(encoded(Image.new("RGB", size, (200, 30, 40))))
    out = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_SCRIPT, str(path)], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split(maxsplit=1)
    growth_mb, shape = float(out[0]), out[1].strip()
    assert shape == "(224, 224, 3)"
    assert growth_mb < 100, f"preprocessing a {size[0]}x{size[1]} image grew peak RSS by {growth_mb:.0f} MB"


def test_the_region_resize_matches_resize_then_crop() -> None:
    """Where both are affordable, the region resize gives the pixels of resizing the whole image and
    centre-cropping (open_clip's eval transform) within one intensity level."""
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (300, 2000, 3), dtype=np.uint8))  # 6.7:1, over the threshold
    fast = fit_square(image, 224).astype(int)
    whole = image.resize((1493, 224), Image.Resampling.BICUBIC, reducing_gap=3.0)
    left = (1493 - 224) // 2
    reference = np.asarray(whole.crop((left, 0, left + 224, 224))).astype(int)
    assert np.abs(fast - reference).max() <= 1


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P"])
@pytest.mark.parametrize("size", [(224, 224), (300, 200), (200, 300), (64, 64)])
def test_fit_square_is_convert_resize_and_centre_crop(mode: str, size: tuple[int, int]) -> None:
    """The pixels of open_clip's eval steps taken one by one (an RGB image is not converted, a
    square one not cropped: the same pixels without the copies)."""
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
    rgb = image.convert("RGB")
    scale = 64 / min(size)
    nw, nh = max(64, round(size[0] * scale)), max(64, round(size[1] * scale))
    left, top = (nw - 64) // 2, (nh - 64) // 2
    resized = rgb.resize((nw, nh), Image.Resampling.BICUBIC, reducing_gap=3.0)
    reference = np.asarray(resized.crop((left, top, left + 64, top + 64)))
    assert np.array_equal(fit_square(image, 64), reference)
    assert image.mode == mode


@pytest.mark.parametrize("size", [(160_000, 1), (1, 160_000), (1_000_000, 1), (51, 1)])
def test_decode_refuses_an_extreme_aspect_ratio_from_the_header(size: tuple[int, int]) -> None:
    with pytest.raises(ClipError, match=r"aspect ratio above the limit of 50:1 \(limits.max_aspect_ratio\)") as info:
        decode_image(encoded(Image.new("L", size)), "images.0.data", 40_000_000, min_side=224, max_aspect_ratio=50)
    assert info.value.code == ErrorCode.payload_too_large and info.value.field == "images.0.data"
    assert decode_image(encoded(Image.new("L", (50, 1))), "f", 40_000_000, max_aspect_ratio=50).size == (50, 1)


def test_the_service_refuses_thin_images_and_serves_those_within_the_limit(base_url: str) -> None:
    """A 236-byte 160000x1 PNG took 3.7 s and 3 GB on /embed; now a 413 naming the limit, on every
    image endpoint (they share one decoding path), while a 50:1 image is embedded as usual."""
    thin = base64.b64encode(encoded(Image.new("RGB", (160_000, 1)))).decode()
    assert len(base64.b64decode(thin)) < 1000
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for path, body in (
            ("/embed", {"images": [{"data": thin}]}),
            ("/classify", {"images": [{"data": thin}], "labels": ["circle", "square"]}),
            ("/rank-pair", {"image_a": {"data": thin}, "image_b": {"data": thin}, "difference": "larger"}),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 413, (path, r.text)
            error = r.json()["error"]
            assert error["code"] == "payload_too_large" and "aspect ratio" in error["message"], error
        wide = base64.b64encode(encoded(Image.new("RGB", (5000, 100), (10, 200, 30)))).decode()
        r = client.post("/embed", json={"images": [{"data": wide}]})
        assert r.status_code == 200, r.text


# ----------------------------------------------------------------------------- EXIF orientation
def sideways_photo() -> tuple[Image.Image, bytes]:
    """A picture with red on the left and blue on the right, stored rotated as a phone stores a
    portrait photo (pixels turned 90 degrees, EXIF orientation 6 to turn them back)."""
    picture = Image.new("RGB", (96, 64), (220, 20, 20))
    picture.paste((20, 20, 220), (48, 0, 96, 64))
    stored = picture.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    return picture, encoded(stored, "JPEG", quality=95, exif=exif.tobytes())


def test_decode_turns_an_image_upright_by_its_exif_orientation() -> None:
    picture, data = sideways_photo()
    decoded = decode_image(data, "f", 40_000_000)
    assert decoded.size == picture.size
    diff = np.abs(np.asarray(decoded).astype(int) - np.asarray(picture).astype(int))
    assert diff.mean() < 4, diff.mean()
    with Image.open(io.BytesIO(data)) as opened:  # the training loaders' path: the same picture
        assert np.abs(np.asarray(upright(opened).convert("RGB")).astype(int) - np.asarray(decoded)).max() <= 1


def test_decode_turns_a_reduced_large_image_upright() -> None:
    """Large images are shrunk while decoding; the orientation is read from the header first."""
    picture = Image.new("RGB", (1200, 800), (220, 20, 20))
    picture.paste((20, 20, 220), (600, 0, 1200, 800))
    exif = Image.Exif()
    exif[0x0112] = 8
    data = encoded(picture.transpose(Image.Transpose.ROTATE_270), "JPEG", exif=exif.tobytes())
    decoded = np.asarray(decode_image(data, "f", 40_000_000, min_side=64))
    assert decoded.shape[1] > decoded.shape[0]  # landscape again
    h, w, _ = decoded.shape
    assert decoded[h // 2, w // 8, 0] > 150 and decoded[h // 2, 7 * w // 8, 2] > 150  # red left, blue right


def test_the_service_embeds_the_picture_a_person_sees(base_url: str) -> None:
    """Lossless PNGs, so equal pixels give equal embeddings: the tagged picture is embedded as the
    upright one, not as its stored pixels (orientation in a PNG's eXIf chunk, as browsers read it)."""
    picture = Image.new("RGB", (96, 64), (220, 20, 20))
    picture.paste((20, 20, 220), (48, 0, 96, 64))
    picture.paste((240, 240, 240), (0, 0, 96, 12))
    stored = picture.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    images = (encoded(stored, exif=exif.tobytes()), encoded(picture), encoded(stored))
    body = {"images": [{"data": base64.b64encode(d).decode()} for d in images]}
    r = httpx.post(f"{base_url}/embed", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    tagged, seen, as_stored = (np.asarray(e) for e in r.json()["embeddings"])
    assert np.allclose(tagged, seen, atol=1e-3)
    assert not np.allclose(tagged, as_stored, atol=1e-3)
