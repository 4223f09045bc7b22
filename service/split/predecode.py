"""A front-end's share of a request: base64 and image decoding, done before the engine sees it.

``rewrite`` finds the image objects of the image routes' JSON bodies (``{"data": ...}`` only),
decodes each with the service's own code (``service.images``) to the model-input pixels of the
preprocessing spec chosen for the request, and returns the rewritten body (``service.split.wire``).
It returns None whenever anything is off (a body that is not a JSON object, an image that does not
decode, more images than a request may carry): the original body then goes to the engine, which
answers exactly as a single process does, errors included.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from clipcore.errors import ClipError
from clipcore.models.preprocess import fit_square
from service.config import Settings
from service.images import decode_base64, decode_image
from service.split.pixel_ring import MIN_SHARED_BYTES, PixelLease, PixelRing
from service.split.wire import pack, pixel_bytes, spec_side

# The routes whose bodies carry ImageInput objects, and where. /score/dense/heatmap is left out on
# purpose: it draws the picture itself, so its image must stay data or url.
LIST_ROUTES = ("/embed", "/classify", "/rank")
PAIR_KEYS = ("image_a", "image_b")
IMAGE_ROUTES = frozenset((*LIST_ROUTES, "/rank-pair", "/score/dense"))
# json.dumps builds a new encoder for every call with non-default arguments: this one is made once.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def _slots(path: str, doc: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """(container, key) of each image object of a body of ``path``."""
    if path in LIST_ROUTES:
        images = doc.get("images")
        if isinstance(images, list):
            yield from ((images, i) for i in range(len(images)))
    elif path == "/score/dense":
        if "image" in doc:
            yield doc, "image"
    elif path == "/rank-pair":
        pairs = doc.get("pairs")
        for pair in [doc, *(pairs if isinstance(pairs, list) else [])]:
            if isinstance(pair, dict):
                yield from ((pair, key) for key in PAIR_KEYS if key in pair)


def choose_spec(table: dict[str, Any] | None, doc: dict[str, Any]) -> str | None:
    """The spec to decode a request's images with: the one all loaded versions share, else the
    default version's for a request that names no model; None (let the engine decode) otherwise."""
    if not table:
        return None
    specs = table.get("specs") or []
    if len(specs) == 1:
        return str(specs[0])
    if doc.get("model") is None and table.get("default"):
        return str(table["default"])
    return None


@dataclass
class Rewritten:
    body: bytes
    manifest_length: int
    images: int  # image objects of the request that went as pixels
    shared: PixelLease | None  # the ring's region of their pixels, to release once answered


def rewrite(
    path: str, body: bytes, table: dict[str, Any] | None, settings: Settings, ring: PixelRing | None = None
) -> Rewritten | None:
    """The rewritten body, or None to forward ``body`` as it is. Pixels of at least
    ``MIN_SHARED_BYTES`` go into ``ring`` where it has room."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        return None
    if not isinstance(doc, dict):
        return None
    spec = choose_spec(table, doc)
    if spec is None:
        return None
    slots = [(c, k) for c, k in _slots(path, doc) if _is_data_image(c[k])]
    limits = settings.limits
    if not slots or len(slots) > limits.max_images:
        return None
    _, interpolation, resize_mode = spec.split("/")
    side = spec_side(spec)
    images: dict[str, tuple[bytes, str, np.ndarray]] = {}
    for container, key in slots:
        try:
            raw = decode_base64(container[key]["data"], "image", limits.max_image_bytes)
            digest = hashlib.sha256(raw).hexdigest()
            if digest not in images:
                image = decode_image(
                    raw, "image", limits.max_pixels, min_side=side, max_aspect_ratio=limits.max_aspect_ratio
                )
                images[digest] = (raw, spec, fit_square(image, side, interpolation, resize_mode))
        except ClipError:
            return None  # the engine says what is wrong, as it always has
        container[key] = {"sha256": digest}
    size = pixel_bytes(images)
    shared = ring.lease(size) if ring is not None and size >= MIN_SHARED_BYTES else None
    packed, manifest_length = pack(_COMPACT_JSON.encode(doc).encode(), images, shared)
    return Rewritten(packed, manifest_length, len(slots), shared)


def _is_data_image(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("data"), str)
