"""Saving a model as a store version: weights, text-encoder variants as deltas, components, manifest.

The writing side of `bundle.py` (which loads what this writes); the training job and tests publish
through it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from open_clip.model import CLIP
from safetensors.torch import save

from clipcore.models.clip_model import architecture_config, config_image_size, is_text_param
from clipcore.models.preprocess import PreprocessConfig
from model_store import Manifest, ModelStore


def tensor_bytes(state: Mapping[str, torch.Tensor], fp16: bool) -> bytes:
    out = {}
    for k, v in state.items():
        v = v.detach().cpu().contiguous()
        out[k] = v.half() if fp16 and v.is_floating_point() else v
    return save(out)


def text_delta(base: CLIP, variant: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The text-tower tensors of ``variant`` that differ from ``base`` (what a variant file holds)."""
    base_state = base.state_dict()
    return {k: v for k, v in variant.items() if is_text_param(k) and not torch.equal(v, base_state[k])}


def publish_bundle(
    store: ModelStore,
    name: str,
    model: CLIP,
    architecture: dict[str, Any],
    *,
    text_variants: Mapping[str, Mapping[str, torch.Tensor]] = {},
    default_text_encoder: str = "base",
    comparatives: Sequence[Mapping[str, Any]] | None = None,
    extra_files: Mapping[str, bytes] = {},
    components: Mapping[str, Any] = {},
    metrics: Mapping[str, float] = {},
    training: Mapping[str, Any] = {},
    data: Mapping[str, Any] = {},
    notes: str = "",
    aliases: Sequence[str] = (),
    fp16: bool = True,
    version: str | None = None,
    preprocess: PreprocessConfig | None = None,
    tokenizer: str = "open_clip:bpe",
) -> Manifest:
    """Publish a model (+ text-encoder variants, comparatives, extra files) as a new version.

    Image size and embedding width come from the architecture's open_clip config (so a named
    architecture such as ``ViT-B-32-256`` records its own 256 px); ``preprocess`` defaults to
    OpenAI CLIP's values."""
    files: dict[str, bytes] = {"model.safetensors": tensor_bytes(model.state_dict(), fp16)}
    text_files = {}
    for variant, state in text_variants.items():
        text_files[variant] = f"text_{variant}.safetensors"
        files[text_files[variant]] = tensor_bytes(text_delta(model, state), fp16)
    if comparatives is not None:
        files["comparatives.json"] = json.dumps(list(comparatives), indent=2).encode()
    files.update(extra_files)
    config = architecture_config(architecture)
    fields = {
        "architecture": architecture,
        "hooks": list(architecture.get("hooks", [])),
        "tokenizer": tokenizer,
        "context_length": int(model.context_length),
        "embed_dim": int(config["embed_dim"]),
        "image_size": config_image_size(config),
        "preprocess": (preprocess or PreprocessConfig()).to_manifest(),
        "components": {
            "weights": "model.safetensors",
            "weights_dtype": "float16" if fp16 else "float32",
            "text_encoders": text_files,
            "default_text_encoder": default_text_encoder,
            **components,
        },
        "metrics": dict(metrics),
        "training": dict(training),
        "data": dict(data),
        "notes": notes,
    }
    return store.publish(name, files, fields, version=version, aliases=aliases)
