"""The torch backend: a version's own towers, in fp32 or under bf16 / fp16 autocast."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import normalize, text_features
from clipcore.models.encoding import encode_pixels

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class TorchTowers:
    """The bundle's pooled torch towers as the batchers call them, under autocast when ``dtype`` is set."""

    def __init__(self, bundle: ModelBundle, dtype: torch.dtype | None = None) -> None:
        self.bundle, self.dtype = bundle, dtype
        self.variants = [v for v in bundle.text_models if v != bundle.default_text_encoder]

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        assert self.dtype is not None
        with torch.no_grad(), torch.autocast(torch.device(self.bundle.device).type, dtype=self.dtype):
            yield

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            return self.bundle.encode_images(images)
        amp = torch.autocast(torch.device(self.bundle.device).type, dtype=self.dtype)
        pooled, _ = encode_pixels(self.bundle.model, self.bundle.preprocess_config, images,
                                  device=self.bundle.device, amp=amp)  # fmt: skip
        return pooled.cpu().numpy()

    def encode_tokens(self, tokens: torch.Tensor | np.ndarray, variant: str | None = None) -> np.ndarray:
        tokens = torch.as_tensor(tokens)
        if self.dtype is None:
            return self.bundle.encode_tokens(tokens, variant)
        with self._autocast():
            features = text_features(self.bundle.text_model(variant), tokens.to(self.bundle.device))[0]
        return normalize(features.float()).cpu().numpy()
