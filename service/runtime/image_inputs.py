"""Request images as far as model-input pixels: reading each image a request names (base64
``data``, a ``url`` fetched under per-request and per-process caps, or a ``sha256`` reference the
cache resolves), and decoding the bytes a request needs into the serving version's input pixels,
or taking the pixels a front-end process already decoded (workers > 1) when they were made under
the same preprocessing. Decoding runs in the pipeline's decode pool; the pipeline
(``service.runtime.pipeline``) decides which images need pixels at all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx
import numpy as np

from clipcore.errors import ClipError, ErrorCode, too_large
from service.config import Settings
from service.images import ByteBudget, decode_base64, decode_image, fetch_url
from service.runtime.assembly import ModelRuntime
from service.runtime.cache import bytes_digest
from service.runtime.metrics import ServiceMetrics
from service.split.wire import PREDECODED, Predecoded

__all__ = ["INLINE_BASE64_CHARS", "ImageInputs", "ImageRef", "ReadImages"]

T = TypeVar("T")


class ImageRef(Protocol):
    """An image as a request names it: exactly one of base64 ``data``, a ``url``, or the ``sha256``
    of bytes this model version already embedded (the API's image object is one)."""

    @property
    def data(self) -> str | None: ...

    @property
    def url(self) -> str | None: ...

    @property
    def sha256(self) -> str | None: ...


# base64 strings up to this length are decoded on the event loop (tens of microseconds, less than
# handing them to the decode pool and back); longer ones in the pool, so the loop never stalls.
INLINE_BASE64_CHARS = 64 * 1024


@dataclass
class ReadImages:
    """Request images after their bytes were read: ids, bytes by id, and pixels decoded so far."""

    ids: list[str] = field(default_factory=list)
    raw: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    first_field: dict[str, str] = field(default_factory=dict)
    decoded: dict[str, np.ndarray] = field(default_factory=dict)
    predecoded: dict[str, Predecoded] = field(default_factory=dict)  # pixels a front-end made, by id


class ImageInputs:
    """Reads request images into bytes and decodes them into model-input pixels."""

    def __init__(
        self, settings: Settings, metrics: ServiceMetrics, decode_pool: concurrent.futures.ThreadPoolExecutor
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.decode_pool = decode_pool  # the pipeline's: it also runs other CPU work
        self.http: httpx.AsyncClient | None = None
        if settings.allow_url_images:
            self.http = httpx.AsyncClient(timeout=settings.url_timeout_s, trust_env=False)
        # URL fetches in progress, all requests together (a request has its own, smaller cap too).
        self.fetch_slots = asyncio.Semaphore(settings.url_fetches_per_process)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def read(self, images: Sequence[ImageRef], fields: Sequence[str]) -> ReadImages:
        budget = ByteBudget(self.settings.limits.max_url_bytes)
        slots = asyncio.Semaphore(self.settings.url_fetches_per_request)
        reads = [self._image_bytes(img, f, budget, slots) for img, f in zip(images, fields, strict=True)]
        if all(img.url is None and len(img.data or "") <= INLINE_BASE64_CHARS for img in images):
            # Nothing here waits (inline base64, references): one after the other, in order, without
            # a task per image; the first failure is the one a concurrent run would raise too.
            payloads = []
            try:
                for read_one in reads:
                    payloads.append(await read_one)
            finally:
                for unread in reads[len(payloads) :]:
                    unread.close()  # not started: closed, so none warns that it was never awaited
        else:
            payloads = await _all_or_none(reads)
        read = ReadImages()
        predecoded = PREDECODED.get() or {}
        for i, (img, data) in enumerate(zip(images, payloads, strict=True)):
            digest = img.sha256.lower() if img.sha256 is not None else bytes_digest(data or b"")
            read.ids.append(digest)
            read.first_field.setdefault(digest, fields[i])
            if data is not None and digest not in read.raw:
                read.raw[digest] = (data, f"{fields[i]}.{'data' if img.data is not None else 'url'}")
            elif digest in predecoded and digest not in read.raw:
                # Sent as data to a front-end, which decoded it: its bytes stay at hand in case the
                # version serving this request wants other pixels than the front-end made.
                read.predecoded[digest] = predecoded[digest]
                read.raw[digest] = (predecoded[digest].raw, f"{fields[i]}.data")
        return read

    async def decode(self, runtime: ModelRuntime, read: ReadImages, digests: Sequence[str]) -> list[np.ndarray]:
        """Model-input pixels of these images, decoding only those this request has not yet."""
        todo = [d for d in digests if d not in read.decoded]
        if read.predecoded:
            spec = runtime.pixel_spec
            ready = {d: read.predecoded[d] for d in todo if d in read.predecoded}
            used = {d: p.pixels for d, p in ready.items() if p.spec == spec}
            self.metrics.images_predecoded(used=len(used), stale=len(ready) - len(used))
            read.decoded.update(used)
            todo = [d for d in todo if d not in used]
        pixels = await asyncio.gather(*(self._pixels(runtime, *read.raw[d]) for d in todo))
        self.metrics.image_decoded(len(pixels))
        read.decoded.update(zip(todo, pixels, strict=True))
        return [read.decoded[d] for d in digests]

    async def _image_bytes(
        self, image: ImageRef, field: str, budget: ByteBudget, slots: asyncio.Semaphore
    ) -> bytes | None:
        """Raw bytes of a ``data`` or ``url`` image; None for ``sha256`` (resolved by the cache).
        A URL is fetched once it holds one of the request's ``slots`` and then one of the process's."""
        limits = self.settings.limits
        if image.data is not None:
            if len(image.data) > 2 * limits.max_image_bytes:  # cheap early refusal of huge strings
                raise too_large(f"image is larger than {limits.max_image_bytes} bytes", f"{field}.data")
            if len(image.data) <= INLINE_BASE64_CHARS:  # cheaper here than the hand-off to a thread and back
                return decode_base64(image.data, f"{field}.data", limits.max_image_bytes)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self.decode_pool, decode_base64, image.data, f"{field}.data", limits.max_image_bytes
            )
        if image.url is not None:
            if self.http is None:
                raise ClipError(ErrorCode.urls_disabled, "image URLs are disabled on this server", f"{field}.url")
            # A few KB of request naming 64 URLs must not open 64 connections at once, nor many
            # requests together flood the egress: fetches over either cap wait their turn. The wait
            # is outside the fetch's deadline (a URL is not failed for queueing) and bounded, as
            # every slot holder finishes within url_timeout_s. The request's slot is taken first,
            # so one request queues at most that many fetches for the process's slots.
            async with slots, self.fetch_slots:
                return await fetch_url(
                    self.http,
                    image.url,
                    f"{field}.url",
                    allowlist=self.settings.url_allowlist,
                    max_bytes=limits.max_image_bytes,
                    timeout_s=self.settings.url_timeout_s,
                    budget=budget,
                )
        return None  # sha256: resolved through the cache

    async def _pixels(self, runtime: ModelRuntime, data: bytes, field: str) -> np.ndarray:
        limits = self.settings.limits

        def work() -> np.ndarray:
            side, ratio = runtime.bundle.image_size, limits.max_aspect_ratio
            image = decode_image(data, field, limits.max_pixels, min_side=side, max_aspect_ratio=ratio)
            return runtime.bundle.preprocess(image)

        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, work)


async def _all_or_none(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Results of all ``coros`` in order; on the first failure the others are cancelled (a bad URL
    must not leave its siblings downloading for nobody) and that failure is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
