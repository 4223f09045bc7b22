"""Image preprocessing shared by training, evaluation and serving.

Images of any size are resized and cropped or padded to the model's square input as the manifest's
``resize_mode`` and ``interpolation`` say (by default: shorter side, antialiased bicubic, centre
crop, as open_clip's eval transform), then normalised with the manifest's mean and std.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import ExifTags, Image

if TYPE_CHECKING:  # torch is imported where a tensor is made: front-end processes decode images without it
    import torch

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

    def __post_init__(self) -> None:
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std need three values each, std > 0 (got {self.mean}, {self.std})")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"unknown interpolation {self.interpolation!r}; known: {sorted(INTERPOLATIONS)}")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"unknown resize mode {self.resize_mode!r}; known: {list(RESIZE_MODES)}")

    @classmethod
    def from_manifest(cls, preprocess: Mapping[str, Any]) -> PreprocessConfig:
        default = cls()
        return cls(
            mean=tuple(float(x) for x in preprocess.get("mean", default.mean)),
            std=tuple(float(x) for x in preprocess.get("std", default.std)),
            interpolation=str(preprocess.get("interpolation", default.interpolation)),
            resize_mode=str(preprocess.get("resize_mode", default.resize_mode)),
        )

    def fit(self, image: Image.Image, size: int) -> np.ndarray:
        """(size, size, 3) uint8: ``image`` resized and cropped or padded as this version says."""
        return fit_square(image, size, self.interpolation, self.resize_mode)

    def normalize(self, batch: np.ndarray) -> torch.Tensor:
        """(N, H, W, 3) uint8 -> (N, 3, H, W) float32, normalised with this version's mean and std."""
        return normalize_uint8(batch, self.mean, self.std)

    def to_manifest(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "interpolation": self.interpolation,
                "resize_mode": self.resize_mode}  # fmt: skip


INTERPOLATIONS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}
RESIZE_MODES = ("shortest", "longest", "squash")
# Above this many model inputs' worth of pixels, ``shortest`` resizes only the region it keeps.
MAX_INTERMEDIATE = 4


def fit_square(
    image: Image.Image, size: int, interpolation: str = "bicubic", resize_mode: str = "shortest"
) -> np.ndarray:
    """(size, size, 3) uint8 RGB, as open_clip's eval transform makes it: ``shortest`` resizes the
    shorter side to ``size`` and centre-crops; ``longest`` resizes the longer side and pads with
    black around the centre; ``squash`` resizes both sides to ``size``."""
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; known: {sorted(INTERPOLATIONS)}")
    if resize_mode not in RESIZE_MODES:
        raise ValueError(f"unknown resize mode {resize_mode!r}; known: {list(RESIZE_MODES)}")
    resample = INTERPOLATIONS[interpolation]
    if image.mode != "RGB":  # convert() copies even an RGB image: a decoded request's is RGB already
        image = image.convert("RGB")
    w, h = image.size
    if (w, h) == (size, size):
        return np.asarray(image, dtype=np.uint8)
    if resize_mode == "squash":
        return np.asarray(image.resize((size, size), resample, reducing_gap=3.0), dtype=np.uint8)
    if resize_mode == "longest":
        scale = size / max(w, h)
        nw, nh = min(size, max(1, round(w * scale))), min(size, max(1, round(h * scale)))
        canvas = Image.new("RGB", (size, size))
        canvas.paste(image.resize((nw, nh), resample, reducing_gap=3.0), ((size - nw) // 2, (size - nh) // 2))
        return np.asarray(canvas, dtype=np.uint8)
    scale = size / min(w, h)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    left, top = (nw - size) // 2, (nh - size) // 2
    if nw * nh > MAX_INTERMEDIATE * size * size:
        # A long thin image would be resized whole first (a 160000x1 picture to 35M x 224 pixels,
        # gigabytes): resize only the source region that the crop keeps, on the same sampling grid.
        sx, sy = w / nw, h / nh
        box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
        return np.asarray(image.resize((size, size), resample, box=box, reducing_gap=3.0), dtype=np.uint8)
    image = image.resize((nw, nh), resample, reducing_gap=3.0)
    if (nw, nh) != (size, size):  # a square picture needs no crop (nor its copy)
        image = image.crop((left, top, left + size, top + size))
    return np.asarray(image, dtype=np.uint8)


# EXIF orientation -> the transpose that shows the picture as a browser or a phone's gallery does.
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag of an opened image (read from its header, no pixel decoded); 1
    (as stored) when absent, unknown or unreadable."""
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # malformed EXIF must not refuse an image that otherwise decodes
        return 1
    return value if value in _UPRIGHT else 1


def apply_orientation(image: Image.Image, orientation: int) -> Image.Image:
    """``image`` turned as its EXIF ``orientation`` says (phone photos are often stored sideways
    with orientation 6), so "left of" and "above" refer to the picture a person sees."""
    method = _UPRIGHT.get(orientation)
    return image if method is None else image.transpose(method)


def upright(image: Image.Image) -> Image.Image:
    """An opened image, decoded and turned upright by its EXIF orientation."""
    return apply_orientation(image, exif_orientation(image))


def normalize_uint8(batch: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float32 normalised tensor. ``mean`` and ``std`` are a
    version's (``PreprocessConfig.normalize``): no default, so no caller picks them by omission."""
    import torch

    # Cached arrays are read-only; torch needs a writable buffer (copied only when it is not).
    x = torch.from_numpy(np.require(batch, requirements=["C", "W"])).permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - m) / s
