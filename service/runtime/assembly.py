"""Building a loaded version's runtime: its serving towers, warm-up, batchers on one model thread.

A ``ModelRuntime`` (``service.runtime.model_runtime``) is one loaded version with its own batchers
(one for images, one per text-encoder variant, and for a version with a DCSM scorer one each for
dense image and dense text features) sharing a single worker thread. Each runtime has a thread of
its own: in a served set of several models, a request for one model never queues behind another
model's batch (docs/benchmarks.md measures why).

The pooled image and text batchers call the towers the settings pick (``serving_towers``):
torch fp32, torch under bf16/fp16 autocast, or ONNX Runtime (fp32, or an int8 image tower).
Anything but torch fp32 must pass the parity gate (every probe embedding within cosine 0.999 of
torch fp32) while the version loads; a version that fails it is refused like one that fails
warm-up. With ONNX, DCSM's dense features (every token and patch) come from their own exported
graphs, gated per token the same way; under bf16/fp16 they stay on torch fp32 (the scorer was
trained on fp32 features). YUKINO's inverter and prompts always run on torch.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import torch

from clipcore.backends.auto import Interrupted, Pace
from clipcore.backends.base import ServingTowers
from clipcore.backends.residency import release_unserved, trim_heap
from clipcore.backends.select import select_towers
from clipcore.backends.torch_towers import AUTOCAST_DTYPES, TorchTowers, resolve_device
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from service.config import Settings
from service.runtime.batcher import DynamicBatcher
from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime
from service.runtime.roles import CANARY, PRIMARY, SHADOW

__all__ = ["AUTOCAST_DTYPES", "CANARY", "PRIMARY", "SHADOW", "ModelRuntime", "TorchTowers", "build_runtime",
           "resolve_device", "serving_towers", "warm_up"]  # fmt: skip

log = logging.getLogger("service.runtime")

IMAGE_BATCHER = "image"
DENSE_IMAGE_BATCHER = "dense-image"
YUKINO_BATCHER = "yukino-image"
DENSE_TEXT_BATCHER = "dense-text"
WARMUP_TEXT = "a red circle to the left of a blue square"


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
    serving = towers if towers is not None else ServingTowers(bundle, TorchTowers(bundle), pooled_in_dense_pass=True)
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
        # they still share the one model thread, so they never run at the same time. Where the
        # dense pass also gives the pooled embedding, its batches return both (row 0 pooled): an
        # image needed both way (a collection's add, /score/dense) costs one tower pass, not two.
        dense_images = serving.dense_images_with_pooled if serving.pooled_in_dense_pass else serving.dense_images
        runtime.dense_image_batcher = batcher(DENSE_IMAGE_BATCHER, _stacked(dense_images), b.max_batch_images)
        runtime.dense_gives_pooled = serving.pooled_in_dense_pass
        runtime.dense_text_batcher = batcher(DENSE_TEXT_BATCHER, serving.dense_texts, b.max_batch_texts)
    if bundle.yukino is not None:
        runtime.yukino_batcher = batcher(YUKINO_BATCHER, _stacked(serving.yukino_prompts), b.max_batch_images)
    return runtime


def weight_bytes(bundle: ModelBundle) -> int:
    """Bytes of the version's weights as loaded (every tensor of its torch modules, each storage
    once; text-encoder variants share the image tower's): what the memory budget counts for it.
    Measured before the serving path frees the towers it does not call, so a version costs the
    same whichever backend serves it (ONNX Runtime holds its own copy of what torch freed)."""
    modules = [bundle.model, *bundle.text_models.values(), bundle.dcsm, bundle.dense, bundle.yukino]
    seen: dict[int, int] = {}
    for module in modules:
        if not isinstance(module, torch.nn.Module):
            continue
        for tensor in [*module.parameters(), *module.buffers()]:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
