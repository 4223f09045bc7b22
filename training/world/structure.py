"""A scene's ground truth as a fixed-length vector: what its captions should let one read off.

Two object slots, left to right; each holds the shape, colour and size one-hots, then x, y,
radius and a presence flag (an empty slot is all zeros). Used as a regression target that teaches
a text encoder to keep which attribute belongs to which object and where it is
(``training.train_yukino.train_yukino_text``), and as perfect image information in
``training.caption_probe``.
"""

from __future__ import annotations

import numpy as np

from training.world.scene import Scene
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZES

SLOT = len(SHAPES) + len(COLOUR_NAMES) + len(SIZES) + 4
SLOTS = 2
WIDTH = SLOTS * SLOT


def scene_features(scene: Scene) -> np.ndarray:
    """``(WIDTH,)`` float32: the first two objects by x, as described above."""
    out = np.zeros((SLOTS, SLOT), dtype=np.float32)
    for slot, obj in enumerate(sorted(scene.objects, key=lambda o: o.x)[:SLOTS]):
        out[slot, SHAPES.index(obj.shape)] = 1
        out[slot, len(SHAPES) + COLOUR_NAMES.index(obj.colour)] = 1
        out[slot, len(SHAPES) + len(COLOUR_NAMES) + SIZES.index(obj.size)] = 1
        out[slot, -4:] = (obj.x, obj.y, obj.radius, 1.0)
    return out.reshape(-1)
