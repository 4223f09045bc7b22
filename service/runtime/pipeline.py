"""The one data path from request inputs to embeddings: cache first, batched encodes of misses.

Images are keyed by the sha256 of their bytes, texts by their exact UTF-8 text, both under the
serving version and encoder variant (``embedding_key``). Only misses are decoded and encoded,
in chunks no larger than a batch (so a request never needs more queue room than one batch and
what one chunk computed is cached even if a later chunk is refused). Decoding runs in a thread
pool, encoding in the runtime's batchers; the event loop only moves arrays around.

DCSM features take the same path under their own cache kinds: ``dense`` (class + patch tokens
of an image, by image sha256) and ``dense_text`` (per-position text features, by text), each
with its own batcher. An image needed both pooled and dense is decoded once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx
import numpy as np

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from clipcore.models.bundle import BASE_ENCODER, DenseLayout
from service.config import Settings
from service.images import ByteBudget, decode_base64, decode_image, fetch_url
from service.runtime.assembly import ModelRuntime
from service.runtime.batcher import (
    BatcherClosed,
    BatcherError,
    DeadlineExceeded,
    DynamicBatcher,
    QueueFull,
    RequestTooLarge,
    Reservation,
    SubmitTimings,
)
from service.runtime.cache import (
    EmbeddingCache,
    bytes_digest,
    embedding_key,
    embedding_key_prefix,
    quantize,
    text_digest,
)
from service.runtime.metrics import ServiceMetrics
from service.split.wire import PREDECODED, Predecoded, bundle_spec

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


IMAGE_VARIANT = "visual"
# base64 strings up to this length are decoded on the event loop (tens of microseconds, less than
# handing them to the decode pool and back); longer ones in the pool, so the loop never stalls.
INLINE_BASE64_CHARS = 64 * 1024
_TRUNCATION_MEMO = 100_000


@dataclass(frozen=True)
class TextEmbeddings:
    vectors: np.ndarray  # (N, D) in input order
    truncated: list[bool]


@dataclass(frozen=True)
class ImageEmbeddings:
    vectors: np.ndarray  # (N, D) in input order; (N, 2, D) for YUKINO's prompt features
    ids: list[str]  # sha256 of each image's bytes


@dataclass(frozen=True)
class DenseTexts:
    tokens: np.ndarray  # (N, L, D) per-position features, rows past the end token 0
    layouts: list[DenseLayout]  # per text: valid positions, functional rows and words, labels


@dataclass(frozen=True)
class DenseImages:
    tokens: np.ndarray  # (N, 1+P, D): class token, then the patches in row-major grid order
    pooled: np.ndarray | None  # (N, D): the same embeddings /embed returns
    ids: list[str]
    pixels: list[np.ndarray | None]  # with_pixels: (S, S, 3) uint8 model input, None for references


@dataclass
class _ReadImages:
    """Request images after their bytes were read: ids, bytes by id, and pixels decoded so far."""

    ids: list[str] = field(default_factory=list)
    raw: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    first_field: dict[str, str] = field(default_factory=dict)
    decoded: dict[str, np.ndarray] = field(default_factory=dict)
    predecoded: dict[str, Predecoded] = field(default_factory=dict)  # pixels a front-end made, by id


@dataclass
class RequestStages:
    """Per-request stage times (seconds, summed over its batches) and its encode deadline.

    The HTTP middleware installs one per request and reports the times as X-Queue-Time /
    X-Inference-Time (what load tests read); all batched encodes of one request share one
    ``request_timeout_s`` budget, counted from its first submit.
    """

    queue_s: float = 0.0
    inference_s: float = 0.0
    deadline: float | None = None
    batches: int = 0


# Text work of several batches runs a first batch of this many texts to measure its cost per text,
# then refuses what its estimate says cannot finish (beyond PROBE_SLACK times the time left).
PROBE_TEXTS = 32
PROBE_SLACK = 2.0

REQUEST_STAGES: ContextVar[RequestStages | None] = ContextVar("request_stages", default=None)


class Pipeline:
    def __init__(self, settings: Settings, cache: EmbeddingCache, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.cache = cache
        self.metrics = metrics
        self.decode_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.batching.decode_workers, thread_name_prefix="decode"
        )
        self.http: httpx.AsyncClient | None = None
        if settings.allow_url_images:
            self.http = httpx.AsyncClient(timeout=settings.url_timeout_s, trust_env=False)
        # URL fetches in progress, all requests together (a request has its own, smaller cap too).
        self.fetch_slots = asyncio.Semaphore(settings.url_fetches_per_process)
        self._truncation: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (tokenizer key, text digest)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        self.decode_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ texts
    def encoder_name(self, runtime: ModelRuntime, encoder: str | None) -> str:
        name = encoder or runtime.bundle.default_text_encoder
        if name not in runtime.text_batchers:
            known = ", ".join(sorted(runtime.text_batchers))
            raise bad_input(f"unknown text encoder {name!r}; {runtime.ref} has: {known}", "encoder")
        return name

    async def embed_texts(self, runtime: ModelRuntime, texts: Sequence[str], encoder: str | None) -> TextEmbeddings:
        variant = self.encoder_name(runtime, encoder)
        stacked = await self._encode_texts(runtime, texts, "text", variant, runtime.text_batchers[variant])
        truncated = await self.truncated(runtime, texts)
        self.metrics.texts_truncated(sum(truncated))
        return TextEmbeddings(stacked, truncated)

    async def dense_texts(self, runtime: ModelRuntime, texts: Sequence[str]) -> DenseTexts:
        """Per-token features of texts for DCSM (cache kind ``dense_text``) and their layouts."""
        assert runtime.dense_text_batcher is not None, "dense_texts needs a version with a DCSM component"
        tokens = await self._encode_texts(runtime, texts, "dense_text", BASE_ENCODER, runtime.dense_text_batcher)
        unique = list(dict.fromkeys(texts))
        layouts = dict(zip(unique, await runtime.run(lambda: runtime.bundle.dense_layouts(unique)), strict=True))
        return DenseTexts(tokens, [layouts[t] for t in texts])

    async def _encode_texts(
        self,
        runtime: ModelRuntime,
        texts: Sequence[str],
        kind: str,
        variant: str,
        batcher: DynamicBatcher[Any, np.ndarray],
    ) -> np.ndarray:
        unique = list(dict.fromkeys(texts))
        prefix = embedding_key_prefix(runtime.ref, kind, variant)
        keys = [prefix + text_digest(t) for t in unique]
        found = await self.cache.get_many(keys)
        missing = [i for i, value in enumerate(found) if value is None]
        step = min(self.settings.batching.max_batch_texts, self.settings.batching.max_queue)
        several = len(missing) > step
        if several and batcher.full_batch_s is not None:  # several batches: admitted only if they fit
            self._refuse_unfinishable(batcher, len(missing), batcher.full_batch_s / batcher.max_batch)
        run_s, done = 0.0, 0
        while done < len(missing):
            if done:  # this request's own batches measure what the rest of it costs
                # The probe batch is smaller than the rest, so slower per text: judged with slack.
                slack = PROBE_SLACK if done < step else 1.0
                self._refuse_unfinishable(batcher, len(missing) - done, run_s / done, slack)
            # Large work starts with a small probe batch, so other requests wait behind little of it
            # before its estimate can refuse it.
            size = min(step, PROBE_TEXTS) if several and not done else step
            chunk = missing[done : done + size]
            vectors, timings = await self._submit_timed(batcher, [unique[i] for i in chunk])
            run_s, done = run_s + timings.run_s, done + len(chunk)
            await self.cache.put_many({keys[i]: v for i, v in zip(chunk, vectors, strict=True)})
            for i, v in zip(chunk, vectors, strict=True):
                found[i] = v
        index = {t: i for i, t in enumerate(unique)}
        return np.stack([found[index[t]] for t in texts]).astype(np.float32, copy=False)  # type: ignore[misc]

    async def truncated(self, runtime: ModelRuntime, texts: Sequence[str]) -> list[bool]:
        """Whether each text was cut to the model context. Memoised by digest (a bounded table of
        flags, never the texts themselves); texts not seen before are tokenized in the decode
        pool, off the event loop."""
        bundle = runtime.bundle
        ctx, key = bundle.context_length, bundle.tokenizer_key
        out = [False] * len(texts)
        todo: dict[str, tuple[str, list[int]]] = {}  # digest -> (text, its positions)
        for i, text in enumerate(texts):
            # Each BPE token covers at least one byte, so short ASCII texts cannot overflow.
            if bundle.hf_tokenizer is None and text.isascii() and len(text) + 2 <= ctx:
                continue
            digest = text_digest(text)
            flag = self._truncation.get((key, digest))
            if flag is None:
                todo.setdefault(digest, (text, []))[1].append(i)
            else:
                out[i] = flag
        if todo:
            flags = await self.offload(lambda: {d: bundle.text_truncated(text) for d, (text, _) in todo.items()})
            for digest, (_, positions) in todo.items():
                self._truncation[(key, digest)] = flags[digest]
                for i in positions:
                    out[i] = flags[digest]
            while len(self._truncation) > _TRUNCATION_MEMO:
                self._truncation.popitem(last=False)
        return out

    # ------------------------------------------------------------------ images
    async def embed_images(
        self, runtime: ModelRuntime, images: Sequence[ImageRef], fields: Sequence[str]
    ) -> ImageEmbeddings:
        """Embeddings of request images; ``fields`` are their paths for errors (``images.0``)."""
        with self._reserve(runtime.image_batcher, images) as room:
            read = await self._read_images(images, fields)
            vectors = await self._encode_images(runtime, read, "image", runtime.image_batcher, room)
        return ImageEmbeddings(vectors, read.ids)

    async def dense_images(
        self,
        runtime: ModelRuntime,
        images: Sequence[ImageRef],
        fields: Sequence[str],
        *,
        pooled: bool = True,
        with_pixels: bool = False,
    ) -> DenseImages:
        """Class + patch tokens (cache kind ``dense``) and, with ``pooled``, the pooled
        embeddings of request images, each image decoded at most once; ``with_pixels`` also
        returns the model-input pixels of images sent as data or URL (references have none)."""
        assert runtime.dense_image_batcher is not None, "dense_images needs a version with a DCSM component"
        with (
            self._reserve(runtime.dense_image_batcher, images) as dense_room,
            self._reserve(runtime.image_batcher, images if pooled else []) as pooled_room,
        ):
            read = await self._read_images(images, fields)
            if with_pixels:
                await self._decode(runtime, read, list(dict.fromkeys(d for d in read.ids if d in read.raw)))
            vectors = (
                await self._encode_images(runtime, read, "image", runtime.image_batcher, pooled_room)
                if pooled
                else None
            )
            tokens = await self._encode_images(runtime, read, "dense", runtime.dense_image_batcher, dense_room)
        pixels = [read.decoded.get(d) for d in read.ids] if with_pixels else []
        return DenseImages(tokens, vectors, read.ids, pixels)

    async def yukino_prompts(
        self, runtime: ModelRuntime, images: Sequence[ImageRef], fields: Sequence[str]
    ) -> ImageEmbeddings:
        """Per image, YUKINO's yes and no prompt features ``(N, 2, D)`` (cache kind ``yukino``)."""
        assert runtime.yukino_batcher is not None, "yukino_prompts needs a version with a YUKINO component"
        with self._reserve(runtime.yukino_batcher, images) as room:
            read = await self._read_images(images, fields)
            vectors = await self._encode_images(runtime, read, "yukino", runtime.yukino_batcher, room)
        return ImageEmbeddings(vectors, read.ids)

    def _reserve(self, batcher: DynamicBatcher[Any, np.ndarray], images: Sequence[ImageRef]) -> Reservation:
        """Room in the batcher's queue for the images that may need encoding (those sent as data
        or URL: references are cached or unknown), taken before fetching or decoding anything,
        so an overloaded server refuses a request at once and cheaply."""
        predecoded = PREDECODED.get() or {}
        try:
            return batcher.reserve(sum(img.sha256 is None or img.sha256 in predecoded for img in images))
        except BatcherError as exc:
            raise self._batcher_error(exc) from None

    async def _read_images(self, images: Sequence[ImageRef], fields: Sequence[str]) -> _ReadImages:
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
        read = _ReadImages()
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

    async def _encode_images(
        self,
        runtime: ModelRuntime,
        read: _ReadImages,
        kind: str,
        batcher: DynamicBatcher[Any, np.ndarray],
        room: Reservation,
    ) -> np.ndarray:
        unique = list(dict.fromkeys(read.ids))
        keys = [embedding_key(runtime.ref, kind, IMAGE_VARIANT, d) for d in unique]
        found = await self.cache.get_many(keys)
        missing = [i for i, value in enumerate(found) if value is None]
        for i in missing:
            if unique[i] not in read.raw:
                what = "dense features" if kind == "dense" else "embedding"
                raise ClipError(
                    ErrorCode.unknown_image,
                    f"no {what} of image {unique[i]} for {runtime.ref}; send its data instead",
                    f"{read.first_field[unique[i]]}.sha256",
                )
        step = min(self.settings.batching.max_batch_images, self.settings.batching.max_queue)
        for start in range(0, len(missing), step):
            chunk = missing[start : start + step]
            pixels = await self._decode(runtime, read, [unique[i] for i in chunk])
            room.release()  # the submit takes the room it held (no await in between)
            vectors = await self._submit(batcher, pixels)
            await self.cache.put_many({keys[i]: v for i, v in zip(chunk, vectors, strict=True)})
            for i, v in zip(chunk, vectors, strict=True):
                found[i] = v
        index = {d: i for i, d in enumerate(unique)}
        return np.stack([found[index[d]] for d in read.ids]).astype(np.float32, copy=False)  # type: ignore[misc]

    async def _decode(self, runtime: ModelRuntime, read: _ReadImages, digests: Sequence[str]) -> list[np.ndarray]:
        """Model-input pixels of these images, decoding only those this request has not yet."""
        todo = [d for d in digests if d not in read.decoded]
        if read.predecoded:
            spec = bundle_spec(runtime.bundle)
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

    async def offload(self, fn: Callable[[], T]) -> T:
        """CPU work that is not model work (drawing a heatmap) in the decode pool."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, fn)

    # ------------------------------------------------------------------ batching
    async def _submit(self, batcher: DynamicBatcher, items: list) -> list[np.ndarray]:  # type: ignore[type-arg]
        """Encode ``items``; results are rounded exactly as a cache hit would return them, so an
        answer never depends on whether its embeddings were cached."""
        return (await self._submit_timed(batcher, items))[0]

    async def _submit_timed(
        self,
        batcher: DynamicBatcher,  # type: ignore[type-arg]
        items: list,  # type: ignore[type-arg]
    ) -> tuple[list[np.ndarray], SubmitTimings]:
        """``_submit`` with the queue and run times of these items."""
        timeout = self._time_left()
        stages = REQUEST_STAGES.get()
        try:
            vectors, timings = await batcher.submit_timed(items, timeout_s=timeout)
            if stages is not None:
                stages.queue_s += timings.queue_s
                stages.inference_s += timings.run_s
                stages.batches += timings.batches
            return [quantize(v) for v in vectors], timings
        except BatcherError as exc:
            raise self._batcher_error(exc) from None

    def _time_left(self) -> float:
        """Seconds left of the request's encode budget (``request_timeout_s`` from its first submit)."""
        budget = self.settings.batching.request_timeout_s
        stages = REQUEST_STAGES.get()
        if stages is None:
            return budget
        now = asyncio.get_running_loop().time()
        if stages.deadline is None:
            stages.deadline = now + budget
        return max(stages.deadline - now, 0.001)

    def _refuse_unfinishable(
        self,
        batcher: DynamicBatcher,  # type: ignore[type-arg]
        items: int,
        item_s: float,
        slack: float = 1.0,
    ) -> None:
        """413 now, with the estimate, for ``items`` more encodes that cannot run within what is left
        of the budget even on an otherwise idle model (``item_s``: measured run time per item; the
        estimate must exceed ``slack`` times what is left), rather than a 504 after holding the model
        for the whole budget while other clients wait."""
        estimate, left = items * item_s, self._time_left()
        if estimate <= slack * left:
            return
        batcher.record_rejection("over_budget")
        budget = self.settings.batching.request_timeout_s
        raise too_large(
            f"this request needs {items} more encodes ({batcher.name}), about {estimate:.1f}s on this server, more "
            f"than the {left:.1f}s left of its {budget:g}s budget (batching.request_timeout_s); send fewer texts, "
            "labels, templates or descriptions per request"
        )

    def _batcher_error(self, exc: BatcherError) -> ClipError:
        if isinstance(exc, BatcherClosed):
            return ClipError(ErrorCode.not_ready, "model is being replaced; retry", retry_after=exc.retry_after)
        if isinstance(exc, QueueFull):
            return ClipError(ErrorCode.overloaded, "server is overloaded; retry later", retry_after=exc.retry_after)
        if isinstance(exc, RequestTooLarge):
            return too_large(str(exc))
        assert isinstance(exc, DeadlineExceeded), exc
        budget = self.settings.batching.request_timeout_s
        return ClipError(ErrorCode.timeout, f"request did not finish within {budget:g}s")


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


def _seconds(value: float) -> str:
    return str(max(1, int(np.ceil(value))))
