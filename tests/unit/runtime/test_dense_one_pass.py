"""One image-tower pass for an image needed both pooled and dense (a collection's add, /score/dense):
where the towers allow it, the dense pass's pooled row is what the pooled tower computes, so the
one pass gives the values two passes gave; where they do not, the runtime keeps two passes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipcore.backends.parity import probe_images
from clipcore.backends.select import select_towers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from service.config import Settings
from service.runtime.assembly import build_runtime
from service.runtime.metrics import ServiceMetrics


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any) -> ModelBundle:
    root = tmp_path_factory.mktemp("one-pass-store")
    publish_dense_model(root)
    return ModelBundle.load(ModelStore(root), "dense@production")


@pytest.mark.parametrize(
    ("backend", "precision", "one_pass"),
    [("torch", "fp32", True), ("onnx", "fp32", True), ("onnx", "int8", True), ("torch", "bf16", False)],
)
def test_the_dense_pass_gives_the_pooled_embedding_where_the_towers_compute_it_alike(
    bundle: ModelBundle, tmp_path: Path, backend: str, precision: str, one_pass: bool
) -> None:
    towers, _ = select_towers(
        bundle, backend=backend, precision=precision, device="cpu", onnx_cache_root=tmp_path, threads=1
    )
    assert towers.pooled_in_dense_pass is one_pass
    pixels = probe_images(bundle.image_size)
    both = towers.dense_images_with_pooled(pixels)
    np.testing.assert_allclose(both[:, 1:], towers.dense_images(pixels), atol=1e-6)
    pooled = towers.encode_images(pixels)
    if one_pass:
        np.testing.assert_allclose(both[:, 0], pooled, atol=1e-5)
    else:  # bf16's pooled tower differs from the fp32 dense pass by more than float rounding
        assert np.abs(both[:, 0] - pooled).max() > 1e-4


def test_the_runtime_runs_one_pass_only_where_the_towers_allow_it(bundle: ModelBundle, tmp_path: Path) -> None:
    pixels = probe_images(bundle.image_size)[:1]
    tokens = bundle.encode_dense_images(pixels).shape[1]  # class + patches
    for precision, one_pass in (("fp32", True), ("bf16", False)):
        towers, described = select_towers(
            bundle, backend="torch", precision=precision, device="cpu", onnx_cache_root=tmp_path, threads=1
        )
        runtime = build_runtime(bundle, Settings(), ServiceMetrics(), towers, described)
        assert runtime.dense_gives_pooled is one_pass
        assert runtime.dense_image_batcher is not None
        rows = asyncio.run(submit(runtime.dense_image_batcher, list(pixels)))
        assert rows[0].shape[0] == tokens + (1 if one_pass else 0)
        runtime.executor.shutdown()


async def submit(batcher: Any, items: list[np.ndarray]) -> list[np.ndarray]:
    await batcher.start()
    try:
        return list(await batcher.submit(items))
    finally:
        await batcher.stop(drain=True)
