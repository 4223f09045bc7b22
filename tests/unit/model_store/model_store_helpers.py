"""Helpers shared by the model store tests (a uniquely named module, safe to import)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from model_store import FileEntry, Manifest, ModelStore
from model_store.evaluation import bind

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


def evaluated_files(payload: bytes, report: dict[str, Any] | None = None) -> dict[str, bytes]:
    """The files of a ``publish_simple`` version with an eval.json bound to them (``report``, else
    one figure), as a publish after an evaluation carries it."""
    entry = FileEntry(sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload))
    files = {"model.safetensors": entry}
    prospective = Manifest.model_validate({**manifest_fields(), "name": "clip", "version": "v1", "files": files})
    bound = bind(report if report is not None else {"metrics": {"acc": 0.5}}, prospective)
    return {"model.safetensors": payload, "eval.json": json.dumps(bound).encode()}


def publish_evaluated(
    store: ModelStore, payload: bytes = b"weights", report: dict[str, Any] | None = None, **kwargs: Any
) -> str:
    """``publish_simple`` with an evaluation (``evaluated_files``); returns the new version name."""
    return store.publish("clip", evaluated_files(payload, report), manifest_fields(), **kwargs).version


def promote_in_process(location: str, name: str, alias: str, version: str) -> None:
    """Target of a child process: open the store afresh and promote (module-level, so spawnable)."""
    ModelStore(location).promote(name, alias, version)


def write_eval(store: ModelStore, name: str, version: str, report: dict[str, Any]) -> None:
    """Write ``report`` as the evaluation of ``name@version``: bound to its weights, as
    ``clip-train evaluate`` writes it."""
    store.write_annex(name, version, "eval.json", json.dumps(bind(report, store.manifest(name, version))).encode())


def default_eval() -> dict[str, Any]:
    """The eval.json of the committed default model's production version: a real report of ~390
    figures with their standard errors (bound to that version: ``write_eval`` binds a copy to another)."""
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


def hold_lock_in_process(location: str, cache_dir: str, ready: str, lease_s: float) -> None:
    """Target of a child process: take the model ``clip``'s lock with a lease of ``lease_s``,
    say so by writing ``ready``, and hold it until killed (a writer that dies holding the lock)."""
    import time

    from model_store import open_backend

    backend = open_backend(location, cache_dir)
    if hasattr(backend, "lease_s"):
        backend.lease_s = lease_s
    with backend.lock("clip/.lock"):
        Path(ready).write_text("held")
        time.sleep(3600)
