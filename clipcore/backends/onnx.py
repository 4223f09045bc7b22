"""ONNX Runtime towers of a version: load an export (checked against its sidecar), gate, serve.

``ensure_towers`` is the serving entry point: it reuses (or creates) a version's export, loads it
in onnxruntime (CUDA provider when asked for and present), and returns it only after the parity
gate passed; a refusal is recorded in the export folder for this CPU, so retries answer at once.
Exporting is ``clipcore.backends.onnx_export``; the gate ``clipcore.backends.parity``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from clipcore.backends.base import BackendError
from clipcore.backends.cpu import cpu_identity
from clipcore.backends.onnx_export import (
    DENSE_POOLED,
    INT8_SCHEME,
    REFUSAL,
    SIDECAR,
    ImagePrecision,
    _sha256,
    export_bundle,
)
from clipcore.backends.parity import require_dense_parity, require_parity
from clipcore.models.bundle import ModelBundle


def providers(device: str = "auto") -> list[str | tuple[str, dict[str, str]]]:
    """CUDA when asked for (``cuda``, ``cuda:N`` or ``auto``) and present in this onnxruntime build,
    else CPU. ``cuda:N`` runs on device N."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if (device == "auto" or device.startswith("cuda")) and "CUDAExecutionProvider" in available:
        _, _, index = device.partition(":")
        cuda = ("CUDAExecutionProvider", {"device_id": index}) if index else "CUDAExecutionProvider"
        return [cuda, "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@dataclass
class OnnxTowers:
    image: object  # onnxruntime.InferenceSession (kept untyped: onnxruntime ships no stubs)
    text: object  # the default text encoder
    context_length: int
    # Sessions of the other text-encoder variants, by variant name (exported on request).
    variants: dict[str, object] = field(default_factory=dict)
    dense_image: object | None = None  # DCSM's feature graphs (exported on request)
    dense_text: object | None = None

    @property
    def providers(self) -> list[str]:
        return list(self.image.get_providers())  # type: ignore[attr-defined]

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        return self.image.run(None, {"pixels": np.ascontiguousarray(images, dtype=np.uint8)})[0]  # type: ignore[attr-defined]

    def encode_tokens(self, tokens: torch.Tensor | np.ndarray, variant: str | None = None) -> np.ndarray:
        """Token ids of any width up to the context -> embeddings of ``variant`` (None: the default)."""
        session = self.text if variant is None else self.variants[variant]
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.shape[1] > self.context_length:
            raise ValueError(f"tokens are longer than the context ({ids.shape[1]} > {self.context_length})")
        padded = np.zeros((ids.shape[0], self.context_length), dtype=np.int64)
        padded[:, : ids.shape[1]] = ids
        return session.run(None, {"tokens": padded})[0]  # type: ignore[attr-defined]

    def dense_image_features(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """uint8 pixels -> normalised pooled ``(N, D)`` and class + patch tokens ``(N, 1+P, D)``."""
        if self.dense_image is None:
            raise BackendError("this export has no dense graphs")
        pooled, tokens = self.dense_image.run(None, {"pixels": np.ascontiguousarray(images, dtype=np.uint8)})  # type: ignore[attr-defined]
        return pooled, tokens

    def dense_text_features(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Full-context ids -> normalised pooled ``(N, D)`` and per-position tokens ``(N, C, D)``."""
        if self.dense_text is None:
            raise BackendError("this export has no dense graphs")
        pooled, per_token = self.dense_text.run(None, {"tokens": np.asarray(tokens, dtype=np.int64)})  # type: ignore[attr-defined]
        return pooled, per_token


def load_towers(out_dir: Path, device: str = "auto", threads: int | None = None) -> OnnxTowers:
    """Sessions over an export; refuses files whose digests differ from the sidecar's."""
    import onnxruntime as ort

    try:
        sidecar = json.loads((out_dir / SIDECAR).read_text())
    except (OSError, ValueError) as exc:
        raise BackendError(f"no readable {SIDECAR} in {out_dir}: {exc}") from exc
    bad = {
        name: "missing" if not (out_dir / name).exists() else "sha256 differs"
        for name, digest in sidecar["files"].items()
        if not (out_dir / name).exists() or _sha256(out_dir / name) != digest
    }
    if bad:
        raise BackendError(f"ONNX export in {out_dir} is corrupted: {bad}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
    # Worker threads sleep between operators instead of spinning for the next one: a server's cores
    # also decode images and run the HTTP path, and spinning threads took them (tiny model at 64
    # clients: 2.2 instead of 2.8-3.9 ms of CPU per request; ViT-B-32 beside other work 2.25x the
    # batch-1 images/s; docs/benchmarks.md, "Host path").
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    files = {"image": "image.onnx", "text": "text.onnx", **sidecar.get("variants", {})}
    dense_files = {f"dense:{kind}": name for kind, name in sidecar.get("dense", {}).items()}
    files |= dense_files
    try:
        sessions = {
            kind: ort.InferenceSession(str(out_dir / name), options, providers=providers(device))
            for kind, name in files.items()
        }
    except Exception as exc:  # onnxruntime raises its own untyped errors for unreadable graphs
        raise BackendError(f"onnxruntime cannot load the export in {out_dir}: {exc}") from exc
    image, text = sessions.pop("image"), sessions.pop("text")
    dense_image, dense_text = sessions.pop("dense:dense_image", None), sessions.pop("dense:dense_text", None)
    return OnnxTowers(image, text, int(sidecar["context_length"]), sessions, dense_image, dense_text)


def _precision_key(image_precision: str, int8_scheme: str | None = INT8_SCHEME) -> str:
    return f"int8/{int8_scheme}" if image_precision == "int8" else image_precision


def _exported(export_dir: Path) -> tuple[set[str], str, bool] | None:
    """Variants, image precision (with its int8 scheme) and whether it has the dense graphs (of
    this format: pooled output the tower's), of an existing export; None when it has no readable
    sidecar."""
    try:
        sidecar = json.loads((export_dir / SIDECAR).read_text())
        precision = _precision_key(str(sidecar.get("image_precision", "fp32")), sidecar.get("int8_scheme"))
        dense = bool(sidecar.get("dense")) and sidecar.get("dense_pooled") == DENSE_POOLED
        return set(sidecar.get("variants", {})), precision, dense
    except (OSError, ValueError, AttributeError):
        return None


def _remembered_refusal(export_dir: Path) -> str | None:
    """The reason this export was refused on this CPU before, if it was (so a version that cannot
    pass the gate here is not exported and probed again on every retry)."""
    try:
        record = json.loads((export_dir / REFUSAL).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("cpu") != cpu_identity():
        return None
    return str(record.get("reason", "refused"))


def _refusal_hint(image_precision: ImagePrecision) -> str:
    if image_precision == "int8":
        return "serve this version with CLIP_PRECISION=fp32 (ONNX fp32) or CLIP_BACKEND=torch"
    return "serve this version with CLIP_BACKEND=torch"


def ensure_towers(
    bundle: ModelBundle,
    export_dir: Path,
    device: str = "auto",
    threads: int | None = None,
    *,
    variants: bool = False,
    image_precision: ImagePrecision = "fp32",
    dense: bool = False,
) -> OnnxTowers:
    """The serving entry point: reuse (or create) the export in ``export_dir``, load, gate.

    ``export_dir`` should be keyed by name and version (exports are per version, like cache keys;
    ``export_dir_for`` builds one). With ``variants`` every text-encoder variant gets its tower.
    A corrupted, stale or incomplete export is re-created once; a backend that still fails parity
    raises ``BackendError`` (saying what to set instead), and the caller refuses the version (or
    keeps torch). The refusal is recorded in ``export_dir`` for this CPU, so a retry answers at once
    instead of exporting and probing again.
    """
    if (refused := _remembered_refusal(export_dir)) is not None:
        raise BackendError(refused)
    wanted = {v for v in bundle.text_models if v != bundle.default_text_encoder} if variants else set()
    held = _exported(export_dir)
    if held is None or not wanted <= held[0] or held[1] != _precision_key(image_precision) or (dense and not held[2]):
        export_bundle(bundle, export_dir, variants=variants, image_precision=image_precision, dense=dense)
    try:
        towers = load_towers(export_dir, device, threads)
    except BackendError:
        export_bundle(bundle, export_dir, variants=variants, image_precision=image_precision, dense=dense)
        towers = load_towers(export_dir, device, threads)
    try:
        require_parity(bundle, towers)
        if dense:
            require_dense_parity(bundle, towers)
    except BackendError as exc:
        reason = f"{exc} on {cpu_identity()}; {_refusal_hint(image_precision)}"
        record = {"cpu": cpu_identity(), "reason": reason, "at": time.time()}
        (export_dir / REFUSAL).write_text(json.dumps(record, indent=2))
        raise BackendError(reason) from exc
    return towers
