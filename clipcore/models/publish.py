"""Saving a model as a store version: weights, text-encoder variants as deltas, components, manifest.

The writing side of `bundle.py` (which loads what this writes); the training job and tests publish
through it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from open_clip.model import CLIP
from safetensors.torch import save

from clipcore.models.clip_model import architecture_config, config_image_size, is_text_param
from clipcore.models.components import Components
from clipcore.models.preprocess import PreprocessConfig
from model_store import GateReport, Manifest, ModelStore


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


@dataclass
class TrainedModel:
    """What a training run (or an import) hands to the store: the model, its architecture, and
    everything published with it. Text-encoder variants are full state dicts (stored as deltas)."""

    model: CLIP
    architecture: dict[str, Any]
    text_variants: Mapping[str, Mapping[str, torch.Tensor]] = field(default_factory=dict)
    default_text_encoder: str = "base"
    comparatives: Sequence[Mapping[str, Any]] | None = None
    extra_files: Mapping[str, bytes] = field(default_factory=dict)  # e.g. a DCSM scorer, eval.json
    components: Mapping[str, Any] = field(default_factory=dict)  # merged into the manifest's
    metrics: Mapping[str, float] = field(default_factory=dict)
    training: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    fp16: bool = True  # weights stored as float16
    # The manifest's preprocessing: the model was trained (or is served) on images normalised with it.
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    tokenizer: str = "open_clip:bpe"


def publish_bundle(
    store: ModelStore,
    name: str,
    trained: TrainedModel,
    *,
    aliases: Sequence[str] = (),
    version: str | None = None,
    on_gate: Callable[[GateReport], None] | None = None,
    force: bool = False,
    reason: str | None = None,
) -> Manifest:
    """Publish a trained model (+ text-encoder variants, comparatives, extra files) as a new version
    (``aliases`` moved to it through the evaluation gate, whose report goes to ``on_gate``; ``force``
    with a ``reason`` moves them even if it refuses).

    Image size and embedding width come from the architecture's open_clip config (so a named
    architecture such as ``ViT-B-32-256`` records its own 256 px)."""
    t = trained
    files: dict[str, bytes] = {"model.safetensors": tensor_bytes(t.model.state_dict(), t.fp16)}
    text_files = {}
    for variant, state in t.text_variants.items():
        text_files[variant] = f"text_{variant}.safetensors"
        files[text_files[variant]] = tensor_bytes(text_delta(t.model, state), t.fp16)
    if t.comparatives is not None:
        files["comparatives.json"] = json.dumps(list(t.comparatives), indent=2).encode()
    files.update(t.extra_files)
    config = architecture_config(t.architecture)
    # Parsed before anything is written: an entry of the wrong type is refused here, not at load.
    components = Components.from_manifest(
        {
            "weights": "model.safetensors",
            "weights_dtype": "float16" if t.fp16 else "float32",
            "text_encoders": text_files,
            "default_text_encoder": t.default_text_encoder,
            **t.components,
        }
    )
    fields = {
        "architecture": t.architecture,
        "hooks": list(t.architecture.get("hooks", [])),
        "tokenizer": t.tokenizer,
        "context_length": int(t.model.context_length),
        "embed_dim": int(config["embed_dim"]),
        "image_size": config_image_size(config),
        "preprocess": t.preprocess.to_manifest(),
        "components": components.to_manifest(),
        "metrics": dict(t.metrics),
        "training": dict(t.training),
        "data": dict(t.data),
        "notes": t.notes,
    }
    return store.publish(
        name, files, fields, version=version, aliases=aliases, on_gate=on_gate, force=force, reason=reason
    )
