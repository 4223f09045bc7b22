"""Comparative prompting on the shapes world: colour-shape classification, comparatives for the
pairs most confused on a calibration set, the setting chosen by
``training.evaluation.methods.comparatives.calibrated_sweep``."""

from __future__ import annotations

import numpy as np

from clipcore.methods.comparative import confused_pairs
from clipcore.methods.zero_shot import zero_shot_probs
from training.evaluation.methods.comparatives import calibrated_sweep
from training.evaluation.world.base import EvalBase, generator_images
from training.probes import ATTRIBUTE_PROMPTS
from training.world.differences import comparative_text
from training.world.scene import Split, sample_scene
from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, SHAPES


class ComparativeEval(EvalBase):
    def comparative(self, seed: int, encoder: str) -> dict[str, object]:
        """Colour-shape classification with and without comparatives on the 3 most-confused pairs.

        Labels are the trained colour-shape combinations ("red circle", ...), so the three
        pairs target a few of 30 classes and "overall" shows what happens to the others.

        The comparative configuration (alpha, symmetric, gate) is chosen on a calibration set
        and reported on a disjoint test set; the whole sweep is kept for the table.
        """
        labels = [f"{c} {s}" for c in COLOUR_NAMES for s in SHAPES if (c, s) not in HELD_OUT_COMBOS]
        templates = ATTRIBUTE_PROMPTS["shape"][1]
        cls = self.classifier(labels, templates, encoder)

        def split_set(offset: int) -> tuple[np.ndarray, np.ndarray]:
            key = (seed, offset)
            if key not in self._image_sets:  # shared by every encoder
                scenes = [
                    sample_scene(Split.TEST, seed, offset + i, n_objects=1) for i in range(self.cfg.n_calibration)
                ]
                y = np.array([labels.index(f"{s.objects[0].colour} {s.objects[0].shape}") for s in scenes])
                self._image_sets[key] = (self.images(generator_images(scenes)), y)
            return self._image_sets[key]

        calibration, test = split_set(2 * 10**6), split_set(3 * 10**6)
        std_cal = zero_shot_probs(calibration[0], cls, self.bundle.logit_scale)
        pairs = confused_pairs(calibration[1], std_cal.argmax(1), len(labels), 3)
        comps = []
        for a, b, _ in pairs:
            for x, y in ((a, b), (b, a)):
                d = self.texts([comparative_text(labels[x], labels[y], "combo")], encoder)[0]
                comps.append((x, y, d))
        targeted = sorted({c for a, b, _ in pairs for c in (a, b)})
        figures = calibrated_sweep(calibration, test, cls, comps, targeted, self.bundle.logit_scale)
        return {"pairs": [(labels[a], labels[b], int(n)) for a, b, n in pairs], **figures}
