"""Helpers shared by the model store tests (a uniquely named module, safe to import)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from model_store import ModelStore

REPO = Path(__file__).resolve().parents[3]
NEGATION = "pcclip.semclip.orig_over_neg.not"  # PC-CLIP: original caption over its "not" negation


def manifest_fields(**overrides: Any) -> dict[str, Any]:
    """Minimal valid manifest fields for an open_clip ViT-B-32 style model."""
    fields: dict[str, Any] = {
        "architecture": {"open_clip_name": "ViT-B-32"},
        "context_length": 77,
        "embed_dim": 512,
        "image_size": 224,
        "preprocess": {
            "mean": [0.48145466, 0.4578275, 0.40821073],
            "std": [0.26862954, 0.26130258, 0.27577711],
            "interpolation": "bicubic",
            "resize_mode": "shortest",
        },
        "components": {"weights": "model.safetensors"},
        "metrics": {"zero_shot_top1": 0.61},
    }
    fields.update(overrides)
    return fields


def publish_simple(store: ModelStore, payload: bytes = b"weights", name: str = "clip", **kwargs: Any) -> str:
    """Publish one weight file and return the new version name."""
    manifest = store.publish(name, {"model.safetensors": payload}, manifest_fields(), **kwargs)
    return manifest.version


def promote_in_process(location: str, name: str, alias: str, version: str) -> None:
    """Target of a child process: open the store afresh and promote (module-level, so spawnable)."""
    ModelStore(location).promote(name, alias, version)


def default_eval() -> dict[str, Any]:
    """The eval.json of the committed default model's production version: a real report of ~390
    figures with their standard errors."""
    store = ModelStore(REPO / "models")
    raw = store.read_annex(*store.resolve("default@production"), "eval.json")
    assert raw is not None
    report: dict[str, Any] = json.loads(raw)
    return report


def negation_fell(report: dict[str, Any], by: float = 0.1) -> dict[str, Any]:
    """``report`` with its PC-CLIP negation figure lowered by ``by``."""
    worse = copy.deepcopy(report)
    worse["metrics"][NEGATION] -= by
    return worse
