"""Text-embedding geometry of each encoder: how far paraphrases, negations and others sit apart."""

from __future__ import annotations

import numpy as np

from training.evaluation.world.base import EvalBase
from training.probes import ATTRIBUTE_PROMPTS


class GeometryEval(EvalBase):
    def text_geometry(self, encoder: str) -> dict[str, float]:
        """Does text space obey difference geometry (in the spirit of the paper's Table 7)?

        ``difference_alignment``: cos(f("The first shape is c1, while the second is c2."),
        normalize(f("a photo of a c1 shape.") - f("a photo of a c2 shape."))), mean over colour
        pairs; ``reversal_cosine``: cos(f(T_ab), f(T_ba)) (negative when order is encoded);
        ``prompt_distance``: mean cosine distance between the class prompts.
        """
        labels, templates = ATTRIBUTE_PROMPTS["colour"]
        cls = self.texts([templates[0].format(c) for c in labels], encoder)
        align, rev = [], []
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
                diff = cls[i] - cls[j]
                align.append(float(t_ab @ diff / (np.linalg.norm(diff) + 1e-12)))
                rev.append(float(t_ab @ t_ba))
        sims = cls @ cls.T
        off = sims[~np.eye(len(labels), dtype=bool)]
        return {
            "difference_alignment": float(np.mean(align)),
            "reversal_cosine": float(np.mean(rev)),
            "prompt_distance": float(np.mean(1 - off)),
        }
