"""Zero-shot classification of shape, colour and size on held-out scenes (both renderers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.zero_shot import zero_shot_logits
from training.evaluation.world.base import EvalBase
from training.probes import ATTRIBUTE_PROMPTS
from training.world.scene import Scene


class ZeroShotEval(EvalBase):
    def zero_shot(self, scenes: Sequence[Scene], emb: np.ndarray, encoder: str) -> dict[str, float]:
        out = {}
        for attribute, (labels, templates) in ATTRIBUTE_PROMPTS.items():
            truth = np.array([getattr(s.objects[0], attribute) for s in scenes])
            keep = np.isin(truth, labels)
            logits, _ = zero_shot_logits(emb[keep], self.classifier(labels, templates, encoder), 1.0)
            out[attribute] = float(np.mean(np.asarray(labels)[logits.argmax(1)] == truth[keep]))
        return out
