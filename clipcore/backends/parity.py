"""The parity gate: a backend serves a version only if its embeddings match torch fp32.

Fixed probe images (seeded noise, flat colours, gradients) and texts (short and long, functional
words, one longer than any small context) go through torch fp32 and through the candidate towers;
every probe embedding (and for DCSM's dense graphs, every token) must be within cosine
``PARITY_THRESHOLD`` of torch fp32. It checks any stand-in for the torch fp32 towers: ONNX
Runtime graphs, torch under bf16/fp16 autocast.
"""

from __future__ import annotations

import numpy as np
import torch

from clipcore.backends.base import BackendError, PooledTowers
from clipcore.models.bundle import ModelBundle
from clipcore.models.dense import DenseRunner

PARITY_THRESHOLD = 0.999
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
    tokens = bundle.tokenize(list(PROBE_TEXTS))
    with torch.no_grad():
        cos = [_row_cosines(bundle.encode_images(images), towers.encode_images(images))]
        for variant in (None, *towers.variants):
            cos.append(_row_cosines(bundle.encode_tokens(tokens, variant), towers.encode_tokens(tokens, variant)))
    return float(np.concatenate(cos).min())


def check_dense_parity(bundle: ModelBundle, towers: DenseRunner) -> float:
    """Min cosine between DCSM's torch fp32 features and the dense graphs' over the probe images
    (every class and patch token) and probe texts (every position up to the end token)."""
    encoder = bundle.dense_encoder()
    images = probe_images(bundle.image_size)
    ref_pooled, ref_tokens = encoder.image_features(images)
    ref_text = encoder.text_features(list(PROBE_TEXTS))
    pooled, tokens = encoder.image_features(images, towers)
    text = encoder.text_features(list(PROBE_TEXTS), towers)
    d = ref_tokens.shape[-1]
    valid = ref_text.valid.numpy()
    cos = [
        _row_cosines(ref_pooled.numpy(), pooled.numpy()),
        _row_cosines(ref_tokens.reshape(-1, d).numpy(), tokens.reshape(-1, d).numpy()),
        _row_cosines(ref_text.pooled.numpy(), text.pooled.numpy()),
        _row_cosines(ref_text.tokens.numpy()[valid], text.tokens.numpy()[valid]),
    ]
    return float(np.concatenate(cos).min())


def require_dense_parity(bundle: ModelBundle, towers: DenseRunner, threshold: float = PARITY_THRESHOLD) -> float:
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
