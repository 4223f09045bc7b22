"""The one data path from request inputs to embeddings: cache first, batched encodes of misses.

Images are keyed by the sha256 of their bytes, texts by their exact UTF-8 text, both under the
serving version and encoder variant (``embedding_key``). Only misses are decoded and encoded,
in chunks no larger than a batch (so a request never needs more queue room than one batch and
what one chunk computed is cached even if a later chunk is refused). Reading and decoding request
images is ``service.runtime.image_inputs``' job, in this pipeline's thread pool; encoding runs in
the runtime's batchers; the event loop only moves arrays around.

DCSM features take the same path under their own cache kinds: ``dense`` (class + patch tokens
of an image, by image sha256) and ``dense_text`` (per-position text features, by text), each
with its own batcher. An image needed both pooled and dense is decoded once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from clipcore.models.bundle import BASE_ENCODER, DenseLayout
from service.config import Settings
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
    embedding_key,
    embedding_key_prefix,
    quantize,
    text_digest,
)
from service.runtime.image_inputs import ImageInputs, ImageRef, ReadImages
from service.runtime.metrics import ServiceMetrics
from service.split.wire import PREDECODED

T = TypeVar("T")


IMAGE_VARIANT = "visual"
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
        self.images = ImageInputs(settings, metrics, self.decode_pool)
        self._truncation: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (tokenizer key, text digest)

    async def close(self) -> None:
        await self.images.close()
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
            read = await self.images.read(images, fields)
            vectors = (await self._encode_images(runtime, read, ("image",), runtime.image_batcher, room))[0]
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
        # One tower pass gives both where the dense batcher returns the pooled row too; else the
        # pooled embeddings come from the image batcher, a second pass.
        one_pass = runtime.dense_gives_pooled
        with (
            self._reserve(runtime.dense_image_batcher, images) as dense_room,
            self._reserve(runtime.image_batcher, images if pooled and not one_pass else []) as pooled_room,
        ):
            read = await self.images.read(images, fields)
            if with_pixels:
                await self.images.decode(runtime, read, list(dict.fromkeys(d for d in read.ids if d in read.raw)))
            vectors: np.ndarray | None = None
            if one_pass:
                kinds = ("dense", "image") if pooled else ("dense",)
                found = await self._encode_images(
                    runtime, read, kinds, runtime.dense_image_batcher, dense_room, _pooled_first
                )
                tokens, vectors = found[0], found[1] if pooled else None
            else:
                if pooled:
                    vectors = (
                        await self._encode_images(runtime, read, ("image",), runtime.image_batcher, pooled_room)
                    )[0]
                tokens = (
                    await self._encode_images(runtime, read, ("dense",), runtime.dense_image_batcher, dense_room)
                )[0]
        pixels = [read.decoded.get(d) for d in read.ids] if with_pixels else []
        return DenseImages(tokens, vectors, read.ids, pixels)

    async def yukino_prompts(
        self, runtime: ModelRuntime, images: Sequence[ImageRef], fields: Sequence[str]
    ) -> ImageEmbeddings:
        """Per image, YUKINO's yes and no prompt features ``(N, 2, D)`` (cache kind ``yukino``)."""
        assert runtime.yukino_batcher is not None, "yukino_prompts needs a version with a YUKINO component"
        with self._reserve(runtime.yukino_batcher, images) as room:
            read = await self.images.read(images, fields)
            vectors = (await self._encode_images(runtime, read, ("yukino",), runtime.yukino_batcher, room))[0]
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

    async def _encode_images(
        self,
        runtime: ModelRuntime,
        read: ReadImages,
        kinds: Sequence[str],
        batcher: DynamicBatcher[Any, np.ndarray],
        room: Reservation,
        split: Callable[[np.ndarray], Sequence[np.ndarray]] = lambda row: (row,),
    ) -> list[np.ndarray]:
        """Per cache kind in ``kinds``, the (N, ...) features of the images in ``read``: cached
        ones looked up, the others encoded by ``batcher``, whose result for an image ``split``
        cuts into one value per kind (an image missing any kind is encoded for all of them)."""
        unique = list(dict.fromkeys(read.ids))
        keys = [[embedding_key(runtime.ref, kind, IMAGE_VARIANT, d) for d in unique] for kind in kinds]
        flat = await self.cache.get_many([key for per_kind in keys for key in per_kind])
        found = [flat[k * len(unique) : (k + 1) * len(unique)] for k in range(len(kinds))]
        missing = [i for i in range(len(unique)) if any(per_kind[i] is None for per_kind in found)]
        for i in missing:
            if unique[i] not in read.raw:
                what = "dense features" if "dense" in kinds else "embedding"
                raise ClipError(
                    ErrorCode.unknown_image,
                    f"no {what} of image {unique[i]} for {runtime.ref}; send its data instead",
                    f"{read.first_field[unique[i]]}.sha256",
                )
        step = min(self.settings.batching.max_batch_images, self.settings.batching.max_queue)
        for start in range(0, len(missing), step):
            chunk = missing[start : start + step]
            pixels = await self.images.decode(runtime, read, [unique[i] for i in chunk])
            room.release()  # the submit takes the room it held (no await in between)
            rows = await self._submit(batcher, pixels)
            fresh: dict[str, np.ndarray] = {}
            for i, row in zip(chunk, rows, strict=True):
                values = split(row)  # a kind not asked for (the pooled row of a dense-only call) is dropped
                for k in range(len(kinds)):
                    if found[k][i] is None:  # a value already cached stays as it is
                        found[k][i] = fresh[keys[k][i]] = values[k]
            await self.cache.put_many(fresh)
        index = {d: i for i, d in enumerate(unique)}
        return [
            np.stack([per_kind[index[d]] for d in read.ids]).astype(np.float32, copy=False)  # type: ignore[misc]
            for per_kind in found
        ]

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


def _pooled_first(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dense batch row that starts with the pooled embedding: (class + patch tokens, pooled)."""
    return row[1:], row[0]


def _seconds(value: float) -> str:
    return str(max(1, int(np.ceil(value))))
