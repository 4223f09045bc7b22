"""One loaded model version as the service runs it: batchers over its towers on one model thread.

A ``ModelRuntime`` is one loaded version with its own batchers (one for images, one per
text-encoder variant, and for a version with a DCSM scorer one each for dense image and dense
text features) sharing a single worker thread, so model calls of one version never overlap.
Each runtime has a thread of its own: in a served set of several models, a request for one
model never queues behind another model's batch (docs/benchmarks.md measures why).

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch

from clipcore.backends.auto import Interrupted, Pace
from clipcore.backends.base import AutoDecision, ServingTowers
from clipcore.backends.residency import release_unserved, trim_heap
from clipcore.backends.select import select_towers
from clipcore.backends.torch_towers import AUTOCAST_DTYPES, TorchTowers, resolve_device
from clipcore.errors import ClipError, ErrorCode
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from service.config import Settings
from service.runtime.batcher import DynamicBatcher
from service.runtime.metrics import ServiceMetrics

__all__ = ["AUTOCAST_DTYPES", "CANARY", "PRIMARY", "SHADOW", "ModelRuntime", "TorchTowers", "build_runtime",
           "resolve_device", "serving_towers", "warm_up"]  # fmt: skip

log = logging.getLogger("service.runtime")
T = TypeVar("T")

IMAGE_BATCHER = "image"
DENSE_IMAGE_BATCHER = "dense-image"
YUKINO_BATCHER = "yukino-image"
DENSE_TEXT_BATCHER = "dense-text"
WARMUP_TEXT = "a red circle to the left of a blue square"
# What a loaded version does for its alias: answers every request the canary does not take, a
# weighted share of the callers, or re-runs a sample of the requests after they were answered.
PRIMARY, CANARY, SHADOW = "primary", "canary", "shadow"


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
    auto: AutoDecision | None = None  # how precision=auto / backend=auto picked it (GET /models shows it)
    load_s: float = 0.0  # seconds from reading the store to serving, for Retry-After while one loads
    role: str = PRIMARY
    entry: str = ""  # the served-set entry it serves (``default@production``): its metrics' `model` label

    @property
    def ref(self) -> str:
        return self.bundle.ref

    def set_role(self, role: str) -> None:
        """Take ``role``; a canary's or shadow's batchers are named ``canary:image``,
        ``shadow:text-base`` ..., so their queues and batch times are told apart from the primary's
        (whose plain names dashboards and autoscaling read), and lose the prefix when promoted."""
        self.role = role
        for batcher in self.batchers:
            base = batcher.name.rpartition(":")[2]
            batcher.name = base if role == PRIMARY else f"{role}:{base}"

    @contextlib.contextmanager
    def held(self) -> Iterator[ModelRuntime]:
        """Count one user (a request, a shadow run) until the block ends: a retired version is
        stopped only once it is idle."""
        self.active += 1
        self.idle.clear()
        try:
            yield self
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle.set()

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
            raise ClipError(ErrorCode.not_ready, "model is being replaced; retry", retry_after=1) from None


def serving_towers(
    bundle: ModelBundle,
    settings: Settings,
    device: str,
    store: ModelStore | None = None,
    *,
    keep_torch: bool = False,
    interrupted: Interrupted | None = None,
    pace: Pace | None = None,
) -> tuple[ServingTowers, str]:
    """The towers for ``settings.backend`` / ``precision``, behind the parity gate, and a
    description for the log. Raises ``BackendError`` for a version that fails the gate. With
    ``store`` (the version's), ``auto`` uses a decision ``clip-train tune`` shared there for this
    CPU kind before timing anything here. The torch towers the chosen path no longer calls are
    freed (``clipcore.backends.residency``) unless ``keep_torch`` (a benchmark that times torch
    fp32 beside them), and the heap memory the load freed is handed back to the system.
    ``interrupted``: ``auto``'s timing stops with ``TimingInterrupted`` once it says so; ``pace``:
    called after each of ``auto``'s builds and timed calls (``clipcore.backends.auto.Pace``)."""
    towers, described = select_towers(
        bundle,
        backend=settings.backend,
        precision=settings.precision,
        device=device,
        onnx_cache_root=settings.onnx_cache_root(),
        threads=settings.torch_threads or None,
        max_batch=settings.batching.max_batch_images,
        store=store,
        interrupted=interrupted,
        pace=pace,
    )
    if not keep_torch:
        release_unserved(towers)
    # Loading leaves the state dict's temporaries (fp16 -> fp32 copies) in freed heap that glibc keeps:
    # about 480 MiB for a ViT-B-32 (docs/benchmarks-notebook.md, "Memory per served model").
    trim_heap()
    return towers, described


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


def _stacked(encode: Callable[[np.ndarray], np.ndarray]) -> Callable[[list[np.ndarray]], np.ndarray]:
    """A batch function over single images: stacks them for ``encode`` (one row per image back)."""
    return lambda items: encode(np.stack(items))


def build_runtime(
    bundle: ModelBundle,
    settings: Settings,
    metrics: ServiceMetrics,
    towers: ServingTowers | None = None,
    backend: str = "torch fp32",
    model: str | None = None,
) -> ModelRuntime:
    """One batcher per kind of batch, each calling its named method of ``towers`` (default: the
    bundle's torch fp32 towers), all on one model thread of this runtime's own: a version of
    another model in the served set never waits for this one's batches. ``model`` is the
    served-set entry its metrics are labelled with (default: the version's ``name@version``)."""
    b = settings.batching
    recorder = metrics.for_model(model if model is not None else bundle.ref)
    serving = towers if towers is not None else ServingTowers(bundle, TorchTowers(bundle))
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=f"model-{bundle.name}-{bundle.version}",
        initializer=_model_thread_init,
        initargs=(settings.torch_threads,),
    )

    def batcher(
        name: str, fn: Callable[[list[Any]], Iterable[np.ndarray]], max_batch: int
    ) -> DynamicBatcher[Any, np.ndarray]:
        return DynamicBatcher(name, fn, max_batch=max_batch, max_wait_ms=b.max_wait_ms, max_queue=b.max_queue,
                              max_delay_s=b.max_queue_delay_s, executor=executor, metrics=recorder)  # fmt: skip

    images = batcher(IMAGE_BATCHER, _stacked(serving.encode_images), b.max_batch_images)
    texts = {
        v: batcher(f"text-{v}", partial(serving.encode_texts, encoder=v), b.max_batch_texts) for v in bundle.text_models
    }
    runtime = ModelRuntime(bundle, images, texts, executor, backend=backend, auto=serving.auto, entry=recorder.model)
    if bundle.dcsm is not None:
        # Dense and pooled features are different model calls, so they cannot share a batch;
        # they still share the one model thread, so they never run at the same time.
        runtime.dense_image_batcher = batcher(DENSE_IMAGE_BATCHER, _stacked(serving.dense_images), b.max_batch_images)
        runtime.dense_text_batcher = batcher(DENSE_TEXT_BATCHER, serving.dense_texts, b.max_batch_texts)
    if bundle.yukino is not None:
        runtime.yukino_batcher = batcher(YUKINO_BATCHER, _stacked(serving.yukino_prompts), b.max_batch_images)
    return runtime
