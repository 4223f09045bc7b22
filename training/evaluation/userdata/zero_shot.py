"""Zero-shot accuracy on the user's labels, with and without the version's comparatives library.

The classifier is exactly the service's ``POST /classify``: the prompts of each label
(``clipcore.tasks``), the comparatives of the version's library whose two labels are both among the
dataset's labels, blended by ``apply_comparatives`` at the request defaults (alpha 0.9, one-sided,
no margin gate). "Confused classes" are the labels those comparatives name: the pairs the library
was built for (the top off-diagonal entries of a calibration confusion matrix). The figures are
``training.evaluation.methods.zero_shot``'s and ``training.evaluation.methods.comparatives``'.
"""

from __future__ import annotations

import numpy as np

from training.datasets.records import LabelRecord
from training.evaluation.methods.comparatives import ComparativeClassifier
from training.evaluation.methods.zero_shot import confusion, label_figures
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, sample


class ZeroShot:
    """Zero-shot figures of one encoder on one evaluation set."""

    def __init__(self, es: EvalSet, cfg: UserEvalConfig, encoder: str) -> None:
        self.es, self.cfg, self.encoder = es, cfg, encoder
        self.labels = sorted({i.record.label for i in es.labelled})  # type: ignore[union-attr]
        self.classifier = ComparativeClassifier(es.bundle, self.labels, encoder, cfg.templates, cfg.alpha,
                                                cfg.symmetric, cfg.gate_margin)  # fmt: skip
        self.comps = self.classifier.comps

    def run(self, seed: int) -> tuple[dict[str, float], dict[str, object]]:
        items = sample(self.es.labelled, self.cfg.n_zeroshot, seed, salt=1)
        y = np.array([self.labels.index(i.record.label) for i in items if isinstance(i.record, LabelRecord)])
        emb = self.es.embed([i.images[0] for i in items])
        standard, comparative = self.classifier.predict(emb)
        flat, figures = label_figures(self.labels, y, standard)
        details: dict[str, object] = {"labels": self.labels, "encoder": self.encoder, "n_images": len(items), **figures}
        if comparative is not None:
            flat.update(self.classifier.figures(y, standard, comparative))
            details["confusion_comparative"] = confusion(y, comparative, len(self.labels)).tolist()
            details["comparative_classes"] = [self.labels[c] for c in self.classifier.targeted]
            details["comparatives"] = len(self.comps)
        return flat, details
