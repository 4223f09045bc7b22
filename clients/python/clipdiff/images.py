"""Turning what callers hold (paths, bytes, PIL images, cached ids) into API image objects.

The API accepts ``{"data": base64}``, ``{"url": ...}`` or ``{"sha256": hex}``; the last one names
an image the server has already embedded, so a caller that keeps :func:`image_sha256` of the
bytes it sent can re-use the image without uploading it again.
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["ImageLike", "ImageRef", "image_bytes", "image_id", "image_input", "image_sha256"]

_KINDS = ("data", "url", "sha256")
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ImageRef:
    """An explicit image reference: build with ``ImageRef.sha256(hex)`` or ``ImageRef.url(u)``."""

    kind: Literal["data", "url", "sha256"]
    value: str

    @classmethod
    def sha256(cls, digest: str) -> ImageRef:
        digest = digest.strip().lower()
        if len(digest) != 64 or not set(digest) <= _HEX:
            raise ValueError("a sha256 reference must be 64 hexadecimal characters")
        return cls("sha256", digest)

    @classmethod
    def url(cls, url: str) -> ImageRef:
        if not url.startswith(("http://", "https://")):
            raise ValueError("an image URL must start with http:// or https://")
        return cls("url", url)

    @classmethod
    def data(cls, raw: bytes) -> ImageRef:
        return cls("data", base64.b64encode(raw).decode("ascii"))

    def to_json(self) -> dict[str, str]:
        return {self.kind: self.value}


# Anything image_input accepts; PIL images and numpy arrays are typed loosely so that neither
# library is needed to import the client.
ImageLike = str | Path | bytes | bytearray | memoryview | ImageRef | dict | Any


def image_sha256(data: bytes) -> str:
    """Hex sha256 of image bytes: the id the server returns from ``/embed`` for them."""
    return hashlib.sha256(bytes(data)).hexdigest()


def _is_pil(x: Any) -> bool:
    mod = type(x).__module__ or ""
    return mod.startswith("PIL.") and hasattr(x, "save") and hasattr(x, "mode")


def _is_ndarray(x: Any) -> bool:
    return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def _png(image: Any) -> bytes:
    # PNG is lossless, so the server sees exactly the pixels the caller has.
    buf = io.BytesIO()
    if image.mode not in ("RGB", "RGBA", "L"):
        image = image.convert("RGB")
    image.save(buf, format="PNG")
    return buf.getvalue()


def image_bytes(x: Any) -> bytes:
    """The raw bytes that would be uploaded for ``x`` (a path, bytes, PIL image or uint8 array).

    Raises:
        TypeError: for references (``sha256``/``url``) and unsupported types, which have no bytes.
        FileNotFoundError: for a path that does not exist.
    """
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, Path) or (isinstance(x, str) and not x.startswith(("http://", "https://", "data:"))):
        return Path(x).read_bytes()
    if _is_pil(x):
        return _png(x)
    if _is_ndarray(x):
        try:
            from PIL import Image
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TypeError("numpy images need pillow installed (pip install clipdiff-client[images])") from exc
        return _png(Image.fromarray(x))
    raise TypeError(f"cannot take image bytes from {type(x).__name__}")


def image_id(x: Any) -> str:
    """The server-side id (sha256) of what :func:`image_input` would send for ``x``.

    Raises:
        TypeError: for URL references, whose bytes only the server sees.
    """
    obj = image_input(x)
    if "sha256" in obj:
        return obj["sha256"].lower()
    if "data" in obj:
        return image_sha256(_decode_data(obj["data"]))
    raise TypeError("a URL reference has no id until the server has fetched it")


def _decode_data(data: str) -> bytes:
    if data.startswith("data:"):
        data = data.split(",", 1)[1] if "," in data else ""
    return base64.b64decode(data)


def image_input(x: Any) -> dict[str, str]:
    """Build the API image object for ``x``.

    Accepts a filesystem path (``str``/``Path``), raw encoded bytes, a PIL image (sent as PNG),
    a 2-D/3-D uint8 numpy array (via pillow), an :class:`ImageRef`, an ``http(s)://`` URL string,
    a ``data:`` URI string, or an already-built dict with exactly one of ``data``/``url``/``sha256``.

    Raises:
        TypeError / ValueError: for values that are not images.
    """
    if isinstance(x, ImageRef):
        return x.to_json()
    if isinstance(x, dict):
        keys = [k for k in _KINDS if k in x]
        if len(keys) != 1 or len(x) != 1:
            raise ValueError("an image dict must have exactly one of 'data', 'url', 'sha256'")
        value = x[keys[0]]
        if not isinstance(value, str):
            raise ValueError(f"image {keys[0]!r} must be a string")
        return {keys[0]: value}
    if isinstance(x, str) and x.startswith("data:"):
        return {"data": x}
    if isinstance(x, str) and x.startswith(("http://", "https://")):
        return ImageRef.url(x).to_json()
    return {"data": base64.b64encode(image_bytes(x)).decode("ascii")}
