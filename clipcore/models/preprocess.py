"""Image preprocessing shared by training, evaluation and serving.

Images of any size are resized (shorter side, antialiased bicubic) and centre-cropped to the
model's square input, then normalised with the manifest's mean and std.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class PreprocessConfig:
    """A version's preprocessing as its manifest records it (OpenAI CLIP's values when unset):
    read once here, so every path (serving, training, evaluation, export) uses the same values."""

    mean: tuple[float, ...] = OPENAI_MEAN
    std: tuple[float, ...] = OPENAI_STD
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"

    @classmethod
    def from_manifest(cls, preprocess: Mapping[str, Any]) -> PreprocessConfig:
        default = cls()
        return cls(
            mean=tuple(float(x) for x in preprocess.get("mean", default.mean)),
            std=tuple(float(x) for x in preprocess.get("std", default.std)),
            interpolation=str(preprocess.get("interpolation", default.interpolation)),
            resize_mode=str(preprocess.get("resize_mode", default.resize_mode)),
        )

    def to_manifest(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "interpolation": self.interpolation,
                "resize_mode": self.resize_mode}  # fmt: skip


def fit_square(image: Image.Image, size: int) -> np.ndarray:
    """(size, size, 3) uint8: RGB, shorter side resized to ``size``, centre crop."""
    image = image.convert("RGB")
    w, h = image.size
    if (w, h) != (size, size):
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        image = image.resize((nw, nh), Image.Resampling.BICUBIC, reducing_gap=3.0)
        left, top = (nw - size) // 2, (nh - size) // 2
        image = image.crop((left, top, left + size, top + size))
    return np.asarray(image, dtype=np.uint8)


def normalize_uint8(
    batch: np.ndarray, mean: Sequence[float] = OPENAI_MEAN, std: Sequence[float] = OPENAI_STD
) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float32 normalised tensor."""
    # Cached arrays are read-only; torch needs a writable buffer (copied only when it is not).
    x = torch.from_numpy(np.require(batch, requirements=["C", "W"])).permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - m) / s
