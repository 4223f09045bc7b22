"""What a front-end hands the engine besides a request: the images it already decoded.

A rewritten request body is ``manifest + request JSON + per image (its bytes, then its pixels)``,
or, where the manifest names a front-end's shared memory ring and an offset
(``service.split.pixel_ring``), ``manifest + request JSON + per image its bytes``, the pixels one
after another in the ring; the ``x-clip-predecoded`` header carries the manifest's length. In the request JSON each
pre-decoded image object ``{"data": ...}`` became ``{"sha256": ...}`` of its bytes, the key the
pipeline caches it under; the engine's pipeline finds the bytes and pixels by that digest
(``PREDECODED``), uses the pixels when they were made under the preprocessing of the version that
serves the request (``spec``) and decodes the bytes otherwise. Only the engine's private socket
takes the header: front-ends drop it from client requests, and a single process never reads it.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from service.split.pixel_ring import PixelLease, SharedPixels

PREDECODED_HEADER = "x-clip-predecoded"
# Every engine answer says which preprocessing its loaded versions use (a digest of the table at
# SPECS_PATH): a front-end re-reads the table when it changes (a hot swap, a load, an unload).
GENERATION_HEADER = "x-clip-preprocessing"
SPECS_PATH = "/_engine/preprocessing"
# Only a front-end's own call reads the table (front-ends drop this header from clients): to a
# client the path is as unknown as on a single process.
FRONT_END_HEADER = "x-clip-front-end"


@dataclass(frozen=True)
class Predecoded:
    """One image as a front-end read it: its bytes and its model-input pixels under ``spec``."""

    raw: bytes
    spec: str
    pixels: np.ndarray  # (S, S, 3) uint8, read-only (a view of the request body)


PREDECODED: ContextVar[dict[str, Predecoded] | None] = ContextVar("predecoded", default=None)


def spec_key(image_size: int, interpolation: str, resize_mode: str) -> str:
    """What model-input pixels depend on (mean and std apply later, on the engine)."""
    return f"{image_size}/{interpolation}/{resize_mode}"


def bundle_spec(bundle: Any) -> str:
    """The spec of a loaded version (a ``clipcore`` bundle)."""
    config = bundle.preprocess_config
    return spec_key(bundle.image_size, config.interpolation, config.resize_mode)


def spec_side(spec: str) -> int:
    return int(spec.split("/", 1)[0])


class MalformedFrame(ValueError):
    """A rewritten body that does not add up (never from a working front-end)."""


def pixel_bytes(images: dict[str, tuple[bytes, str, np.ndarray]]) -> int:
    """What the pixels of ``images`` take, in the body or in a shared ring (``pack``'s ``shared``)."""
    return sum(spec_side(spec) ** 2 * 3 for _, spec, _ in images.values())


def pack(
    request_json: bytes, images: dict[str, tuple[bytes, str, np.ndarray]], shared: PixelLease | None = None
) -> tuple[bytes, int]:
    """The body and the manifest length for ``images`` (sha256 -> bytes, spec, pixels); with
    ``shared`` (``pixel_bytes(images)`` bytes of a front-end's ring) the pixels go there, one
    after another, and the manifest names the ring and the offset instead."""
    head: dict[str, Any] = {
        "json": len(request_json),
        "images": [{"sha256": d, "spec": spec, "raw": len(raw)} for d, (raw, spec, _) in images.items()],
    }
    if shared is not None:
        head["shared"] = [shared.name, shared.offset]
    manifest = json.dumps(head).encode()
    parts: list[bytes | memoryview] = [manifest, request_json]
    at = 0
    for raw, _, pixels in images.values():
        data = np.ascontiguousarray(pixels, dtype=np.uint8).data
        if shared is None:
            parts += [raw, data]
        else:
            parts.append(raw)
            shared.view[at : at + data.nbytes] = data.cast("B")
            at += data.nbytes
    return b"".join(parts), len(manifest)


def unpack(body: bytes, manifest_length: int, rings: SharedPixels | None = None) -> tuple[bytes, dict[str, Predecoded]]:
    """The request JSON and the pre-decoded images of a rewritten body (views of the body, or of
    one copy of the request's pixels out of the front-end's ring read through ``rings``)."""
    try:
        manifest = json.loads(body[:manifest_length])
        at = manifest_length + int(manifest["json"])
        request_json = body[manifest_length:at]
        entries = [(str(e["sha256"]), str(e["spec"]), int(e["raw"])) for e in manifest["images"]]
        sizes = [spec_side(spec) ** 2 * 3 for _, spec, _ in entries]
        pixels_from: memoryview | None = None
        if "shared" in manifest:
            if rings is None:
                raise MalformedFrame("pixels in shared memory, and no reader for them")
            name, offset = manifest["shared"]
            pixels_from = memoryview(rings.read(str(name), int(offset), sum(sizes)))
        view = memoryview(body)
        images: dict[str, Predecoded] = {}
        taken = 0
        for (digest, spec, raw_length), size in zip(entries, sizes, strict=True):
            side = spec_side(spec)
            raw = body[at : at + raw_length]
            at += raw_length
            if len(raw) != raw_length:
                raise MalformedFrame("image bytes past the end of the body")
            if pixels_from is None:
                if at + size > len(body):
                    raise MalformedFrame("pixels past the end of the body")
                data, at = view[at : at + size], at + size
            else:
                data, taken = pixels_from[taken : taken + size], taken + size
            images[digest] = Predecoded(raw, spec, np.frombuffer(data, dtype=np.uint8).reshape(side, side, 3))
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise MalformedFrame(f"a pre-decoded body that does not add up: {exc}") from None
    if at != len(body):
        raise MalformedFrame("bytes after the last pre-decoded image")
    return request_json, images
