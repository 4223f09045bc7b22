"""Pixels by shared memory (``service.split.pixel_ring``): a front-end's ring, the engine's read,
and the body that names them (``service.split.wire``), on real POSIX shared memory."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.config import Settings
from service.split.pixel_ring import MIN_SHARED_BYTES, PixelRing, SharedPixels
from service.split.predecode import rewrite
from service.split.wire import MalformedFrame, pack, unpack

if not Path("/dev/shm").is_dir():
    pytest.skip("no POSIX shared memory at /dev/shm", allow_module_level=True)


@pytest.fixture
def ring() -> Iterator[PixelRing]:
    opened = PixelRing(size=1024 * 1024)
    yield opened
    opened.close()


def _jpeg(seed: int, size: tuple[int, int] = (300, 260)) -> bytes:
    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def test_leases_take_the_first_gap_and_a_full_ring_says_so(ring: PixelRing) -> None:
    a, b, c = ring.lease(400_000), ring.lease(400_000), ring.lease(400_000)
    assert a is not None and b is not None and c is None  # 1 MiB holds two
    assert (a.offset, b.offset) == (0, 400_000)
    a.release()
    small = ring.lease(100_000)
    assert small is not None and small.offset == 0  # the freed gap first
    assert ring.leased_bytes == 500_000
    small.release()
    b.release()
    assert ring.leased_bytes == 0


def test_large_pixels_go_through_the_ring_and_unpack_as_inline_ones(ring: PixelRing) -> None:
    table = {"default": "224/bicubic/shortest", "specs": ["224/bicubic/shortest"]}
    raws = [_jpeg(1), _jpeg(2)]
    body = json.dumps({"images": [{"data": base64.b64encode(r).decode()} for r in raws]}).encode()
    inline = rewrite("/embed", body, table, Settings())
    shared = rewrite("/embed", body, table, Settings(), ring)
    assert inline is not None and shared is not None and inline.shared is None
    assert shared.shared is not None and ring.leased_bytes == 2 * 224 * 224 * 3
    assert len(shared.body) == len(inline.body) - 2 * 224 * 224 * 3 + shared.manifest_length - inline.manifest_length
    json_a, images_a = unpack(inline.body, inline.manifest_length)
    json_b, images_b = unpack(shared.body, shared.manifest_length, SharedPixels())
    assert json_a == json_b and list(images_a) == list(images_b)
    for digest, image in images_a.items():
        assert images_b[digest].raw == image.raw and np.array_equal(images_b[digest].pixels, image.pixels)
    shared.shared.release()
    # what the engine unpacked is its own copy: a front-end reusing the region changes nothing
    again = ring.lease(2 * 224 * 224 * 3)
    assert again is not None and again.offset == 0
    again.view[:] = b"\0" * again.size
    assert all(np.array_equal(images_b[d].pixels, images_a[d].pixels) for d in images_a)
    again.release()


def test_small_pixels_stay_inline(ring: PixelRing) -> None:
    table = {"default": "64/bicubic/shortest", "specs": ["64/bicubic/shortest"]}
    body = json.dumps({"images": [{"data": base64.b64encode(_jpeg(3)).decode()}]}).encode()
    result = rewrite("/embed", body, table, Settings(), ring)
    assert 64 * 64 * 3 < MIN_SHARED_BYTES
    assert result is not None and result.shared is None and ring.leased_bytes == 0


def test_the_engine_reads_only_rings_and_only_within_them(ring: PixelRing, tmp_path: Path) -> None:
    raw = _jpeg(4)
    digest = hashlib.sha256(raw).hexdigest()
    lease = ring.lease(224 * 224 * 3)
    assert lease is not None
    images = {digest: (raw, "224/bicubic/shortest", np.zeros((224, 224, 3), np.uint8))}
    body, manifest_length = pack(b'{"images":[]}', images, lease)
    assert unpack(body, manifest_length, SharedPixels())[1][digest].pixels.shape == (224, 224, 3)
    with pytest.raises(MalformedFrame, match="no reader"):
        unpack(body, manifest_length)
    manifest = json.loads(body[:manifest_length])
    for name, offset in (("../etc/passwd", 0), (ring.name, ring.size - 10), (ring.name + "0", 0)):
        forged = json.dumps({**manifest, "shared": [name, offset]}).encode()
        with pytest.raises(MalformedFrame):
            unpack(forged + body[manifest_length:], len(forged), SharedPixels())
    lease.release()


def test_a_ring_closed_with_a_lease_still_out_is_gone_all_the_same() -> None:
    ring = PixelRing(size=1024 * 1024)
    lease = ring.lease(1000)  # kept, as by a relay a shutdown cancelled
    assert lease is not None and (Path("/dev/shm") / ring.name).exists()
    ring.close()
    assert not (Path("/dev/shm") / ring.name).exists()
    lease.view.release()  # as the process's exit would: the mapping can go now
