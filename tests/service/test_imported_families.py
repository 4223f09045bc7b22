"""The CustomTextCLIP families served over HTTP, equal to open_clip on the same hub folder.

A SigLIP-shaped model (sigmoid-trained: ``logit_bias``, no causal mask, last-token pooling) and a
CoCa (its contrastive head: attentional image pooling, a text tower with a class token), both at
toy size with open_clip's BPE vocabulary (and the SigLIP shape once more with its own Hugging Face
tokenizer, as released SigLIPs have), each saved as an open_clip hub folder with its own
preprocessing, imported with one command and served by real uvicorn. ``/embed``, ``/classify``,
``/rank-pair`` and ``/rank`` answer with open_clip's embeddings of ``create_model("local-dir:...")``;
the per-token methods answer 400.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from hf_word_tokenizer import HF_VOCAB, save_word_tokenizer
from open_clip_reference import (
    b64,
    check_served_equals_open_clip,
    import_model,
    open_clip_reference,
    sample_image,
    save_hub,
)
from tiny_families import family_configs

from clipcore.models.clip_model import build_model
from model_store import ModelStore

# The families served beside CLIP (CLIP itself: test_imported_models.py).
FAMILIES = {name: cfg for name, cfg in family_configs(32, 8, 16).items() if name != "clip"}
# SigLIP as released: a Hugging Face tokenizer (a toy word-level one here, saved with its files in the
# hub folder as the released folders carry them), canonicalised text, an end token and padding.
FAMILIES["siglip_hf"] = {
    **FAMILIES["siglip"],
    "text_cfg": {
        **FAMILIES["siglip"]["text_cfg"],
        "vocab_size": len(HF_VOCAB),
        "hf_tokenizer_name": "example/tiny-word-tokenizer",
        "tokenizer_kwargs": {"clean": "canonicalize"},
    },
}
CLASSES = {"siglip": "CustomTextCLIP", "siglip_hf": "CustomTextCLIP", "coca": "CoCa"}


PREPROCESS = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bilinear", "resize_mode": "squash"}


@pytest.fixture(scope="module")
def family_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("families")
    hubs = {}
    for seed, (name, config) in enumerate(FAMILIES.items()):
        torch.manual_seed(seed)
        model = build_model(config)
        hubs[name] = save_hub(work / name, config, model.state_dict(), PREPROCESS)
        if "hf_tokenizer_name" in config["text_cfg"]:
            save_word_tokenizer(hubs[name])
        import_model(work / "store", name, "--hf-dir", str(hubs[name]), "--alias", "production")
    yield {"store": work / "store", "hubs": hubs}


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.slow
def test_family_serves_open_clip_embeddings(family_store: dict[str, Any], serve_app: Any, name: str) -> None:
    store = ModelStore(family_store["store"])
    manifest = store.manifest(name, "v1")
    assert (manifest.image_size, manifest.embed_dim, manifest.context_length) == (32, 32, 16)
    assert manifest.preprocess == PREPROCESS
    images = [sample_image(48, 7), sample_image(40, 8)]  # not square, not 32 px: resized as the hub says
    ref = open_clip_reference(f"local-dir:{family_store['hubs'][name]}", None, images)
    with serve_app(store=str(family_store["store"]), model=f"{name}@production") as running:
        bundle = running.services.manager.current.bundle
        assert type(bundle.model).__name__ == CLASSES[name]
        if name.startswith("siglip"):
            assert bundle.logit_bias == pytest.approx(-10.0)  # the sigmoid's learnt bias is loaded
        if name == "siglip_hf":
            assert manifest.tokenizer == "hf:tokenizer" and "tokenizer/tokenizer.json" in manifest.files
            long = " ".join(["red circle"] * 8)  # 16 words and the end token: one more than the context
            sent = [b64(image) for image in images]
            r = httpx.post(f"{running.url}/rank", json={"images": sent, "difference": long})
            assert r.status_code == 200 and r.json()["truncated_texts"] == 1, r.text
            r = httpx.post(f"{running.url}/rank", json={"images": sent, "difference": "a red circle"})
            assert r.status_code == 200 and r.json().get("truncated_texts") is None, r.text
        check_served_equals_open_clip(running.url, ref, images, f"{name}@v1", pair_from_served=True)
        r = httpx.post(f"{running.url}/score/dense", json={"image": b64(images[0]), "texts": ["a red circle"]})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "unsupported_for_family" and CLASSES[name] in r.json()["error"]["message"]
        body = {"images": [b64(images[0])], "labels": ["circle", "square"], "method": "yukino"}
        r = httpx.post(f"{running.url}/classify", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_for_family", r.text
