"""Two-sided negation over the grammar's forms on shapes-world scenes (``training.world.negation``):
DCSM and plain cosine through every text encoder of the version; figures as
``training.evaluation.methods.negation`` defines them."""

from __future__ import annotations

from training.evaluation.methods.negation import bundle_negation
from training.evaluation.world.base import EvalBase, generator_images
from training.generate.negation_grammar import NEGATION_FORMS
from training.world.negation import negation_scene
from training.world.scene import Split

NEGATION_OFFSET = 2 * 10**6  # evaluation scenes never coincide with training ones


class NegationEval(EvalBase):
    def negation_forms(self, seed: int, split: Split = Split.TEST) -> dict[str, dict[str, float]]:
        """Per scorer (``dcsm``, each text encoder): every two-sided figure of ``n_negation`` TEST scenes."""
        samples = [negation_scene(split, seed, NEGATION_OFFSET + i) for i in range(self.cfg.n_negation)]
        images = generator_images([s.scene for s in samples])
        return bundle_negation(self.bundle, images, [s.present for s in samples], [s.absent for s in samples],
                               NEGATION_FORMS, self.encoders)  # fmt: skip
