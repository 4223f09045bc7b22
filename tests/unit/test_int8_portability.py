"""The int8 image graph answers the same on every x86-64 CPU kind, and a refused export is remembered.

onnxruntime picks its integer kernels by CPU: with VNNI (AVX-512 VNNI or AVX-VNNI) products are
summed in int32; on AVX2-only CPUs ``vpmaddubsw`` sums pairs of products in a saturating int16.
A test run on one machine sees only one of those paths, so the AVX2 path is run here under
``qemu-x86_64 -cpu EPYC-Milan`` (an AMD Zen 3: AVX2, no AVX-512, no VNNI), whatever the host is.
Only onnxruntime and numpy run under the emulator; the torch reference is computed natively.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from clipcore.backends import onnx as onnx_backend  # noqa: E402
from clipcore.backends import onnx_export, parity  # noqa: E402
from clipcore.backends.base import BackendError
from clipcore.backends.onnx import ensure_towers
from clipcore.backends.onnx_export import REFUSAL, export_bundle
from clipcore.backends.parity import PARITY_THRESHOLD, probe_images
from clipcore.models.bundle import ModelBundle  # noqa: E402
from model_store import ModelStore  # noqa: E402

AVX2_ONLY_CPU = "EPYC-Milan"
QEMU = shutil.which("qemu-x86_64")
needs_qemu = pytest.mark.skipif(
    QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) is needed to run the AVX2-only CPU path"
)

# Run under the emulator: encode the saved pixels with the given graph on one thread.
_ENCODE = textwrap.dedent(
    """
    import sys, numpy as np, onnxruntime as ort
    graph, pixels, out = sys.argv[1:4]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    np.save(out, session.run(None, {"pixels": np.load(pixels)})[0])
    """
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> ModelBundle:
    root = tmp_path_factory.mktemp("int8-store")
    publish_model(root, "tiny", seed=3)
    return ModelBundle.load(ModelStore(root), "tiny@production")


def _pixels(bundle: ModelBundle) -> np.ndarray:
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, (6, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)
    return np.concatenate([probe_images(bundle.image_size), noise])


def _encode_on(cpu: str, graph: Path, pixels: np.ndarray, workdir: Path) -> np.ndarray:
    np.save(workdir / "pixels.npy", pixels)
    script = workdir / "encode.py"
    script.write_text(_ENCODE)
    cmd = [str(QEMU), "-cpu", cpu, sys.executable, str(script), str(graph), str(workdir / "pixels.npy")]
    proc = subprocess.run([*cmd, str(workdir / "out.npy")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.load(workdir / "out.npy")


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


@needs_qemu
@pytest.mark.slow
def test_int8_graph_passes_the_gate_on_an_avx2_only_cpu(bundle: ModelBundle, tmp_path: Path) -> None:
    export_bundle(bundle, tmp_path / "int8", image_precision="int8")
    pixels = _pixels(bundle)
    reference = bundle.encode_images(pixels)
    emulated = _encode_on(AVX2_ONLY_CPU, tmp_path / "int8" / "image.onnx", pixels, tmp_path)
    native = onnx_backend.load_towers(tmp_path / "int8", device="cpu", threads=1).encode_images(pixels)
    assert _min_cosine(emulated, reference) >= PARITY_THRESHOLD
    # No int16 sum can saturate, so both kernel paths compute the same integers: the answers agree
    # far more closely than either agrees with fp32.
    assert _min_cosine(emulated, native) >= 0.99999


@needs_qemu
@pytest.mark.slow
def test_full_range_int8_weights_saturate_without_vnni(bundle: ModelBundle, tmp_path: Path) -> None:
    """The failure the 7-bit scheme prevents, shown on the same model: full-range int8 weights
    drift on the AVX2 path (so the test above can tell the two schemes apart)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    export_bundle(bundle, tmp_path / "fp32")
    full_range = tmp_path / "full-range.onnx"
    quantize_dynamic(
        str(tmp_path / "fp32" / "image.onnx"),
        str(full_range),
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
    )
    pixels = _pixels(bundle)
    emulated = _encode_on(AVX2_ONLY_CPU, full_range, pixels, tmp_path)
    assert _min_cosine(emulated, bundle.encode_images(pixels)) < PARITY_THRESHOLD


def test_a_refused_export_is_remembered_for_this_cpu(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export_dir = tmp_path / "export-int8"
    monkeypatch.setattr(parity, "check_parity", lambda bundle, towers: 0.98)
    with pytest.raises(BackendError, match="0.980000 < 0.999") as refused:
        ensure_towers(bundle, export_dir, device="cpu", image_precision="int8")
    message = str(refused.value)
    assert "CLIP_PRECISION=fp32" in message and onnx_backend.cpu_identity() in message
    record = json.loads((export_dir / REFUSAL).read_text())
    assert record["cpu"] == onnx_backend.cpu_identity()

    # A retry answers from the record: nothing is exported or probed again.
    def must_not_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a remembered refusal was exported again")

    monkeypatch.setattr(onnx_backend, "export_bundle", must_not_run)
    monkeypatch.setattr(onnx_backend, "load_towers", must_not_run)
    with pytest.raises(BackendError) as again:
        ensure_towers(bundle, export_dir, device="cpu", image_precision="int8")
    assert str(again.value) == message

    # Recorded on another CPU, the refusal is not trusted: the export is probed again (and passes).
    monkeypatch.undo()
    record["cpu"] = "x86_64 some other CPU"
    (export_dir / REFUSAL).write_text(json.dumps(record))
    towers = ensure_towers(bundle, export_dir, device="cpu", image_precision="int8")
    assert towers.encode_images(probe_images(bundle.image_size, n=2)).shape == (2, bundle.embed_dim)
    # A fresh export replaces the graphs that were refused, and with them the record.
    export_bundle(bundle, export_dir, image_precision="int8")
    assert not (export_dir / REFUSAL).exists()


def test_an_int8_export_of_another_scheme_is_made_again(bundle: ModelBundle, tmp_path: Path) -> None:
    export_dir = tmp_path / "old-int8"
    export_bundle(bundle, export_dir, image_precision="int8")
    sidecar = json.loads((export_dir / onnx_export.SIDECAR).read_text())
    assert sidecar["int8_scheme"] == onnx_export.INT8_SCHEME
    sidecar.pop("int8_scheme")  # as written before the 7-bit scheme
    (export_dir / onnx_export.SIDECAR).write_text(json.dumps(sidecar))
    ensure_towers(bundle, export_dir, device="cpu", image_precision="int8")
    assert json.loads((export_dir / onnx_export.SIDECAR).read_text())["int8_scheme"] == onnx_export.INT8_SCHEME
