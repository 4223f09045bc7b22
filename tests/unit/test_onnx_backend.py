"""ONNX backend on the tiny shapes-smoke model: export, parity gate, corrupted exports refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from clipcore.backends.base import BackendError
from clipcore.backends.onnx import load_towers
from clipcore.backends.onnx_export import SIDECAR, _sha256, export_bundle
from clipcore.backends.parity import PARITY_THRESHOLD, check_parity, probe_images, require_parity
from clipcore.models.bundle import ModelBundle  # noqa: E402
from model_store import ModelStore  # noqa: E402


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_model) -> ModelBundle:
    root = tmp_path_factory.mktemp("onnx-store")
    publish_model(root, "tiny", seed=3)
    return ModelBundle.load(ModelStore(root), "tiny@production")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory, bundle: ModelBundle) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "export"
    export_bundle(bundle, out)
    return out


def test_export_writes_graphs_and_checksums(export_dir: Path) -> None:
    sidecar = json.loads((export_dir / SIDECAR).read_text())
    assert set(sidecar["files"]) == {"image.onnx", "text.onnx"}
    for name, digest in sidecar["files"].items():
        assert _sha256(export_dir / name) == digest


def test_parity_and_dynamic_batch(bundle: ModelBundle, export_dir: Path) -> None:
    towers = load_towers(export_dir, device="cpu")
    assert require_parity(bundle, towers) >= PARITY_THRESHOLD
    images = probe_images(bundle.image_size, n=5)
    for n in (1, 5):  # the batch axis is dynamic: other sizes than the traced 2
        out = towers.encode_images(images[:n])
        assert out.shape == (n, bundle.embed_dim)
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(out, bundle.encode_images(images[:n]), atol=1e-4)
    tokens = bundle.tokenize(["a red circle.", "a blue square to the left of a green cross", "x"])
    np.testing.assert_allclose(towers.encode_tokens(tokens), bundle.encode_tokens(tokens), atol=1e-4)


def test_worker_threads_sleep_between_operators(export_dir: Path) -> None:
    """Spinning threads take the cores the server decodes images and answers HTTP on."""
    towers = load_towers(export_dir, device="cpu")
    for session in (towers.image, towers.text):
        options = session.get_session_options()  # type: ignore[attr-defined]
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_corrupted_weights_fail_the_parity_gate(
    bundle: ModelBundle, export_dir: Path, tmp_path: Path, perturb_onnx_weights: Any
) -> None:
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    perturb_onnx_weights(export_dir / "image.onnx", bad_dir / "image.onnx")  # well-formed, wrong embeddings
    (bad_dir / "text.onnx").write_bytes((export_dir / "text.onnx").read_bytes())
    sidecar = json.loads((export_dir / SIDECAR).read_text())
    sidecar["files"] = {name: _sha256(bad_dir / name) for name in sidecar["files"]}  # digests match the bad file
    (bad_dir / SIDECAR).write_text(json.dumps(sidecar))
    towers = load_towers(bad_dir, device="cpu")
    assert check_parity(bundle, towers) < PARITY_THRESHOLD
    with pytest.raises(BackendError, match="refused"):
        require_parity(bundle, towers)


def test_corrupted_file_is_refused_before_loading(export_dir: Path, tmp_path: Path) -> None:
    bad_dir = tmp_path / "flipped"
    bad_dir.mkdir()
    for name in ("image.onnx", "text.onnx", SIDECAR):
        (bad_dir / name).write_bytes((export_dir / name).read_bytes())
    data = bytearray((bad_dir / "text.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad_dir / "text.onnx").write_bytes(bytes(data))
    with pytest.raises(BackendError, match="corrupted"):
        load_towers(bad_dir, device="cpu")
    (bad_dir / SIDECAR).unlink()
    with pytest.raises(BackendError):
        load_towers(bad_dir, device="cpu")


def test_truncated_graph_is_refused(export_dir: Path, tmp_path: Path) -> None:
    bad_dir = tmp_path / "truncated"
    bad_dir.mkdir()
    (bad_dir / "image.onnx").write_bytes((export_dir / "image.onnx").read_bytes()[:100])
    (bad_dir / "text.onnx").write_bytes((export_dir / "text.onnx").read_bytes())
    sidecar = json.loads((export_dir / SIDECAR).read_text())
    sidecar["files"] = {name: _sha256(bad_dir / name) for name in sidecar["files"]}
    (bad_dir / SIDECAR).write_text(json.dumps(sidecar))
    with pytest.raises(BackendError, match="cannot load"):
        load_towers(bad_dir, device="cpu")


def test_export_leaves_the_served_model_untouched(bundle: ModelBundle, tmp_path: Path) -> None:
    import torch

    images = probe_images(bundle.image_size, n=3)
    before = bundle.encode_images(images)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    export_bundle(bundle, tmp_path / "again")
    assert not bundle.model.training  # the exporter must not leave BatchNorm in train mode
    assert torch.backends.mha.get_fastpath_enabled() == fastpath
    np.testing.assert_array_equal(bundle.encode_images(images), before)


def test_ensure_towers_reuses_and_repairs_an_export(bundle: ModelBundle, tmp_path: Path) -> None:
    from clipcore.backends.onnx import ensure_towers

    target = tmp_path / "tiny" / bundle.version
    first = ensure_towers(bundle, target, device="cpu")
    digest = _sha256(target / "image.onnx")
    images = probe_images(bundle.image_size, n=2)
    np.testing.assert_allclose(first.encode_images(images), bundle.encode_images(images), atol=1e-4)
    (target / "image.onnx").write_bytes(b"not a graph")  # a damaged cache is rebuilt, not served
    second = ensure_towers(bundle, target, device="cpu")
    assert _sha256(target / "image.onnx") == digest
    np.testing.assert_allclose(second.encode_images(images), bundle.encode_images(images), atol=1e-4)
