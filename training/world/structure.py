"""A scene's ground truth as a fixed-length vector, and an order-free encoder of it.

Two object slots, left to right; each holds the shape, colour and size one-hots, then whether
the object is left of and above the other one, then x, y, radius and a presence flag (an empty
slot is all zeros). The two relation flags make "left of" / "above" a feature rather than a
comparison of coordinates the encoder would first have to learn.

``SceneEncoder`` reads the two slots without regard to their order (``f(a, b) + f(b, a)``), so
objects stacked vertically at almost the same x are not told apart by which happened to be
further left. It is the image side of the text objective that teaches YUKINO's text encoder to
keep which attribute belongs to which object and where it is
(``training.train_yukino.train_yukino_text``), and perfect image information in
``training.caption_probe``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from training.world.scene import Scene
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZES

_ONE_HOTS = len(SHAPES) + len(COLOUR_NAMES) + len(SIZES)
SLOT = _ONE_HOTS + 2 + 4
SLOTS = 2
WIDTH = SLOTS * SLOT


def scene_features(scene: Scene) -> np.ndarray:
    """``(WIDTH,)`` float32: the first two objects by x, as described above."""
    out = np.zeros((SLOTS, SLOT), dtype=np.float32)
    objects = sorted(scene.objects, key=lambda o: o.x)[:SLOTS]
    for slot, obj in enumerate(objects):
        out[slot, SHAPES.index(obj.shape)] = 1
        out[slot, len(SHAPES) + COLOUR_NAMES.index(obj.colour)] = 1
        out[slot, len(SHAPES) + len(COLOUR_NAMES) + SIZES.index(obj.size)] = 1
        if len(objects) == SLOTS:
            other = objects[1 - slot]
            out[slot, _ONE_HOTS : _ONE_HOTS + 2] = (obj.x < other.x, obj.y < other.y)  # y grows downwards
        out[slot, -4:] = (obj.x, obj.y, obj.radius, 1.0)
    return out.reshape(-1)


class SceneEncoder(nn.Module):
    """``(B, WIDTH)`` scene features -> ``(B, out_dim)``, the same for either slot order."""

    def __init__(self, out_dim: int, width: int = 512) -> None:
        super().__init__()
        self.pair = nn.Sequential(nn.Linear(WIDTH, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                  nn.Linear(width, out_dim))  # fmt: skip

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        swapped = torch.cat([features[:, SLOT:], features[:, :SLOT]], dim=1)
        return self.pair(features) + self.pair(swapped)
