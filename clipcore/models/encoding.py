"""The one image-encoding path: preprocessed uint8 pixels -> L2-normalised features of a tower.

Serving (``ModelBundle``, ``TorchTowers``), evaluation and training all encode images here, with
the version's own ``PreprocessConfig`` (the manifest's mean and std; a model trained from scratch
uses the configuration it is published with), so no caller picks normalisation statistics.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.clip_model import image_features, normalize
from clipcore.models.preprocess import PreprocessConfig


def encode_pixels(
    model: CLIP,
    preprocess: PreprocessConfig,
    pixels: np.ndarray,
    *,
    device: str = "cpu",
    dense: bool = False,
    amp: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, S, S, 3) uint8 -> pooled (N, D) and, with ``dense``, class + patch tokens (N, 1+P, D),
    both L2-normalised in float32 (a norm taken in bf16 is off by a few tenths of a percent), on
    ``device``. ``amp``: an autocast context the tower runs under (None: fp32)."""
    with torch.no_grad():
        x = preprocess.normalize(pixels).to(device)
        with amp if amp is not None else contextlib.nullcontext():
            pooled, tokens = image_features(model, x, dense=dense)
        return normalize(pooled.float()), None if tokens is None else normalize(tokens.float())
