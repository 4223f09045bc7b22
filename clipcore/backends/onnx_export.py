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
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import torch
from open_clip.model import CLIP
from torch import nn

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import image_features, normalize, text_features
from clipcore.models.preprocess import OPENAI_MEAN, OPENAI_STD

OPSET = 17
ImagePrecision = Literal["fp32", "int8"]
SIDECAR = "onnx.json"
REFUSAL = "refused.json"  # written by clipcore.backends.onnx when the gate refuses an export
# How int8 image graphs are quantised; part of the export key, so a change re-exports.
INT8_SCHEME = "matmul-s8-per-channel-reduce-range"
_EXPORTING = threading.Lock()
DENSE_POOLED = "tower"  # the sidecar's mark of a dense image graph whose pooled output is the tower's
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # what cache keys allow, so also safe as a file name


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
        # The dense image graph's pooled output is the tower's own pooled output (not its class
        # token), so it serves in place of the image graph's: exports without this are redone.
        "dense_pooled": DENSE_POOLED if dense else None,
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
    # One export at a time per process: torch.onnx's tracing state is global, and the versions of a
    # served set load at the same time ("GLOBALS.in_onnx_export must be False" otherwise).
    with _EXPORTING:
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
