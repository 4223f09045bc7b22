"""ONNX Runtime backend for a model version's image and text towers, behind a parity gate.

The exported graphs take exactly what the torch path takes and return what it returns:

- image: ``(N, S, S, 3)`` uint8 preprocessed pixels -> ``(N, D)`` L2-normalised float32 (the
  mean/std normalisation is inside the graph, so the backend is a drop-in for
  ``ModelBundle.encode_images``);
- text: ``(N, context_length)`` int64 token ids -> ``(N, D)`` L2-normalised float32. Tokens are
  padded to the full context: the causal mask makes that exact, and a fixed length keeps the
  graph free of data-dependent slicing.

For a version with a DCSM scorer, the dense graphs feed ``/score/dense``: ``dense_image.onnx``
(pixels -> pooled ``(N, D)`` and class + patch tokens ``(N, 1+P, D)``) and ``dense_text.onnx``
(full-context ids -> pooled ``(N, D)`` and per-position tokens ``(N, context_length, D)``), all
normalised, over the base model that DCSM was trained on; a ``DenseEncoder`` given them as its
runner reads every feature from them, behind the same gate (per token).

All graphs have a dynamic batch axis. With ``image_precision="int8"`` the image graph's MatMul
weights are quantised to 7-bit signed integers per output channel after export (onnxruntime
dynamic quantisation: activations are quantised per call, so no calibration data is needed). The
seventh bit is what makes the graph portable: see ``quantize_int8``. The text graphs stay fp32:
quantised, they were slower, and text is mostly served from the cache. The dense image graph
follows the image precision. Speed and parity per CPU kind: docs/benchmarks.md.

``text.onnx`` is the default text encoder; for serving, every
other text-encoder variant gets its own ``text-<variant>.onnx`` (the image tower is shared, so it
is exported once). Exports carry a sidecar ``onnx.json`` with the sha256 of each graph (checked
on load, like the store's checksums), and a backend is only used after ``require_parity`` found
every probe embedding (image and every exported text tower) within cosine 0.999 of torch fp32.
The same gate checks any other stand-in for the torch fp32 towers (the service's bf16/fp16 path).

    .venv/bin/python -m clipcore.backends.onnx --store models --model default@production
    .venv/bin/python -m clipcore.backends.onnx --arch ViT-B-32
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from open_clip.model import CLIP
from torch import nn

from clipcore.backends.base import BackendError, PooledTowers
from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import image_features, normalize, text_features
from clipcore.models.preprocess import OPENAI_MEAN, OPENAI_STD

PARITY_THRESHOLD = 0.999
OPSET = 17
ImagePrecision = Literal["fp32", "int8"]
SIDECAR = "onnx.json"
REFUSAL = "refused.json"
# How int8 image graphs are quantised; part of the export key, so a change re-exports.
INT8_SCHEME = "matmul-s8-per-channel-reduce-range"
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # what cache keys allow, so also safe as a file name
# Fixed probe texts: short and long, functional words, one longer than any small context.
PROBE_TEXTS = (
    "a red circle.",
    "a photo of a small blue square.",
    "a green triangle to the left of a purple diamond",
    "The first image contains a larger shape, while the second contains a smaller shape.",
    "a square without a triangle",
    "cyan cross",
    " ".join(["a yellow circle above an orange square"] * 12),
)


class ImageTower(nn.Module):
    """uint8 NHWC pixels -> normalised image embeddings, normalisation included."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model: CLIP, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.permute(0, 3, 1, 2).float() / 255.0
        x = (x - self.mean) / self.std
        return normalize(image_features(self.model, x)[0]).float()


class TextTower(nn.Module):
    """Full-context token ids -> normalised pooled text embeddings."""

    def __init__(self, model: CLIP) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return normalize(text_features(self.model, tokens)[0]).float()


class DenseImageTower(ImageTower):
    """uint8 NHWC pixels -> (pooled, class + patch tokens), both normalised."""

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = pixels.permute(0, 3, 1, 2).float() / 255.0
        pooled, tokens = image_features(self.model, (x - self.mean) / self.std, dense=True)
        assert tokens is not None
        return normalize(pooled).float(), normalize(tokens).float()


class DenseTextTower(TextTower):
    """Full-context token ids -> (pooled, per-position token features), both normalised."""

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        pooled, per_token = text_features(self.model, tokens, dense=True)
        assert per_token is not None
        return normalize(pooled).float(), normalize(per_token).float()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_towers(
    model: CLIP,
    out_dir: Path,
    *,
    image_size: int,
    context_length: int,
    mean: Sequence[float] = OPENAI_MEAN,
    std: Sequence[float] = OPENAI_STD,
    text_variants: Mapping[str, CLIP] | None = None,
    image_precision: ImagePrecision = "fp32",
    dense_model: CLIP | None = None,
) -> dict[str, Path]:
    """Export ``image.onnx`` and ``text.onnx`` (+ the checksum sidecar) into ``out_dir``.

    ``text_variants`` adds ``text-<variant>.onnx`` for each further text tower (same image tower);
    ``image_precision="int8"`` quantises the image graphs' MatMul weights; ``dense_model`` adds
    ``dense_image.onnx`` and ``dense_text.onnx`` of that model (DCSM's features).
    """
    variants = dict(text_variants or {})
    for variant in variants:
        if not _VARIANT_NAME.match(variant):
            raise ValueError(f"text-encoder variant name {variant!r} is not usable as a file name")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"image": out_dir / "image.onnx", "text": out_dir / "text.onnx"}
    paths |= {f"text-{v}": out_dir / f"text-{v}.onnx" for v in variants}
    dense = {} if dense_model is None else {k: out_dir / f"{k}.onnx" for k in ("dense_image", "dense_text")}
    paths |= dense
    # Variants first, the base model last: they share its image tower, whose flag must end as its own.
    others = [m for m in (*variants.values(), dense_model) if m is not None and m is not model]
    flags = [(m, m.training) for m in (*others, model)]
    pixels = torch.zeros(2, image_size, image_size, 3, dtype=torch.uint8)
    tokens = torch.zeros(2, context_length, dtype=torch.long)
    tokens[:, 0], tokens[:, 1] = 49406, 49407  # start, end: a valid (empty) text
    # The exporter restores each wrapper's own train/eval flag recursively afterwards: a new
    # module is in train mode, which would leave the served model with BatchNorm updating.
    modules = [
        ("image", ImageTower(model, mean, std).eval(), pixels, "pixels"),
        ("text", TextTower(model).eval(), tokens, "tokens"),
        *((f"text-{v}", TextTower(m).eval(), tokens, "tokens") for v, m in variants.items()),
    ]
    if dense_model is not None:
        modules += [
            ("dense_image", DenseImageTower(dense_model, mean, std).eval(), pixels, "pixels"),
            ("dense_text", DenseTextTower(dense_model).eval(), tokens, "tokens"),
        ]
    # open_clip attention takes torch's fused MHA fast path in eval mode; that op cannot be
    # exported, so the plain math path must be traced (and the fast path restored afterwards:
    # it is the quicker one for torch serving in this process).
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            for kind, module, example, in_name in modules:
                outputs = ["embedding", "features"] if kind.startswith("dense") else ["embedding"]
                torch.onnx.export(
                    module,
                    (example,),
                    str(paths[kind]),
                    input_names=[in_name],
                    output_names=outputs,
                    opset_version=OPSET,
                    dynamo=False,
                    dynamic_axes={in_name: {0: "batch"}, **{out: {0: "batch"} for out in outputs}},
                )
    finally:
        for module, training in flags:
            module.train(training)
        torch.backends.mha.set_fastpath_enabled(fastpath)
    if image_precision == "int8":
        for kind in ("image", "dense_image"):
            if kind in paths:
                quantize_int8(paths[kind])
    sidecar = {
        "opset": OPSET,
        "image_precision": image_precision,
        "int8_scheme": INT8_SCHEME if image_precision == "int8" else None,
        "dense": {kind: path.name for kind, path in dense.items()},
        "image_size": image_size,
        "context_length": context_length,
        "variants": {v: paths[f"text-{v}"].name for v in variants},
        "files": {p.name: _sha256(p) for p in paths.values()},
    }
    (out_dir / REFUSAL).unlink(missing_ok=True)  # a refusal was of the graphs this export replaces
    # Written last: an export interrupted half-way has no sidecar, so it is never loaded.
    (out_dir / SIDECAR).write_text(json.dumps(sidecar, indent=2))
    return paths


def quantize_int8(path: Path) -> None:
    """Replace the graph at ``path`` by its dynamically quantised form: int8 MatMul weights, one
    scale per output channel (per-tensor scales lose more on attention and MLP weights).

    Weights use 7 bits (``reduce_range``). On x86-64 CPUs without VNNI, onnxruntime multiplies
    uint8 activations by int8 weights with ``vpmaddubsw``, which adds each pair of products into
    a saturating int16: with full-range weights, 2 x 255 x 127 overflows it and the embeddings
    drift (min probe cosine 0.988 on an AVX2-only EPYC, against 0.9999 with VNNI). With 7-bit
    weights (2 x 255 x 64 < 2^15) no sum can saturate, so the same graph gives the same answers
    on every x86-64 CPU, at a cost of about 1e-4 in probe cosine."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    staged = path.with_name(path.stem + ".int8.onnx")
    # The quantiser logs a generic "consider pre-processing" warning on the root logger on every
    # call; the graphs quantised without that pre-pass already pass the parity gate, so it is noise.
    quiet = _DropMessage("consider to run pre-processing")
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(
            str(path),
            str(staged),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=["MatMul"],
        )
    finally:
        logging.getLogger().removeFilter(quiet)
    staged.replace(path)


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def export_bundle(
    bundle: ModelBundle,
    out_dir: Path,
    *,
    variants: bool = False,
    image_precision: ImagePrecision = "fp32",
    dense: bool = False,
) -> dict[str, Path]:
    """Export the towers serving ``bundle``: its image tower and its default text encoder, with
    ``variants`` one text graph per further text-encoder variant, and with ``dense`` (for a version
    with a DCSM scorer) the dense graphs of the model DCSM reads."""
    if dense and bundle.dense is None:
        raise ValueError(f"{bundle.ref} has no DCSM component: there is no dense path to export")
    default = bundle.default_text_encoder
    others = {v: m for v, m in bundle.text_models.items() if v != default} if variants else {}
    return export_towers(
        bundle.text_model(None),
        out_dir,
        image_size=bundle.image_size,
        context_length=bundle.context_length,
        mean=bundle.mean,
        std=bundle.std,
        text_variants=others,
        image_precision=image_precision,
        dense_model=bundle.dense.model if dense and bundle.dense is not None else None,
    )


def export_dir_for(root: Path, bundle: ModelBundle, image_precision: ImagePrecision = "fp32") -> Path:
    """``<root>/<name>/<version>-<key>``: per version, and keyed by the manifest (so another store's
    ``name@version`` never reuses this export), by the exporter (a torch upgrade re-exports) and by
    the image precision (``-int8`` exports live beside the fp32 ones, keyed by their scheme too)."""
    manifest = bundle.manifest.model_dump_json().encode()
    exporter = f"|torch {torch.__version__}|opset {OPSET}"
    if image_precision == "int8":
        exporter += f"|{INT8_SCHEME}"
    key = hashlib.sha256(manifest + exporter.encode()).hexdigest()[:16]
    suffix = "" if image_precision == "fp32" else f"-{image_precision}"
    return root / bundle.name / f"{bundle.version}-{key}{suffix}"


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
    """Variants, image precision (with its int8 scheme) and whether it has the dense graphs, of an
    existing export; None when it has no readable sidecar."""
    try:
        sidecar = json.loads((export_dir / SIDECAR).read_text())
        precision = _precision_key(str(sidecar.get("image_precision", "fp32")), sidecar.get("int8_scheme"))
        return set(sidecar.get("variants", {})), precision, bool(sidecar.get("dense"))
    except (OSError, ValueError, AttributeError):
        return None


def cpu_identity() -> str:
    """The CPU model, its instruction-set flags and onnxruntime's version: what decides which
    kernels a graph runs on (a refusal recorded on one CPU is not trusted on another)."""
    import platform

    import onnxruntime

    model, flags = platform.processor(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.strip()
    except OSError:
        pass
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]
    return f"{platform.machine()} {model or 'unknown CPU'} (flags {digest}), onnxruntime {onnxruntime.__version__}"


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


def probe_images(image_size: int, n: int = 6) -> np.ndarray:
    """Fixed probe pixels: seeded noise, flat colours, gradients (no files, no renderer)."""
    rng = np.random.default_rng(1234)
    images = [rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8) for _ in range(n // 2)]
    ramp = np.linspace(0, 255, image_size, dtype=np.float32)
    for i in range(n - len(images)):
        img = np.empty((image_size, image_size, 3), dtype=np.float32)
        img[..., 0] = ramp[None, :]
        img[..., 1] = ramp[:, None]
        img[..., 2] = 60.0 * (i + 1)
        images.append(img.astype(np.uint8))
    return np.stack(images)


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape != b.shape:
        return np.full(max(len(a), 1), -1.0)
    num = (a * b).sum(axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = num / np.maximum(den, 1e-12)
    return np.where(np.isfinite(cos), cos, -1.0)  # NaN / inf from a broken graph counts as -1


def check_parity(bundle: ModelBundle, towers: PooledTowers) -> float:
    """Min cosine between torch fp32 and ``towers`` over the fixed probe images and texts, for the
    default text encoder and every variant ``towers`` serves."""
    images = probe_images(bundle.image_size)
    tokens, _ = bundle.tokenize(list(PROBE_TEXTS))
    with torch.no_grad():
        cos = [_row_cosines(bundle.encode_images(images), towers.encode_images(images))]
        for variant in (None, *towers.variants):
            cos.append(_row_cosines(bundle.encode_tokens(tokens, variant), towers.encode_tokens(tokens, variant)))
    return float(np.concatenate(cos).min())


def check_dense_parity(bundle: ModelBundle, towers: OnnxTowers) -> float:
    """Min cosine between DCSM's torch fp32 features and the dense graphs' over the probe images
    (every class and patch token) and probe texts (every position up to the end token)."""
    encoder = bundle.dense_encoder()
    images = probe_images(bundle.image_size)
    runner, encoder.runner = encoder.runner, None
    try:
        ref_pooled, ref_tokens = encoder.image_features(images)
        ref_text = encoder.text_features(list(PROBE_TEXTS))
        encoder.runner = towers
        pooled, tokens = encoder.image_features(images)
        text = encoder.text_features(list(PROBE_TEXTS))
    finally:
        encoder.runner = runner
    d = ref_tokens.shape[-1]
    valid = ref_text.valid.numpy()
    cos = [
        _row_cosines(ref_pooled.numpy(), pooled.numpy()),
        _row_cosines(ref_tokens.reshape(-1, d).numpy(), tokens.reshape(-1, d).numpy()),
        _row_cosines(ref_text.pooled.numpy(), text.pooled.numpy()),
        _row_cosines(ref_text.tokens.numpy()[valid], text.tokens.numpy()[valid]),
    ]
    return float(np.concatenate(cos).min())


def require_dense_parity(bundle: ModelBundle, towers: OnnxTowers, threshold: float = PARITY_THRESHOLD) -> float:
    worst = check_dense_parity(bundle, towers)
    if not worst >= threshold:
        raise BackendError(
            f"ONNX dense (DCSM) graphs for {bundle.ref} refused: min probe cosine {worst:.6f} < {threshold}"
        )
    return worst


def require_parity(
    bundle: ModelBundle, towers: PooledTowers, threshold: float = PARITY_THRESHOLD, *, label: str = "ONNX backend"
) -> float:
    """The gate: raise ``BackendError`` unless every probe embedding has cosine >= ``threshold``."""
    worst = check_parity(bundle, towers)
    if not worst >= threshold:
        raise BackendError(f"{label} for {bundle.ref} refused: min probe cosine {worst:.6f} < {threshold}")
    return worst


def image_throughput(encode: object, images: np.ndarray, min_s: float) -> float:
    """Images/s of ``encode(images)`` over at least ``min_s`` seconds, after one warm-up call."""
    fn = encode  # a callable; typed loosely so torch and onnx encoders fit alike
    fn(images)  # type: ignore[operator]
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_s or n == 0:
        fn(images)  # type: ignore[operator]
        n += len(images)
    return n / elapsed


def _random_bundle(arch: str, directory: Path) -> ModelBundle:
    """A random-weights open_clip ``arch`` as a bundle (speed does not depend on weight values)."""
    import open_clip

    from model_store import Manifest

    cfg = open_clip.get_model_config(arch)
    if cfg is None:
        raise SystemExit(f"unknown open_clip architecture {arch!r}")
    manifest = Manifest(
        name="bench",
        version="random",
        architecture={"open_clip_name": arch},
        context_length=cfg["text_cfg"].get("context_length", 77),
        embed_dim=cfg["embed_dim"],
        image_size=cfg["vision_cfg"].get("image_size", 224),
        preprocess={"mean": list(OPENAI_MEAN), "std": list(OPENAI_STD)},
    )
    torch.manual_seed(0)
    return ModelBundle.from_directory(manifest, directory)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="export to ONNX, gate on parity, compare image throughput")
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--arch", default=None, help="a random-weights open_clip architecture instead of --model")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads for torch and onnxruntime alike")
    parser.add_argument("--image-precision", default="fp32", choices=["fp32", "int8"])
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="onnx-export-") as tmp:
        if args.arch:
            bundle = _random_bundle(args.arch, Path(tmp))
        else:
            from model_store import ModelStore

            bundle = ModelBundle.load(ModelStore(args.store), args.model)
        t0 = time.perf_counter()
        export_bundle(bundle, Path(tmp) / "onnx", image_precision=args.image_precision)
        towers = load_towers(Path(tmp) / "onnx", device=args.device, threads=args.threads)
        used = towers.providers
        name = bundle.ref if not args.arch else f"{args.arch} (random weights)"
        print(f"model {name}: exported ({args.image_precision} image tower) in {time.perf_counter() - t0:.1f} s, "
              f"providers {used}")  # fmt: skip
        worst = require_parity(bundle, towers)
        print(
            f"parity: min cosine {worst:.6f} over {len(probe_images(bundle.image_size))} probe images and "
            f"{len(PROBE_TEXTS)} texts (gate >= {PARITY_THRESHOLD})\n"
        )
        print("| batch | torch eager images/s | onnxruntime images/s | onnx / torch |\n|---|---|---|---|")
        rng = np.random.default_rng(0)
        for bs in args.batch_sizes:
            images = rng.integers(0, 256, (bs, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)
            t = image_throughput(bundle.encode_images, images, args.min_seconds)
            o = image_throughput(towers.encode_images, images, args.min_seconds)
            print(f"| {bs} | {t:.1f} | {o:.1f} | {o / t:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
