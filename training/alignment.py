"""Token-to-object alignment supervision for base training (dense localisation).

For every caption token that names an attribute (colour, shape or size word), the softmax
over image patches of its similarity to each patch is pulled toward the ground-truth mask
of the object(s) that have that attribute. Real CLIP training has no masks: this is a
property of the shapes-world recipe, stated in the model card, and it is what makes the
token x patch maps usable for dense scoring.
"""

from __future__ import annotations

import numpy as np
import torch

from clipcore.methods.token_spans import find_word_spans
from clipcore.models.clip_model import tokenizer_for
from training.world.render import object_mask
from training.world.scene import Scene
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZES

ATTRIBUTE_OF = {**{c: "colour" for c in COLOUR_NAMES}, **{s: "shape" for s in SHAPES}, **{z: "size" for z in SIZES}}


def patch_masks(scene: Scene, image_size: int, grid: int) -> np.ndarray:
    """(objects, grid*grid) fraction of each patch covered by each object."""
    cell = image_size // grid
    out = []
    for obj in scene.objects:
        m = object_mask(obj, image_size).astype(np.float32)
        out.append(m.reshape(grid, cell, grid, cell).mean(axis=(1, 3)).reshape(-1))
    return np.stack(out)


class AlignmentTargets:
    """Builds (batch index, token index, target patch distribution) triples for a batch."""

    def __init__(self, context_length: int, image_size: int = 64, grid: int = 8) -> None:
        tok = tokenizer_for(context_length)
        self.word_ids = {w: tok.encode(w) for w in ATTRIBUTE_OF}
        self.image_size, self.grid = image_size, grid
        self._spans: dict[tuple[int, ...], list[tuple[int, int, str]]] = {}

    def spans(self, ids: list[int]) -> list[tuple[int, int, str]]:
        key = tuple(ids)
        if key not in self._spans:
            self._spans[key] = find_word_spans(ids, self.word_ids)
        return self._spans[key]

    def __call__(self, scenes: list[Scene], tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, cols, targets = [], [], []
        for b, (scene, ids) in enumerate(zip(scenes, tokens.tolist())):
            masks = None
            for start, end, word in self.spans(ids):
                attribute = ATTRIBUTE_OF[word]
                owners = [k for k, o in enumerate(scene.objects) if getattr(o, attribute) == word]
                if not owners:
                    continue
                if masks is None:
                    masks = patch_masks(scene, self.image_size, self.grid)
                target = masks[owners].sum(0)
                if target.sum() <= 0:
                    continue
                for t in range(start, end):
                    rows.append(b)
                    cols.append(t)
                    targets.append(target / target.sum())
        if not rows:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, self.grid**2)
        return torch.tensor(rows), torch.tensor(cols), torch.from_numpy(np.stack(targets)).float()
