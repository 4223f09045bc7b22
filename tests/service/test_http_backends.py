"""Backends over real HTTP on the tiny model: ONNX (fp32 and int8) and bf16 answer like torch fp32, a version that
fails the parity gate is refused while the old one keeps serving, and cache lookups are timed."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_samples import metric_value

from clipcore.backends.onnx_export import SIDECAR, _sha256, export_bundle, export_dir_for
from clipcore.backends.parity import PARITY_THRESHOLD
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["a red circle.", "a photo of a small blue square.", "a green triangle to the left of a purple diamond"]


def embed(url: str, body: dict[str, Any]) -> np.ndarray:
    r = httpx.post(f"{url}/embed", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float64)


def all_embeddings(url: str, images: list[dict[str, str]]) -> dict[str, np.ndarray]:
    out = {"images": embed(url, {"images": images})}
    for encoder in ("base", "pcclip"):
        out[encoder] = embed(url, {"texts": TEXTS, "encoder": encoder})
    return out


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def wait_refused(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while metric_value(url, "clip_model_swaps_total", result="refused") < 1:
        assert time.monotonic() < deadline, "the version was swapped in instead of refused"
        time.sleep(0.1)


@pytest.mark.slow
def test_onnx_bf16_and_int8_answer_like_torch_fp32(
    tmp_path: Path, tiny_store: Path, serve_app: Any, make_image: Any, caplog: pytest.LogCaptureFixture
) -> None:
    images = [
        make_image(shape, colour) for shape, colour in (("circle", "red"), ("square", "blue"), ("cross", "green"))
    ]
    common = {"store": str(tiny_store), "model": "tiny@production"}  # no Redis: each server computes its own
    with serve_app(**common) as running:
        assert running.services.manager.current.backend == "torch fp32"
        reference = all_embeddings(running.url, images)
    cache_dir = tmp_path / "onnx"
    for overrides, backend in (
        ({"backend": "onnx", "onnx_cache_dir": str(cache_dir)}, "onnx fp32"),
        ({"backend": "onnx", "precision": "int8", "onnx_cache_dir": str(cache_dir)}, "onnx int8"),
        ({"precision": "bf16"}, "torch bf16"),
        ({"precision": "int8"}, "torch int8"),
    ):
        with caplog.at_level("INFO", logger="service.lifecycle"), serve_app(**common, **overrides) as running:
            assert running.services.manager.current.backend.startswith(backend)
            got = all_embeddings(running.url, images)
        assert any(f"(backend {backend} (" in rec.getMessage() for rec in caplog.records), backend  # the load line
        for kind, vectors in got.items():
            assert vectors.shape == reference[kind].shape
            assert row_cosines(vectors, reference[kind]).min() >= PARITY_THRESHOLD, (backend, kind)
    # One export per version and image precision, with a text graph for each encoder variant.
    exports = list((cache_dir / "tiny").iterdir())
    (int8,) = [e for e in exports if e.name.endswith("-int8")]
    (fp32,) = [e for e in exports if e != int8]
    assert fp32.name.startswith("v1-") and int8.name.startswith("v1-")
    for export, precision in ((fp32, "fp32"), (int8, "int8")):
        sidecar = json.loads((export / SIDECAR).read_text())
        assert sidecar["variants"] == {"pcclip": "text-pcclip.onnx"} and sidecar["image_precision"] == precision


def _write_wrong_export(bundle: ModelBundle, target: Path, perturb: Any) -> None:
    """What a faulty exporter would leave: well-formed graphs, matching digests, wrong embeddings."""
    export_bundle(bundle, target, variants=True)
    perturb(target / "image.onnx", target / "image.onnx")
    sidecar = json.loads((target / SIDECAR).read_text())
    sidecar["files"] = {name: _sha256(target / name) for name in sidecar["files"]}
    (target / SIDECAR).write_text(json.dumps(sidecar))


@pytest.mark.slow
def test_version_failing_onnx_parity_is_refused(
    tmp_path: Path, serve_app: Any, publish_model: Any, perturb_onnx_weights: Any, caplog: pytest.LogCaptureFixture
) -> None:
    root, cache_dir = tmp_path / "store", tmp_path / "onnx"
    publish_model(root, "gated", seed=31)
    settings = {
        "store": str(root),
        "model": "gated@production",
        "backend": "onnx",
        "onnx_cache_dir": str(cache_dir),
        "watch_interval_s": 0.2,
        "probes_list_models": True,
    }
    with caplog.at_level("ERROR", logger="service.lifecycle"), serve_app(**settings) as running:
        store = ModelStore(root)
        version = publish_model(root, "gated", seed=32, aliases=())
        # The service reuses an export it finds under the version's key; put a wrong one there.
        bundle = ModelBundle.load(store, f"gated@{version}")
        _write_wrong_export(bundle, export_dir_for(cache_dir, bundle), perturb_onnx_weights)
        store.promote("gated", "production", version, force=True, reason="random weights, never evaluated")
        wait_refused(running.url)
        time.sleep(0.6)  # more polls: a refused version is not retried until the alias moves
        assert metric_value(running.url, "clip_model_swaps_total", result="refused") == 1
        assert readiness(running.url) == {"ready": True, "model": "gated@v1", "redis": "disabled", "store": "ok"}
        r = httpx.post(f"{running.url}/embed", json={"texts": ["still served by v1"]})
        assert r.status_code == 200 and r.json()["model"] == "gated@v1"
    assert any("refusing gated@v2" in rec.getMessage() and "ONNX backend" in rec.getMessage() for rec in caplog.records)


def readiness(url: str) -> dict[str, Any]:
    """/readyz's body without its per-model list (one model is served here)."""
    body: dict[str, Any] = httpx.get(f"{url}/readyz").json()
    body.pop("models", None)
    return body


def _publish_bf16_unsafe(root: Path) -> str:
    """A version whose embeddings cancel two large equal offsets: exact in fp32, while bf16 rounds
    each offset (to a multiple of 4 at 1000) before they cancel, so its embeddings drift."""
    from clipcore.models.clip_model import build_model
    from clipcore.models.publish import TrainedModel, publish_bundle

    config = json.loads((REPO / "training/configs/shapes-smoke.json").read_text())
    torch.manual_seed(33)
    model = build_model(config)
    with torch.no_grad():
        for norm, proj in ((model.ln_final, model.text_projection), (model.visual.ln_post, model.visual.proj)):
            norm.bias[:2] = 1000.0
            proj[1] = -proj[0]
    return publish_bundle(
        ModelStore(root),
        "gated",
        TrainedModel(model, config, fp16=False),
        aliases=["production"],
        force=True,
        reason="random weights, never evaluated",
    ).version


def test_version_failing_bf16_parity_is_refused(tmp_path: Path, serve_app: Any, publish_model: Any) -> None:
    publish_model(tmp_path, "gated", seed=34)
    with serve_app(
        store=str(tmp_path), model="gated@production", precision="bf16", watch_interval_s=0.2, probes_list_models=True
    ) as running:
        assert _publish_bf16_unsafe(tmp_path) == "v2"
        wait_refused(running.url)
        assert readiness(running.url) == {"ready": True, "model": "gated@v1", "redis": "disabled", "store": "ok"}
        assert httpx.post(f"{running.url}/embed", json={"texts": ["fine"]}).status_code == 200
    # The same version serves in fp32: only the precision was unsafe.
    with serve_app(store=str(tmp_path), model="gated@production", probes_list_models=True) as running:
        assert readiness(running.url) == {"ready": True, "model": "gated@v2", "redis": "disabled", "store": "ok"}


def lookups(url: str) -> dict[str, float]:
    return {layer: metric_value(url, "clip_cache_lookup_seconds_count", layer=layer) for layer in ("lru", "redis")}


def test_cache_lookup_histogram_is_exported(base_url: str) -> None:
    body = {"texts": [f"a red circle {uuid.uuid4().hex}"]}  # unseen: the first lookup misses the LRU
    before = lookups(base_url)
    first = embed(base_url, body)
    middle = lookups(base_url)
    second = embed(base_url, body)  # answered from the LRU
    after = lookups(base_url)
    np.testing.assert_array_equal(first, second)
    assert middle["lru"] > before["lru"] and middle["redis"] > before["redis"]  # the miss went on to Redis
    assert after["lru"] > middle["lru"] and after["redis"] == middle["redis"]  # the hit did not
    text = httpx.get(f"{base_url}/metrics").text
    assert 'clip_cache_lookup_seconds_bucket{layer="lru",le="5e-05"}' in text
    assert 'clip_cache_lookup_seconds_bucket{layer="redis",le="0.05"}' in text


def served_against_torch_fp32(
    tiny_store: Path, serve_app: Any, make_image: Any, **settings: Any
) -> tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The backend description and embeddings of the tiny model served with ``settings``, and the
    same embeddings from a torch fp32 server."""
    images = [make_image("circle", "red"), make_image("square", "blue")]
    common = {"store": str(tiny_store), "model": "tiny@production"}
    with serve_app(**common) as running:
        reference = all_embeddings(running.url, images)
    with serve_app(**common, **settings) as running:
        backend = running.services.manager.current.backend
        got = all_embeddings(running.url, images)
    return backend, got, reference


@pytest.mark.slow
def test_precision_auto_serves_the_gated_winner_and_a_restart_reuses_the_decision(
    tmp_path: Path, tiny_store: Path, serve_app: Any, make_image: Any
) -> None:
    cache_dir = tmp_path / "onnx"
    backend, got, reference = served_against_torch_fp32(
        tiny_store, serve_app, make_image, precision="auto", onnx_cache_dir=str(cache_dir)
    )
    assert "; auto: torch fp32 " in backend and "onnx int8 " in backend, backend  # every candidate's figure
    (decision,) = (cache_dir / "auto" / "tiny").glob("v1-*.json")
    record = json.loads(decision.read_text())
    for kind, vectors in got.items():
        assert row_cosines(vectors, reference[kind]).min() >= PARITY_THRESHOLD, kind
    if "chosen" not in record:  # the rounds could not settle it on this busy machine: the reference served
        assert record["decision"]["outcome"] == "deferred" and backend.startswith("torch fp32"), record
        return
    chosen = record["chosen"]
    assert backend.startswith(f"{chosen['backend']} {chosen['precision']}")
    with serve_app(
        store=str(tiny_store), model="tiny@production", precision="auto", onnx_cache_dir=str(cache_dir)
    ) as running:
        again = running.services.manager.current.backend
        # GET /models shows how the serving version's backend was picked; /metrics counts it.
        (model,) = httpx.get(f"{running.url}/models").json()["models"]
        (serving,) = [v for v in model["versions"] if v["serving"]]
        assert serving["auto"]["outcome"] == "remembered" and serving["auto"]["backend"] == chosen["backend"]
        assert serving["auto"]["rounds"] == record["decision"]["rounds"] and serving["auto"]["margin"] > 0
        assert metric_value(running.url, "clip_backend_auto_decisions_total", outcome="remembered") == 1
    assert again.startswith(f"{chosen['backend']} {chosen['precision']}") and f"auto: remembered in {decision}" in again


@pytest.mark.slow
def test_backend_auto_serves_the_faster_fp32_runtime_with_fp32_answers(
    tmp_path: Path, tiny_store: Path, serve_app: Any, make_image: Any
) -> None:
    backend, got, reference = served_against_torch_fp32(
        tiny_store, serve_app, make_image, backend="auto", onnx_cache_dir=str(tmp_path / "onnx")
    )
    # Both fp32 runtimes were timed, no lower precision was.
    assert "; auto: torch fp32 " in backend and "onnx fp32 " in backend and "int8" not in backend, backend
    assert backend.startswith(("torch fp32", "onnx fp32")), backend
    for kind, vectors in got.items():
        assert row_cosines(vectors, reference[kind]).min() >= 0.99999, kind  # the same arithmetic
