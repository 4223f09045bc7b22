"""The seam every backend fits: what a batch of images or tokens is encoded by, and its error.

The service's batchers call these named methods of one towers object chosen per version by
``clipcore.backends.select``; the parity gate compares any of them with torch fp32.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

import numpy as np
import torch

from clipcore.models.bundle import ModelBundle
from clipcore.models.dense import DenseRunner


class BackendError(Exception):
    """A backend that must not serve: a bad ONNX export (file, checksum) or a failed parity gate."""


class PooledTowers(Protocol):
    """What the parity gate compares with torch fp32: pooled, normalised image and text embeddings."""

    @property
    def variants(self) -> Collection[str]:
        """Text-encoder variants served besides the default one (``None`` in ``encode_tokens``)."""
        ...

    def encode_images(self, images: np.ndarray) -> np.ndarray: ...

    def encode_tokens(self, tokens: torch.Tensor | np.ndarray, variant: str | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class AutoDecision:
    """How ``precision=auto`` / ``backend=auto`` picked what serves (``clipcore.backends.auto``).

    ``outcome``: ``chosen`` (measured now and kept), ``remembered`` (read from the kept decision),
    ``deferred`` (the rounds could not tell whether any candidate beats the reference, see
    ``clipcore.backends.auto``: the safe default serves and nothing is kept, so the server measures
    again in the background or at the next load), ``shared`` (read from the model store, where
    ``clip-train tune`` wrote it for this CPU kind: ``tuned_on`` names the machine it was measured
    on). ``margin``: the serving candidate's images/s over the reference's, the median of the
    per-round ratios (for ``deferred``: the comparison in doubt); ``spread``: their interquartile
    range / median, the noise the margin had to beat. ``tie``: the leaders the rounds could not
    rank (each clearly faster than the reference, within each other's noise), when there were
    several: one of them serves, taken by ``clipcore.backends.auto.tie_break``, and ``reason`` says
    which tied and why it won (for ``deferred``, ``reason`` says which comparison was unclear)."""

    outcome: Literal["chosen", "remembered", "deferred", "shared"]
    backend: str
    precision: str
    margin: float | None = None
    spread: float | None = None
    rounds: int = 0
    seconds: float = 0.0
    reason: str | None = None
    at: float = 0.0
    tuned_on: str | None = None
    tie: tuple[str, ...] | None = None

    @property
    def provenance(self) -> str:
        """``shared (tuned on <machine> at <UTC time>)`` for a decision read from the store, else ``local``."""
        if self.outcome != "shared":
            return "local"
        when = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return f"shared (tuned on {self.tuned_on or 'an unnamed machine'} at {when})"


class ServingTowers:
    """Where each kind of batch of one version is encoded: the service's batchers call exactly
    these methods (one per batcher). Pooled image and text features come from ``pooled`` (torch,
    torch under autocast, or ONNX Runtime); DCSM's dense features from ``dense`` (ONNX dense
    graphs) or, when it is None, the version's own torch towers; YUKINO's prompts from torch."""

    def __init__(
        self,
        bundle: ModelBundle,
        pooled: PooledTowers,
        dense: DenseRunner | None = None,
        *,
        pooled_in_dense_pass: bool = False,
    ) -> None:
        self.bundle, self.pooled, self.dense = bundle, pooled, dense
        # Whether the dense pass's pooled output is what ``encode_images`` computes (the same
        # weights at the same precision: torch fp32, ONNX's graphs), so one pass can give both.
        # Under autocast, torch int8 or CUDA graphs the pooled tower computes otherwise than the
        # dense features (which stay torch fp32): two passes keep /embed's values.
        self.pooled_in_dense_pass = pooled_in_dense_pass
        self.auto: AutoDecision | None = None  # set when ``auto`` picked these towers

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """(N, S, S, 3) uint8 preprocessed pixels -> (N, D) normalised embeddings."""
        return self.pooled.encode_images(pixels)

    def encode_texts(self, texts: Sequence[str], encoder: str) -> np.ndarray:
        """Texts -> (N, D) normalised embeddings with the named text encoder."""
        tokens = self.bundle.tokenize(texts)
        key = None if encoder == self.bundle.default_text_encoder else encoder  # towers take None for the default
        return self.pooled.encode_tokens(tokens, key)

    def dense_images(self, pixels: np.ndarray) -> np.ndarray:
        """(N, 1+P, D) normalised class and patch tokens (DCSM)."""
        return self.bundle.encode_dense_images(pixels, self.dense)

    def dense_images_with_pooled(self, pixels: np.ndarray) -> np.ndarray:
        """(N, 2+P, D): row 0 the pooled embedding (``encode_images``' within float rounding, when
        ``pooled_in_dense_pass``), then ``dense_images``' class and patch tokens, from one pass."""
        pooled, tokens = self.bundle.dense_encoder().image_features(pixels, self.dense)
        return torch.cat([pooled[:, None], tokens], dim=1).numpy()

    def dense_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(N, L, D) normalised per-position text features (DCSM)."""
        return self.bundle.encode_dense_texts(texts, self.dense)

    def yukino_prompts(self, pixels: np.ndarray) -> np.ndarray:
        """(N, 2, D) YUKINO's yes and no prompt features of each image."""
        return self.bundle.yukino_prompts(pixels)
