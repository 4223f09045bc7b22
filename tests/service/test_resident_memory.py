"""Only what the serving path needs stays resident: with ONNX Runtime serving a version, its torch
towers are freed (the modules gone, not merely unused), and every endpoint answers exactly as it
did with them kept; a version with YUKINO keeps the torch image tower and YUKINO's text encoder
(the inverter reads torch patch tokens), and frees the other text towers.

Each model is served twice by the real app with ``backend=onnx``: once with the freeing switched
off (``release_unserved`` replaced by a no-op, the answers "before") and once as shipped; the
answers must be identical, byte for byte where the server is deterministic (same ONNX sessions).
"""

from __future__ import annotations

import gc
import io
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from clipcore.backends import residency
from clipcore.backends.base import ServingTowers
from clipcore.backends.residency import ReleasedTower
from service.runtime import assembly

TEXTS = ["a red circle.", "a small blue square next to a green triangle"]
LABELS = ["circle", "square", "triangle"]
VOLATILE = {"request_id", "elapsed_ms", "timing", "timings", "took_ms", "cached"}


def scrub(value: Any) -> Any:
    """An answer without the fields that differ between two servers (ids, timings)."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def answers(url: str, make_image: Any, *, dense: bool, yukino: bool, encoders: list[str]) -> dict[str, Any]:
    """Every endpoint's answer on fixed inputs (JSON, or the PNG's pixels for the heatmap)."""
    images = [make_image("circle", "red"), make_image("square", "blue"), make_image("triangle", "green")]
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=120) as client:

        def post(key: str, path: str, body: dict[str, Any], **kw: Any) -> None:
            r = client.post(path, json=body, **kw)
            assert r.status_code == 200, (path, r.text)
            out[key] = scrub(r.json()) if "json" in r.headers.get("content-type", "") else r.content

        post("embed images", "/embed", {"images": images})
        for encoder in encoders:
            post(f"embed texts {encoder}", "/embed", {"texts": TEXTS, "encoder": encoder})
        post("classify", "/classify", {"images": images, "labels": LABELS, "top_k": 3})
        post("classify comparative", "/classify", {"images": images, "labels": LABELS}, params={"comparative": "true"})
        post("rank", "/rank", {"images": images, "difference": "larger"})
        post("rank-pair", "/rank-pair", {"image_a": images[0], "image_b": images[1], "difference": "larger"})
        model_id = client.get("/v1/models").json()["data"][0]["id"]
        post("v1 embeddings", "/v1/embeddings", {"model": model_id, "input": TEXTS})
        if yukino:
            post("classify yukino", "/classify", {"images": images, "labels": LABELS, "method": "yukino", "top_k": 3})
        if dense:
            post("score dense", "/score/dense", {"image": images[0], "texts": TEXTS})
            post("heatmap", "/score/dense/heatmap", {"image": images[0], "text": TEXTS[1]})
            out["heatmap"] = np.asarray(Image.open(io.BytesIO(out["heatmap"]))).tobytes()
        for path in ("/models", "/v1/models"):
            r = client.get(path)
            assert r.status_code == 200
    return out


def serve_both(
    serve_app: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, Any],
    probe: Callable[[str], dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[weakref.ref[Any]]], Any]:
    """Answers with the torch towers kept, then freed; weak references to the freed modules (by
    tower) and the serving bundle of the second server."""
    real = residency.release_unserved
    monkeypatch.setattr(assembly, "release_unserved", lambda towers: [])
    with serve_app(**settings) as running:
        kept = probe(running.url)
    refs: dict[str, list[weakref.ref[Any]]] = {}

    def watched(towers: ServingTowers) -> list[str]:
        bundle = towers.bundle
        refs["image"] = [weakref.ref(bundle.model.visual)]
        for name, model in bundle.text_models.items():
            refs[name] = [weakref.ref(model.transformer), weakref.ref(model.token_embedding)]
        return real(towers)

    monkeypatch.setattr(assembly, "release_unserved", watched)
    with serve_app(**settings) as running:
        freed = probe(running.url)
        bundle = running.services.manager.current.bundle
        gc.collect()
    return kept, freed, refs, bundle


@pytest.mark.slow
def test_onnx_frees_the_torch_towers_and_every_endpoint_answers_the_same(
    tmp_path: Path, serve_app: Any, publish_dense_model: Any, make_image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxruntime")
    store = tmp_path / "store"
    publish_dense_model(store, "dense")  # pooled and DCSM dense graphs in ONNX
    settings = {"store": str(store), "model": "dense@production", "backend": "onnx",
                "onnx_cache_dir": str(tmp_path / "onnx")}  # fmt: skip

    def probe(url: str) -> dict[str, Any]:
        return answers(url, make_image, dense=True, yukino=False, encoders=["base"])

    kept, freed, refs, bundle = serve_both(serve_app, monkeypatch, settings, probe)
    assert freed.keys() == kept.keys()
    for key in kept:
        assert freed[key] == kept[key], key
    assert isinstance(bundle.model.visual, ReleasedTower)
    assert isinstance(bundle.model.transformer, ReleasedTower) and bundle.model.positional_embedding is None
    for tower, alive in refs.items():
        assert all(ref() is None for ref in alive), f"the torch {tower} tower is still referenced"
    with pytest.raises(RuntimeError, match="freed"):
        bundle.encode_images(np.zeros((1, bundle.image_size, bundle.image_size, 3), dtype=np.uint8))


@pytest.mark.slow
def test_yukino_keeps_the_image_tower_and_its_text_encoder(
    tmp_path: Path, serve_app: Any, make_image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxruntime")
    from test_http_semclip_yukino import publish_semclip_yukino

    store = tmp_path / "store"
    publish_semclip_yukino(store)
    settings = {"store": str(store), "model": "sy@production", "backend": "onnx",
                "onnx_cache_dir": str(tmp_path / "onnx")}  # fmt: skip

    def probe(url: str) -> dict[str, Any]:
        return answers(url, make_image, dense=False, yukino=True, encoders=["base", "semclip"])

    kept, freed, refs, bundle = serve_both(serve_app, monkeypatch, settings, probe)
    for key in kept:
        assert freed[key] == kept[key], key
    assert all(ref() is not None for ref in refs["image"] + refs["semclip"])  # YUKINO reads them
    assert all(ref() is None for ref in refs["base"])  # ONNX serves the base encoder
    assert not isinstance(bundle.model.visual, ReleasedTower)
    assert isinstance(bundle.text_models["base"].transformer, ReleasedTower)


def test_torch_backends_keep_every_tower(tmp_path: Path, tiny_store: Path) -> None:
    from clipcore.backends.torch_towers import TorchTowers
    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore

    bundle = ModelBundle.load(ModelStore(tiny_store), "tiny@production")
    assert residency.release_unserved(ServingTowers(bundle, TorchTowers(bundle))) == []
    assert not isinstance(bundle.model.visual, ReleasedTower)
    pixels = np.zeros((1, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)
    assert bundle.encode_images(pixels).shape == (1, bundle.embed_dim)
