"""Zero-shot classification of shape, colour and size on held-out scenes (both renderers); the
figure is ``training.evaluation.methods.zero_shot.attribute_accuracy``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.evaluation.methods.zero_shot import attribute_accuracy
from training.evaluation.world.base import EvalBase
from training.probes import ATTRIBUTE_PROMPTS
from training.world.scene import Scene


class ZeroShotEval(EvalBase):
    def zero_shot(self, scenes: Sequence[Scene], emb: np.ndarray, encoder: str) -> dict[str, float]:
        out = {}
        for attribute, (labels, templates) in ATTRIBUTE_PROMPTS.items():
            truth = np.array([getattr(s.objects[0], attribute) for s in scenes])
            out[attribute] = attribute_accuracy(emb, self.classifier(labels, templates, encoder), labels, truth)
        return out
