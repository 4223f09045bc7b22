"""Turning untrusted image payloads into pixels, safely.

Order of checks, cheapest first, so a hostile payload costs little: size of the base64 text
(before decoding it), strict base64, then the image header only (format and dimensions; a
20000x20000 PNG of a few KB is refused here, before a single pixel is inflated), then the pixels.
Everything here is synchronous and CPU-bound: callers run it in a thread pool.

Image URLs are off by default. When on, only http(s) is fetched, every hop (redirects are
followed by hand, at most ``MAX_REDIRECTS``) must resolve to public addresses only (an IPv6
address that carries an IPv4 one, as NAT64 and 6to4 do, is judged by that IPv4 address) unless
its host is allowlisted, and the body is streamed with a byte cap and a total time limit. The
name is resolved once per hop and the connection goes to an address that check saw, so a DNS
server answering differently the second time (DNS rebinding) cannot redirect it; allowlisted
hosts are connected to by name.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import ipaddress
import re
import socket
import struct
from collections.abc import Sequence
from urllib.parse import urljoin, urlsplit

import httpx
from PIL import Image, ImageFile, UnidentifiedImageError

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from clipcore.models.preprocess import apply_orientation, exif_orientation

FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
MAX_REDIRECTS = 3
_DATA_URI = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*),", re.ASCII)
_WHITESPACE = re.compile(r"\s+")

# Truncated files must fail loudly, never decode as half-grey pictures.
ImageFile.LOAD_TRUNCATED_IMAGES = False


def _bad_image(message: str, field: str) -> ClipError:
    return ClipError(ErrorCode.bad_image, message, field)


def _strict_base64(payload: str) -> bytes | None:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):  # ValueError: characters outside ASCII
        return None


def decode_base64(value: str, field: str, max_bytes: int) -> bytes:
    """Strict base64 (or ``data:...;base64,`` URI) -> bytes; the size is checked before decoding."""
    payload = value
    if value.startswith("data:"):
        match = _DATA_URI.match(value)
        if match is None or ";base64" not in match.group("params"):
            raise bad_input("data URIs must be base64 encoded (data:<type>;base64,...)", field)
        payload = value[match.end() :]
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise too_large(f"image is larger than {max_bytes} bytes", field)
    data = _strict_base64(payload)  # most payloads are one unbroken line: no whitespace scan first
    if data is None:
        # Line breaks are common (MIME wraps at 76 columns) and harmless; anything else is not.
        # Removing them costs several times the decoding itself, so only payloads that need it pay.
        data = _strict_base64(_WHITESPACE.sub("", payload))
    if data is None:
        raise bad_input("image data is not valid base64 (truncated or with invalid characters)", field)
    if not data:
        raise bad_input("image data is empty", field)
    if len(data) > max_bytes:
        raise too_large(f"image is larger than {max_bytes} bytes", field)
    return data


# An image is shrunk while decoding only when its shorter side is at least this many times the
# model input: below that, pixels are exactly those of a full decode + resize.
DRAFT_FACTOR = 4


def decode_image(
    data: bytes, field: str, max_pixels: int, min_side: int | None = None, max_aspect_ratio: float | None = None
) -> Image.Image:
    """Image bytes -> loaded RGB image (first frame of animations), turned upright by its EXIF
    orientation, or 400/413 ``ClipError``. ``max_aspect_ratio`` refuses, from the header, an image
    whose longer side is more than that many times its shorter one.

    With ``min_side`` (the model input side), an image much larger than that is reduced before
    its colours are converted and transparency flattened (JPEG: while decoding, in draft mode;
    others: an integer box reduction right after), so a 6300 px transparent PNG costs a decode,
    not a full-size compositing pass; the result keeps at least ``2 * min_side`` on its shorter
    side for the resize that follows."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise too_large(f"image has more than {max_pixels} pixels", field) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise _bad_image(f"not an image in a supported format ({', '.join(FORMATS)})", field) from None
    with image:
        width, height = image.size  # from the header: nothing decoded yet
        if width <= 0 or height <= 0:
            raise _bad_image("image has no pixels", field)
        if width * height > max_pixels:
            raise too_large(f"image is {width}x{height}, more than {max_pixels} pixels", field)
        if max_aspect_ratio is not None and max(width, height) > max_aspect_ratio * min(width, height):
            raise too_large(
                f"image is {width}x{height}, an aspect ratio above the limit of {max_aspect_ratio:g}:1 "
                "(limits.max_aspect_ratio)",
                field,
            )
        orientation = exif_orientation(image)
        try:
            image.seek(0)
            keep = 2 * (min_side or 0)  # the shorter side to keep at least; 0: no reduction
            large = keep > 0 and min(width, height) >= DRAFT_FACTOR * keep // 2
            if large and image.format == "JPEG":
                image.draft("RGB", (keep, keep))
            image.load()
            factor = min(image.size) // keep if large else 1
            rgb = to_rgb(_reducible(image).reduce(factor)) if factor >= 2 else to_rgb(image)
            return apply_orientation(rgb, orientation)
        except Image.DecompressionBombError:
            raise too_large(f"image has more than {max_pixels} pixels", field) from None
        except (OSError, ValueError, SyntaxError, EOFError, struct.error):
            raise _bad_image("image data is corrupt or truncated", field) from None


def _reducible(image: Image.Image) -> Image.Image:
    """``image`` in a mode ``Image.reduce`` takes (palette and bilevel images are expanded first)."""
    if image.mode in ("RGB", "RGBA", "L", "LA"):
        return image
    return image.convert("RGBA" if _has_alpha(image) else "RGB")


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB copy; transparency is flattened onto white (the renderers draw on light backgrounds)."""
    if _has_alpha(image):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


# ----------------------------------------------------------------------------- URLs
def _host_allowed(host: str, allowlist: Sequence[str]) -> bool:
    return host.lower().strip("[]") in {h.lower().strip("[]") for h in allowlist}


# IPv6 ranges that carry an IPv4 address in their last 32 bits: a translator or tunnel on the path
# delivers the packets to that IPv4 host, so it is the address that must be public. (IPv4-mapped
# ``::ffff:0:0/96``, 6to4 and Teredo have ``ipaddress`` properties of their own.)
_IPV4_IN_LOW_BITS = (
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64 well-known prefix (RFC 6052)
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible, deprecated (RFC 4291)
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated, SIIT (RFC 2765)
)
# NAT64 local-use prefix (RFC 8215): the operator picks a prefix length from /48 to /96 within it,
# and with it where the IPv4 address sits (RFC 6052 section 2.2), so nothing here can tell which
# IPv4 host an address reaches. Refused outright.
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses that a packet to ``ip`` ends up at or passes through on the way."""
    found: list[ipaddress.IPv4Address] = []
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)  # the Teredo server and the (de-obfuscated) client
    if any(ip in net for net in _IPV4_IN_LOW_BITS):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


def is_public_address(address: str) -> bool:
    """True when ``address`` (and any IPv4 address an IPv6 transition prefix embeds in it) is public.

    ``ipaddress`` calls NAT64, 6to4 and IPv4-compatible addresses global whatever IPv4 address they
    carry, yet on a NAT64 network ``64:ff9b::7f00:1`` is 127.0.0.1 and ``64:ff9b::a9fe:a9fe`` the
    cloud metadata service: the embedded IPv4 is checked too. Only prefixes of fixed layout can be
    unwrapped; a NAT64 prefix an operator chose for its own network (RFC 6052 network-specific
    prefix) looks like any public IPv6 address, which is why egress should also be firewalled.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL_USE:
            return False
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # the sockets API's spelling of an IPv4 peer: that peer is what counts
        elif not all(_is_public(v4) for v4 in _embedded_ipv4(ip)):
            return False
    return _is_public(ip)


async def check_url(url: str, field: str, allowlist: Sequence[str]) -> list[str]:
    """Refuse non-http(s) URLs and hosts that resolve to non-public addresses (SSRF guard).

    Returns the addresses the host resolved to, every one checked, in the resolver's order of
    preference: the fetch connects to one of these, never to what a second lookup answers. Empty
    for an allowlisted host (trusted, so connected to by name)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClipError(ErrorCode.url_forbidden, "only http and https image URLs are allowed", field)
    if parts.username or parts.password:
        raise ClipError(ErrorCode.url_forbidden, "image URLs must not carry credentials", field)
    host = parts.hostname
    if _host_allowed(host, allowlist):
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise _bad_image(f"cannot resolve image host {host!r}", field) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses or not all(is_public_address(a) for a in addresses):
        raise ClipError(ErrorCode.url_forbidden, f"image host {host!r} resolves to a non-public address", field)
    return addresses


async def _open(client: httpx.AsyncClient, url: str, addresses: Sequence[str]) -> httpx.Response:
    """GET ``url`` (streamed, redirects not followed) from the first of ``addresses`` that accepts
    a connection, or by name when there are none.

    The URL's name stays in the Host header and in TLS (SNI and certificate check). Connections
    are kept alive by address, so one may carry the next image from another name at that address
    over a TLS session verified for the first: harmless here, no credentials are ever sent and an
    image is untrusted content whichever server sent it."""
    if not addresses:
        return await client.send(client.build_request("GET", url), stream=True, follow_redirects=False)
    target = httpx.URL(url)
    name = target.raw_host.decode("ascii")  # IDNA-encoded, as sent in SNI
    failure: httpx.ConnectError | None = None
    for address in addresses:
        request = client.build_request(
            "GET",
            target.copy_with(host=address),
            headers={"Host": target.netloc.decode("ascii")},
            extensions={"sni_hostname": name},
        )
        try:
            return await client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as exc:
            failure = exc  # this address is down or unreachable: the name may have others
    assert failure is not None
    raise failure


class ByteBudget:
    """Bytes that all the URL fetches of one request may still read together (a request of a few
    KB may name many large images: each is capped, and so is their sum)."""

    def __init__(self, total: int) -> None:
        self.total, self.left = total, total

    def take(self, n: int, field: str) -> None:
        self.left -= n
        if self.left < 0:
            raise too_large(f"the image URLs of this request exceed {self.total} bytes in all", field)


async def fetch_url(
    client: httpx.AsyncClient,
    url: str,
    field: str,
    *,
    allowlist: Sequence[str],
    max_bytes: int,
    timeout_s: float,
    budget: ByteBudget | None = None,
) -> bytes:
    """GET an image URL with the SSRF guard on every hop, a byte cap (per image and, with
    ``budget``, per request) and a total deadline."""
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                addresses = await check_url(url, field, allowlist)
                response = await _open(client, url, addresses)
                async with contextlib.aclosing(response):
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])  # the next hop is checked afresh
                        continue
                    if response.status_code != 200:
                        raise _bad_image(f"image URL answered HTTP {response.status_code}", field)
                    declared = response.headers.get("content-length")
                    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                        raise too_large(f"image is larger than {max_bytes} bytes", field)
                    chunks: list[bytes] = []
                    total = 0
                    async for chunk in response.aiter_bytes():
                        total += len(chunk)
                        if total > max_bytes:
                            raise too_large(f"image is larger than {max_bytes} bytes", field)
                        if budget is not None:
                            budget.take(len(chunk), field)
                        chunks.append(chunk)
                    return b"".join(chunks)
            raise _bad_image(f"image URL redirected more than {MAX_REDIRECTS} times", field)
    except TimeoutError:
        raise _bad_image(f"image URL did not answer within {timeout_s:g}s", field) from None
    except httpx.HTTPError as exc:
        raise _bad_image(f"could not fetch image URL ({type(exc).__name__})", field) from None
