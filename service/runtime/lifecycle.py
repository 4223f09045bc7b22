"""Which model version serves, and how it is replaced without failing a request.

A ``ModelRuntime`` is one loaded version with its own batchers (one for images, one per
text-encoder variant, and for a version with a DCSM scorer one each for dense image and dense
text features) sharing a single worker thread, so model calls of one version never overlap.
Requests ``acquire`` the current runtime and keep that reference to the end: a swap never
changes the model under a running request, and the old runtime is only stopped once the
requests holding it are done (or after ``drain_timeout_s``).

The ``ModelManager`` loads the configured ref at start (retrying until it succeeds, while
/readyz says 503) and, for ``name@alias`` refs, polls the alias. A new target is loaded beside
the serving one in a thread (checksums verified by the store), warmed up, and swapped in. A
version that fails verification or warm-up is refused, logged and counted, and the old one
keeps serving; it is not retried until the alias moves again (versions are immutable).

The pooled image and text batchers call the towers the settings pick (``serving_towers``):
torch fp32, torch under bf16/fp16 autocast, or ONNX Runtime (fp32, or an int8 image tower).
Anything but torch fp32 must pass the parity gate (every probe embedding within cosine 0.999 of
torch fp32) while the version loads; a version that fails it is refused like one that fails
warm-up. With ONNX, DCSM's dense features (every token and patch) come from their own exported
graphs, gated per token the same way; under bf16/fp16 they stay on torch fp32 (the scorer was
trained on fp32 features). YUKINO's inverter and prompts always run on torch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from model_store import ModelStore, parse_ref
from service.api.errors import ApiError, ErrorCode
from service.config import Settings
from service.encoders.bundle import ModelBundle
from service.encoders.clip_model import image_features, normalize, text_features
from service.encoders.onnx_backend import (
    ImagePrecision,
    PooledTowers,
    ensure_towers,
    export_dir_for,
    require_parity,
)
from service.encoders.preprocess import OPENAI_MEAN, OPENAI_STD, normalize_uint8
from service.runtime.batcher import DynamicBatcher
from service.runtime.metrics import ServiceMetrics

log = logging.getLogger("service.lifecycle")
T = TypeVar("T")

IMAGE_BATCHER = "image"
DENSE_IMAGE_BATCHER = "dense-image"
YUKINO_BATCHER = "yukino-image"
DENSE_TEXT_BATCHER = "dense-text"
WARMUP_TEXT = "a red circle to the left of a blue square"
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(eq=False)
class ModelRuntime:
    bundle: ModelBundle
    image_batcher: DynamicBatcher[np.ndarray, np.ndarray]
    text_batchers: dict[str, DynamicBatcher[str, np.ndarray]]
    executor: concurrent.futures.ThreadPoolExecutor
    # Only for versions with a DCSM component; None otherwise.
    dense_image_batcher: DynamicBatcher[np.ndarray, np.ndarray] | None = None
    # Only for versions with a YUKINO component: images -> (2, D) yes / no prompt features.
    yukino_batcher: DynamicBatcher[np.ndarray, np.ndarray] | None = None
    dense_text_batcher: DynamicBatcher[str, np.ndarray] | None = None
    active: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    backend: str = "torch fp32"  # what the pooled batchers call, for logs

    @property
    def ref(self) -> str:
        return self.bundle.ref

    @property
    def batchers(self) -> list[DynamicBatcher]:  # type: ignore[type-arg]
        extra = (self.dense_image_batcher, self.dense_text_batcher, self.yukino_batcher)
        dense = [b for b in extra if b is not None]
        return [self.image_batcher, *self.text_batchers.values(), *dense]

    async def start(self) -> None:
        self.idle.set()
        for batcher in self.batchers:
            await batcher.start()

    async def stop(self) -> None:
        for batcher in self.batchers:
            await batcher.stop(drain=True)
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run model work (not batched, e.g. DCSM scoring) on this version's model thread."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        except RuntimeError as exc:
            if "shutdown" not in str(exc):
                raise
            # Only after a drain timeout: the version was stopped under a slow request.
            raise ApiError(
                ErrorCode.not_ready, "model is being replaced; retry", headers={"Retry-After": "1"}
            ) from None


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class TorchTowers:
    """The bundle's pooled torch towers as the batchers call them, under autocast when ``dtype`` is set."""

    def __init__(self, bundle: ModelBundle, dtype: torch.dtype | None = None) -> None:
        self.bundle, self.dtype = bundle, dtype
        self.variants = [v for v in bundle.text_models if v != bundle.default_text_encoder]

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        assert self.dtype is not None
        with torch.no_grad(), torch.autocast(torch.device(self.bundle.device).type, dtype=self.dtype):
            yield

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            return self.bundle.encode_images(images)
        pre = self.bundle.manifest.preprocess
        mean, std = pre.get("mean", OPENAI_MEAN), pre.get("std", OPENAI_STD)
        x = normalize_uint8(images, mean, std).to(self.bundle.device)
        with self._autocast():
            features = image_features(self.bundle.model, x)[0]
        # Normalised in fp32: a norm taken in bf16 can be off by a few tenths of a percent, scaling every score.
        return normalize(features.float()).cpu().numpy()

    def encode_tokens(self, tokens: torch.Tensor | np.ndarray, variant: str | None = None) -> np.ndarray:
        tokens = torch.as_tensor(tokens)
        if self.dtype is None:
            return self.bundle.encode_tokens(tokens, variant)
        with self._autocast():
            features = text_features(self.bundle.text_model(variant), tokens.to(self.bundle.device))[0]
        return normalize(features.float()).cpu().numpy()


def serving_towers(bundle: ModelBundle, settings: Settings, device: str) -> tuple[PooledTowers, str]:
    """The pooled towers for ``settings.backend`` / ``precision``, behind the parity gate, and a
    description for the log. Raises ``BackendError`` for a version that fails the gate."""
    if settings.backend == "onnx":
        # A first export turns torch's MHA fast path off process-wide while it traces (see export_towers):
        # a version serving meanwhile computes on the math path, equal within float rounding.
        image_precision: ImagePrecision = "int8" if settings.precision == "int8" else "fp32"
        export_dir = export_dir_for(settings.onnx_cache_root(), bundle, image_precision)
        dense = bundle.dense is not None
        towers = ensure_towers(
            bundle,
            export_dir,
            device,
            settings.torch_threads or None,
            variants=True,
            image_precision=image_precision,
            dense=dense,
        )
        if bundle.dense is not None:
            bundle.dense.runner = towers  # /score/dense reads its features from the gated dense graphs
        graphs = "pooled and dense" if dense else "pooled"
        return towers, f"onnx {image_precision} ({graphs}; {', '.join(towers.providers)}; export {export_dir})"
    if settings.precision == "fp32":
        return TorchTowers(bundle), "torch fp32"
    low = TorchTowers(bundle, AUTOCAST_DTYPES[settings.precision])
    worst = require_parity(bundle, low, label=f"torch {settings.precision}")
    return low, f"torch {settings.precision} (min probe cosine {worst:.6f})"


def _model_thread_init(threads: int) -> None:
    # OpenMP's thread count is a per-thread setting: it has to be set on the model thread itself.
    if threads > 0:
        torch.set_num_threads(threads)


def warm_up(bundle: ModelBundle) -> None:
    """Run every tower once (first calls allocate and compile); refuse non-finite outputs."""
    size = bundle.image_size
    image = bundle.encode_images(np.full((1, size, size, 3), 127, dtype=np.uint8))
    outputs = [image]
    for variant in bundle.text_models:
        outputs.append(bundle.encode_texts(["a photo of a red circle."], variant))
    if bundle.dcsm is not None:
        tokens = bundle.encode_dense_images(np.full((1, size, size, 3), 127, dtype=np.uint8))
        texts = bundle.encode_dense_texts([WARMUP_TEXT])
        scores, _ = bundle.score_dense(tokens[0], texts, bundle.dense_layouts([WARMUP_TEXT]))
        outputs += [tokens, texts]
        if not np.all(np.isfinite(scores)):
            raise ValueError(f"warm-up of the DCSM scorer of {bundle.ref} produced non-finite scores")
    for out in outputs:
        if out.shape[-1] != bundle.embed_dim or not np.all(np.isfinite(out)):
            raise ValueError(f"warm-up of {bundle.ref} produced invalid embeddings {out.shape}")


def build_runtime(
    bundle: ModelBundle,
    settings: Settings,
    metrics: ServiceMetrics,
    towers: PooledTowers | None = None,
    backend: str = "torch fp32",
) -> ModelRuntime:
    """Batchers over ``towers`` (default: the bundle's torch fp32 towers) on one model thread."""
    b = settings.batching
    pooled: PooledTowers = towers if towers is not None else TorchTowers(bundle)
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=f"model-{bundle.version}",
        initializer=_model_thread_init,
        initargs=(settings.torch_threads,),
    )

    def encode_images(items: list[np.ndarray]) -> list[np.ndarray]:
        return list(pooled.encode_images(np.stack(items)))

    def text_fn(variant: str):
        key = None if variant == bundle.default_text_encoder else variant  # towers take None for the default

        def encode_texts(items: list[str]) -> list[np.ndarray]:
            tokens, _ = bundle.tokenize(items)
            return list(pooled.encode_tokens(tokens, key))

        return encode_texts

    common = dict(max_wait_ms=b.max_wait_ms, max_queue=b.max_queue, max_delay_s=b.max_queue_delay_s,
                  executor=executor, metrics=metrics)  # fmt: skip
    images = DynamicBatcher(IMAGE_BATCHER, encode_images, max_batch=b.max_batch_images, **common)  # type: ignore[arg-type]
    texts = {
        v: DynamicBatcher(f"text-{v}", text_fn(v), max_batch=b.max_batch_texts, **common)  # type: ignore[arg-type]
        for v in bundle.text_models
    }
    runtime = ModelRuntime(bundle, images, texts, executor, backend=backend)
    if bundle.dcsm is not None:
        # Dense and pooled features are different model calls, so they cannot share a batch;
        # they still share the one model thread, so they never run at the same time.
        def dense_images(items: list[np.ndarray]) -> list[np.ndarray]:
            return list(bundle.encode_dense_images(np.stack(items)))

        def dense_texts(items: list[str]) -> list[np.ndarray]:
            return list(bundle.encode_dense_texts(items))

        runtime.dense_image_batcher = DynamicBatcher(
            DENSE_IMAGE_BATCHER,
            dense_images,
            max_batch=b.max_batch_images,
            **common,  # type: ignore[arg-type]
        )
        runtime.dense_text_batcher = DynamicBatcher(
            DENSE_TEXT_BATCHER,
            dense_texts,
            max_batch=b.max_batch_texts,
            **common,  # type: ignore[arg-type]
        )
    if bundle.yukino is not None:

        def yukino_prompts(items: list[np.ndarray]) -> list[np.ndarray]:
            return list(bundle.yukino_prompts(np.stack(items)))

        runtime.yukino_batcher = DynamicBatcher(
            YUKINO_BATCHER, yukino_prompts, max_batch=b.max_batch_images, **common  # type: ignore[arg-type]
        )
    return runtime


class ModelManager:
    def __init__(self, settings: Settings, store: ModelStore, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.name, self.selector = parse_ref(settings.model)
        self.device = resolve_device(settings.device)
        self.current: ModelRuntime | None = None
        self.alias: str | None = None  # set once we know the selector names an alias
        self.last_error: str | None = None
        # Why the alias could not be read on the last poll (None: it could). The serving version
        # keeps serving meanwhile; /readyz and the store_watch_ok gauge report it.
        self.watch_error: str | None = None
        self._watch_logged = 0.0
        self._refused: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def ready(self) -> bool:
        return self.current is not None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="model-manager")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # a watcher that died must not stop the rest of the shutdown
                log.exception("the model watcher had failed")
        for task in list(self._retiring):
            task.cancel()
        current, self.current = self.current, None
        if current is not None:
            await current.stop()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[ModelRuntime]:
        """The serving runtime, held for the whole request (no await between read and count)."""
        runtime = self.current
        if runtime is None:
            raise ApiError(ErrorCode.not_ready, self.not_ready_message(), headers={"Retry-After": "1"})
        runtime.active += 1
        runtime.idle.clear()
        try:
            yield runtime
        finally:
            runtime.active -= 1
            if runtime.active == 0:
                runtime.idle.set()

    def not_ready_message(self) -> str:
        detail = f": {self.last_error}" if self.last_error else ""
        return f"model {self.settings.model} is not loaded yet{detail}"

    def matches(self, requested: str, runtime: ModelRuntime) -> bool:
        """Whether a request's ``model`` field names the serving version."""
        accepted = {runtime.bundle.name, runtime.ref}
        if self.alias is not None:
            accepted.add(f"{runtime.bundle.name}@{self.alias}")
        return requested in accepted

    # ------------------------------------------------------------------ loading
    async def _run(self) -> None:
        last_logged = 0.0
        while self.current is None:
            try:
                name, version = await asyncio.to_thread(self.store.resolve, self.settings.model)
                aliases = await asyncio.to_thread(self.store.aliases, name)
                runtime = await self._load(name, version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep retrying: the store may be mounted or filled later
                error = f"{type(exc).__name__}: {exc}"
                # A new problem is an error; the same one again is repeated once a minute at most.
                if error != self.last_error or time.monotonic() - last_logged >= 60.0:
                    log.error(
                        "cannot load %s (%s); retrying every %.1fs",
                        self.settings.model,
                        error,
                        self.settings.watch_interval_s,
                    )
                    last_logged = time.monotonic()
                self.last_error = error
                await asyncio.sleep(self.settings.watch_interval_s)
                continue
            self.alias = self.selector if self.selector in aliases else None
            self._install(runtime, initial=True)
            # The watcher below runs in this frame for good: it must not keep the first version
            # alive after a swap (that held ~190 MB per swap for ViT-sized models).
            del runtime
        if self.alias is None:
            log.info("serving %s pinned (not an alias): no hot swap", self.current.ref)
            return
        while True:
            await asyncio.sleep(self.settings.watch_interval_s)
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher outlives any bug in one poll: the next one retries
                log.exception("watching %s@%s failed; retrying", self.name, self.alias)

    async def poll_once(self) -> None:
        assert self.alias is not None and self.current is not None
        try:
            target = await asyncio.to_thread(self.store.alias_target, self.name, self.alias)
        except Exception as exc:  # unreadable, half-written, missing: report, keep serving, retry
            self._watch_failed(f"{type(exc).__name__}: {exc}")
            return
        if self.watch_error is not None:
            log.info("alias %s@%s readable again", self.name, self.alias)
            self.watch_error = None
            self.metrics.set_store_watch(ok=True)
        if target is None or target == self.current.bundle.version or target == self._refused:
            return
        log.info("alias %s@%s moved to %s; loading beside %s", self.name, self.alias, target, self.current.ref)
        try:
            runtime = await self._load(self.name, target)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._refused = target
            self.metrics.model_swap("refused")
            log.error(
                "refusing %s@%s (%s: %s); %s keeps serving",
                self.name,
                target,
                type(exc).__name__,
                exc,
                self.current.ref,
            )
            return
        self._install(runtime, initial=False)

    def _watch_failed(self, error: str) -> None:
        # A new error is logged at once; the same one again once a minute at most.
        if error != self.watch_error or time.monotonic() - self._watch_logged >= 60.0:
            log.warning("cannot read alias %s@%s (%s); %s keeps serving, retrying every %.1fs", self.name,
                        self.alias, error, self.current.ref if self.current else "nothing", self.settings.watch_interval_s)
            self._watch_logged = time.monotonic()
        self.watch_error = error
        self.metrics.set_store_watch(ok=False)

    async def _load(self, name: str, version: str) -> ModelRuntime:
        started = time.perf_counter()

        def load_and_warm() -> tuple[ModelBundle, PooledTowers, str]:
            bundle = ModelBundle.load(self.store, f"{name}@{version}", self.device)  # verifies checksums
            if self.settings.warmup:
                warm_up(bundle)
            # Not skipped with warmup=False: the parity gate decides whether the version may serve.
            towers, backend = serving_towers(bundle, self.settings, self.device)
            return bundle, towers, backend

        bundle, towers, backend = await asyncio.to_thread(load_and_warm)
        runtime = build_runtime(bundle, self.settings, self.metrics, towers, backend)
        await runtime.start()
        log.info(
            "loaded %s on %s in %.2fs (backend %s; text encoders: %s; dcsm: %s)",
            bundle.ref,
            self.device,
            time.perf_counter() - started,
            backend,
            ", ".join(sorted(bundle.text_models)),
            "yes" if bundle.dcsm is not None else "no",
        )
        return runtime

    def _install(self, runtime: ModelRuntime, initial: bool) -> None:
        old, self.current = self.current, runtime  # one assignment: requests see old or new
        self.last_error = None
        self._refused = None
        self.metrics.set_serving_model(runtime.bundle.name, runtime.bundle.version, sorted(runtime.text_batchers))
        if not initial:
            self.metrics.model_swap("ok")
        if old is not None:
            log.info("swapped %s -> %s; draining the old version", old.ref, runtime.ref)
            task = asyncio.get_running_loop().create_task(self._retire(old))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, runtime: ModelRuntime) -> None:
        try:
            await asyncio.wait_for(runtime.idle.wait(), self.settings.drain_timeout_s)
        except TimeoutError:
            log.warning(
                "%s still has %d requests after %.0fs; stopping it anyway",
                runtime.ref,
                runtime.active,
                self.settings.drain_timeout_s,
            )
        await runtime.stop()
        log.info("retired %s", runtime.ref)
