"""Text-embedding geometry of each encoder on the shapes world's colour words."""

from __future__ import annotations

from training.evaluation.methods.pcclip import difference_geometry
from training.evaluation.world.base import EvalBase
from training.probes import ATTRIBUTE_PROMPTS


class GeometryEval(EvalBase):
    def text_geometry(self, encoder: str) -> dict[str, float]:
        """PC-CLIP's difference geometry (``training.evaluation.methods.pcclip``) over the colour
        labels: class prompts "a photo of a c shape." and, for every ordered pair of colours,
        "The first shape is c1, while the second is c2." and its reversal."""
        labels, templates = ATTRIBUTE_PROMPTS["colour"]
        cls = self.texts([templates[0].format(c) for c in labels], encoder)
        pairs = []
        for i, a in enumerate(labels):
            for j, b in enumerate(labels):
                if i == j:
                    continue
                t_ab, t_ba = self.texts(
                    [
                        f"The first shape is {a}, while the second is {b}.",
                        f"The first shape is {b}, while the second is {a}.",
                    ],
                    encoder,
                )
                pairs.append((i, j, t_ab, t_ba))
        return difference_geometry(cls, pairs)
