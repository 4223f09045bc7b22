"""Acceptance: users' open_clip models imported with one command each and served by real uvicorn.

A random-weights ViT-S-32 (the smallest open_clip ViT: ViT-B-32's code at 63 M parameters instead
of 151 M, so three copies import quickly) saved as a wrapped state-dict ``.pt``, a ``.safetensors``
and an open_clip hub-style folder; a random MobileCLIP-S1 (a CustomTextCLIP: timm image tower, open_clip
BPE tokenizer, so it needs nothing from the network) as a pretrained tag found in a Hugging Face
cache; a random ViT-B-32-256. Each is served and ``/embed``, ``/classify``,
``/rank-pair`` (and ``/rank``) answer with embeddings equal (cosine >= 0.9999) to those of
``open_clip.create_model`` on the same file, preprocessed by open_clip's own transform.

Real-sized models on a small CPU: one module-scoped fixture per architecture, a handful of forward
passes each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import open_clip
import pytest
import torch
from open_clip_reference import (
    OPENAI_PREPROCESS,
    b64,
    check_served_equals_open_clip,
    import_model,
    open_clip_reference,
    sample_image,
    save_hub,
    wait_serving,
)
from safetensors.torch import save_file

from model_store import ModelStore

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------------- ViT-S-32
@pytest.fixture(scope="module")
def vit_s32(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One random ViT-S-32 in three formats, each imported with one command into one store."""
    torch.set_num_threads(2)
    work = tmp_path_factory.mktemp("vits32")
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-S-32")
    state = model.state_dict()
    del model
    files = {
        "pt": work / "user_checkpoint.pt",
        "safetensors": work / "user_checkpoint.safetensors",
        "hub": work / "hub",
    }
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 32}, files["pt"])
    save_file({k: v.contiguous() for k, v in state.items()}, files["safetensors"])
    save_hub(files["hub"], open_clip.get_model_config("ViT-S-32"), state, OPENAI_PREPROCESS)
    del state
    store = work / "store"
    import_model(store, "vits", "--arch", "ViT-S-32", "--weights", str(files["pt"]), "--alias", "production")
    import_model(store, "vits", "--arch", "ViT-S-32", "--weights", str(files["safetensors"]))
    import_model(store, "vits", "--hf-dir", str(files["hub"]))
    return {"store": store, "files": files}


def test_vit_s32_in_every_format_serves_open_clip_embeddings(
    vit_s32: dict[str, Any], serve_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = ModelStore(vit_s32["store"])
    assert store.list_versions("vits") == ["v1", "v2", "v3"]
    files = vit_s32["files"]
    # open_clip reads the same tensors from the three files, so its embeddings of one are those of
    # all three: one reference model (forward passes are the cost on a small CPU), three served versions.
    from open_clip.factory import load_state_dict

    wrapped = load_state_dict(str(files["pt"]))
    for other in (files["safetensors"], files["hub"] / "open_clip_pytorch_model.bin"):
        read = load_state_dict(str(other))
        assert read.keys() == wrapped.keys() and all(torch.equal(read[k], wrapped[k]) for k in read)
    del wrapped, read
    images = [sample_image(224, 1), sample_image(224, 2)]
    ref = open_clip_reference("ViT-S-32", files["pt"], images, OPENAI_PREPROCESS)
    caplog.set_level(logging.INFO)
    with serve_app(
        store=str(vit_s32["store"]), model="vits@production", watch_interval_s=0.2, probes_list_models=True
    ) as running:
        for version in ("v1", "v2", "v3"):
            store.promote("vits", "production", version, force=True, reason="imported, never evaluated")
            wait_serving(running.url, f"vits@{version}")
            check_served_equals_open_clip(running.url, ref, images, f"vits@{version}")
    # Weights are loaded from the version right after the model is built: no "random" warning.
    assert not [r for r in caplog.records if "initialized randomly" in r.getMessage()]


# ----------------------------------------------------------------------------- MobileCLIP (CustomTextCLIP)
@pytest.fixture(scope="module")
def mobileclip(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A random MobileCLIP-S1 as the ``datacompdr`` tag's file in a Hugging Face cache, imported by
    its tag (the preprocessing comes from the tag's config); its inline-config hub-folder route is
    covered on a tiny SigLIP-shaped model in tests/unit/test_import_validate.py."""
    torch.set_num_threads(2)
    work = tmp_path_factory.mktemp("mobileclip")
    torch.manual_seed(0)
    model = open_clip.create_model("MobileCLIP-S1")
    state = model.state_dict()
    del model
    tag = open_clip.get_pretrained_cfg("MobileCLIP-S1", "datacompdr")
    preprocess = {k: list(v) if isinstance(v, tuple) else v for k, v in tag.items() if k in OPENAI_PREPROCESS}
    cache = work / "hf-cache"
    repo = cache / "models--apple--MobileCLIP-S1-OpenCLIP"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    save_file({k: v.contiguous() for k, v in state.items()}, snapshot / "open_clip_model.safetensors")
    store = work / "store"
    import_model(store, "mobile", "--arch", "MobileCLIP-S1", "--pretrained", "datacompdr", "--cache-dir", str(cache),
            "--alias", "production")  # fmt: skip
    return {"store": store, "weights": snapshot / "open_clip_model.safetensors", "preprocess": preprocess}


def test_mobileclip_serves_open_clip_embeddings(mobileclip: dict[str, Any], serve_app: Any) -> None:
    manifest = ModelStore(mobileclip["store"]).manifest("mobile", "v1")
    assert manifest.image_size == 256 and manifest.preprocess == mobileclip["preprocess"]
    assert manifest.preprocess["mean"] == [0.0, 0.0, 0.0] and manifest.preprocess["interpolation"] == "bilinear"
    assert manifest.training["imported_from"]["tag"] == "datacompdr"
    images = [sample_image(256, 3), sample_image(256, 4)]
    ref = open_clip_reference("MobileCLIP-S1", mobileclip["weights"], images, mobileclip["preprocess"])
    with serve_app(store=str(mobileclip["store"]), model="mobile@production") as running:
        check_served_equals_open_clip(running.url, ref, images, "mobile@v1", pair_from_served=True)
        r = httpx.post(f"{running.url}/score/dense", json={"image": b64(images[0]), "texts": ["a red circle"]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_for_family", r.text
        assert "CustomTextCLIP" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------- ViT-B-32-256
@pytest.fixture(scope="module")
def vit_b32_256(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    torch.set_num_threads(2)
    work = tmp_path_factory.mktemp("vitb32-256")
    torch.manual_seed(0)
    weights = work / "model.safetensors"
    save_file({k: v.contiguous() for k, v in open_clip.create_model("ViT-B-32-256").state_dict().items()}, weights)
    import_model(work / "store", "big", "--arch", "ViT-B-32-256", "--weights", str(weights), "--alias", "production")
    yield {"store": work / "store", "weights": weights}


def test_vit_b32_256_serves_at_256_px(vit_b32_256: dict[str, Any], serve_app: Any) -> None:
    manifest = ModelStore(vit_b32_256["store"]).manifest("big", "v1")
    assert manifest.image_size == 256
    images = [sample_image(256, 5), sample_image(256, 6)]
    ref = open_clip_reference("ViT-B-32-256", vit_b32_256["weights"], images, OPENAI_PREPROCESS)
    with serve_app(store=str(vit_b32_256["store"]), model="big@production") as running:
        assert running.services.manager.current.bundle.image_size == 256
        check_served_equals_open_clip(running.url, ref, images, "big@v1")
