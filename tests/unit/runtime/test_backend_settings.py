"""Backend, precision and thread settings: validation, and what they change on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from clipcore.backends.onnx import ensure_towers
from clipcore.backends.onnx_export import SIDECAR, export_bundle, export_dir_for
from clipcore.backends.parity import (
    PARITY_THRESHOLD,
    PROBE_TEXTS,
    check_dense_parity,
    check_parity,
    probe_images,
    require_parity,
)
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from service.config import Settings
from service.runtime.assembly import TorchTowers, build_runtime
from service.runtime.metrics import ServiceMetrics

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> ModelBundle:
    root = tmp_path_factory.mktemp("backend-store")
    publish_model(root, "tiny", seed=21)
    return ModelBundle.load(ModelStore(root), "tiny@production")


# ----------------------------------------------------------------------------- settings
def test_defaults_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = Settings()
    assert (s.backend, s.precision, s.torch_threads, s.onnx_cache_dir) == ("torch", "fp32", 0, None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Settings().onnx_cache_root() == tmp_path / "clip-service" / "onnx"
    monkeypatch.setenv("CLIP_BACKEND", "onnx")
    monkeypatch.setenv("CLIP_TORCH_THREADS", "1")
    monkeypatch.setenv("CLIP_ONNX_CACHE_DIR", str(tmp_path / "exports"))
    s = Settings()
    assert (s.backend, s.torch_threads, s.onnx_cache_root()) == ("onnx", 1, tmp_path / "exports")
    monkeypatch.delenv("CLIP_BACKEND")
    monkeypatch.setenv("CLIP_PRECISION", "bf16")
    assert Settings().precision == "bf16"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"backend": "tensorrt"}, "backend"),
        ({"precision": "int4"}, "precision"),
        ({"precision": "int8", "device": "cuda"}, "int8 runs on the CPU"),
        ({"backend": "onnx", "precision": "int8", "device": "cuda"}, "int8 runs on the CPU"),
        ({"torch_threads": -1}, "torch_threads"),
        ({"precision": "fp16"}, "fp16 needs a CUDA device"),
        ({"precision": "fp16", "device": "cpu"}, "use bf16 on CPU"),
        ({"backend": "onnx", "precision": "bf16"}, "backend=onnx runs fp32 or int8"),
        ({"backend": "auto", "precision": "int8", "device": "cuda:1"}, "use fp16 on CUDA"),
        ({"backend": "auto", "precision": "fp16", "device": "cpu"}, "use bf16 on CPU"),
    ],
)
def test_bad_values_are_rejected_with_a_clear_message(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**overrides)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "auto"])
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_precision_auto_is_valid_with_any_backend_and_device(backend: str, device: str) -> None:
    # auto tries only what fits the device (no int8 on CUDA, no fp16 on a CPU): nothing to refuse here.
    assert Settings(precision="auto", backend=backend, device=device).precision == "auto"


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to CUDA here, where fp16 is allowed")
def test_fp16_with_auto_device_and_no_cuda_is_rejected() -> None:
    with pytest.raises(ValidationError, match="fp16 needs a CUDA device"):
        Settings(device="auto", precision="fp16")


def test_python_m_service_reports_a_bad_precision_and_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLIP_PRECISION": "fp16", "CLIP_DEVICE": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "service"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "invalid settings" in proc.stderr and "fp16 needs a CUDA device" in proc.stderr


# ----------------------------------------------------------------------------- threads
@pytest.mark.parametrize("threads", [1, 2])
async def test_torch_threads_reach_the_model_thread(bundle: ModelBundle, threads: int) -> None:
    runtime = build_runtime(bundle, Settings(torch_threads=threads), ServiceMetrics())
    await runtime.start()
    try:
        assert await runtime.run(torch.get_num_threads) == threads
        # The batchers run on that same thread: a real encode goes through it.
        image = probe_images(bundle.image_size, n=1)[0]
        vector = await runtime.image_batcher.submit([image])
        np.testing.assert_allclose(vector[0], bundle.encode_images(image[None])[0], atol=1e-6)
    finally:
        await runtime.stop()


# ----------------------------------------------------------------------------- towers behind the gate
def test_torch_fp32_towers_are_the_bundle_and_bf16_passes_the_gate(bundle: ModelBundle) -> None:
    images = probe_images(bundle.image_size, n=3)
    tokens = bundle.tokenize(list(PROBE_TEXTS))
    fp32 = TorchTowers(bundle)
    np.testing.assert_array_equal(fp32.encode_images(images), bundle.encode_images(images))
    np.testing.assert_array_equal(fp32.encode_tokens(tokens, "pcclip"), bundle.encode_tokens(tokens, "pcclip"))
    bf16 = TorchTowers(bundle, torch.bfloat16)
    assert bf16.variants == ["pcclip"]
    low = bf16.encode_images(images)
    assert not np.array_equal(low, bundle.encode_images(images))  # really computed in bf16
    np.testing.assert_allclose(np.linalg.norm(low, axis=1), 1.0, atol=1e-5)  # normalised in fp32
    assert require_parity(bundle, bf16, label="torch bf16") >= PARITY_THRESHOLD


def test_onnx_towers_cover_every_text_variant(bundle: ModelBundle, tmp_path: Path) -> None:
    target = export_dir_for(tmp_path, bundle)
    assert target.parent == tmp_path / "tiny" and target.name.startswith(f"{bundle.version}-")
    towers = ensure_towers(bundle, target, device="cpu", threads=1, variants=True)
    assert json.loads((target / SIDECAR).read_text())["variants"] == {"pcclip": "text-pcclip.onnx"}
    assert set(towers.variants) == {"pcclip"} and check_parity(bundle, towers) >= PARITY_THRESHOLD
    tokens = bundle.tokenize(["a red circle.", "a blue square to the left of a green cross"])
    for variant in ("base", "pcclip"):
        key = None if variant == bundle.default_text_encoder else variant
        np.testing.assert_allclose(towers.encode_tokens(tokens, key), bundle.encode_tokens(tokens, variant), atol=1e-4)
    # The variants differ, so a mix-up between their graphs would show.
    assert not np.allclose(towers.encode_tokens(tokens, "pcclip"), towers.encode_tokens(tokens, None), atol=1e-3)
    digest = (target / "text-pcclip.onnx").read_bytes()
    ensure_towers(bundle, target, device="cpu", threads=1, variants=True)  # reused, not exported again
    assert (target / "text-pcclip.onnx").read_bytes() == digest


def test_int8_export_quantises_the_image_tower_only_and_passes_the_gate(bundle: ModelBundle, tmp_path: Path) -> None:
    import onnx

    fp32_dir, int8_dir = export_dir_for(tmp_path, bundle), export_dir_for(tmp_path, bundle, "int8")
    assert int8_dir.name.endswith("-int8") and int8_dir.parent == fp32_dir.parent  # kept side by side
    fp32 = ensure_towers(bundle, fp32_dir, device="cpu", threads=1)
    int8 = ensure_towers(bundle, int8_dir, device="cpu", threads=1, variants=True, image_precision="int8")
    assert json.loads((int8_dir / SIDECAR).read_text())["image_precision"] == "int8"
    ops = {node.op_type for node in onnx.load(str(int8_dir / "image.onnx")).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    text_ops = {node.op_type for node in onnx.load(str(int8_dir / "text.onnx")).graph.node}
    assert "MatMulInteger" not in text_ops
    images = probe_images(bundle.image_size)
    quantised, reference = int8.encode_images(images), bundle.encode_images(images)
    assert not np.allclose(quantised, fp32.encode_images(images), atol=1e-5)  # really computed in int8
    assert (quantised * reference).sum(axis=1).min() >= PARITY_THRESHOLD
    # An fp32 export found where int8 is wanted (or the reverse) is re-exported, not served.
    ensure_towers(bundle, fp32_dir, device="cpu", image_precision="int8")
    assert json.loads((fp32_dir / SIDECAR).read_text())["image_precision"] == "int8"


def test_dense_export_needs_a_dcsm_component(bundle: ModelBundle, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no DCSM component"):
        export_bundle(bundle, tmp_path, dense=True)


def test_dense_graphs_feed_the_dcsm_encoder_within_the_gate(tmp_path: Path, publish_dense_model: Any) -> None:
    publish_dense_model(tmp_path / "store")
    bundle = ModelBundle.load(ModelStore(tmp_path / "store"), "dense@production")
    assert bundle.dense is not None
    texts = ["a red circle to the left of a blue square", "a square without a triangle"]
    images = probe_images(bundle.image_size, n=3)
    torch_text, torch_images = bundle.encode_dense_texts(texts), bundle.encode_dense_images(images)
    towers = ensure_towers(bundle, tmp_path / "export", device="cpu", threads=1, dense=True)
    assert check_dense_parity(bundle, towers) >= PARITY_THRESHOLD
    onnx_text, onnx_images = bundle.encode_dense_texts(texts, towers), bundle.encode_dense_images(images, towers)
    assert onnx_text.shape == torch_text.shape and onnx_images.shape == torch_images.shape
    np.testing.assert_allclose(onnx_text, torch_text, atol=1e-4)  # padding rows stay exactly zero
    np.testing.assert_allclose(onnx_images, torch_images, atol=1e-4)
    # An export without the dense graphs is completed when they are wanted.
    ensure_towers(bundle, tmp_path / "pooled-only", device="cpu")
    assert not (tmp_path / "pooled-only" / "dense_image.onnx").exists()
    ensure_towers(bundle, tmp_path / "pooled-only", device="cpu", dense=True)
    assert (tmp_path / "pooled-only" / "dense_image.onnx").exists()


def test_an_export_without_the_variants_is_completed(bundle: ModelBundle, tmp_path: Path) -> None:
    target = tmp_path / "partial"
    ensure_towers(bundle, target, device="cpu")  # the image and default text towers only
    assert not (target / "text-pcclip.onnx").exists()
    towers = ensure_towers(bundle, target, device="cpu", variants=True)
    assert (target / "text-pcclip.onnx").exists() and set(towers.variants) == {"pcclip"}


def test_onnx_backend_without_onnxruntime_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(ValidationError, match=r"needs onnxruntime: install the project's `cpu` extra"):
        Settings(backend="onnx")
    Settings(backend="torch")  # the torch backend does not need it
    # With auto, torch is the runtime left: fp32, and int8 on torch's quantised linears.
    assert Settings(backend="auto").backend == Settings(backend="auto", precision="int8").backend == "auto"


@pytest.mark.parametrize(
    ("precision", "device"), [("fp32", "cpu"), ("bf16", "cpu"), ("int8", "cpu"), ("fp32", "cuda"), ("fp16", "cuda")]
)
def test_backend_auto_accepts_every_precision_its_runtimes_serve(precision: str, device: str) -> None:
    assert (Settings(backend="auto", precision=precision, device=device).backend) == "auto"


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:3", "auto"])
def test_devices_include_a_numbered_cuda_device(device: str) -> None:
    assert Settings(device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CUDA", "cuda:1 "])
def test_unknown_devices_are_rejected(device: str) -> None:
    with pytest.raises(ValidationError, match="device"):
        Settings(device=device)


def test_onnx_providers_follow_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    from clipcore.backends.onnx import providers

    both = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: both)
    assert providers("cuda:2") == [("CUDAExecutionProvider", {"device_id": "2"}), "CPUExecutionProvider"]
    assert providers("cuda") == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert providers("cpu") == ["CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert providers("cuda:1") == ["CPUExecutionProvider"]  # a CPU-only onnxruntime build
