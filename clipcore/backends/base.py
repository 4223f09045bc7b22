"""The seam every backend fits: what a batch of images or tokens is encoded by, and its error.

The service's batchers call these named methods of one towers object chosen per version by
``clipcore.backends.select``; the parity gate compares any of them with torch fp32.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import numpy as np
import torch


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
