"""Two-sided negation over the grammar's forms on a user's labelled images (docs/negation.md).

Each sampled image shows its label (the present side) and not another label drawn for it (the
absent side); every form of ``training.generate.negation_grammar`` is asked on both sides, by DCSM
when the version has a scorer and by plain cosine through every text encoder of the version. The
figures are ``training.evaluation.methods.negation``'s; per-form figures go to the details.
"""

from __future__ import annotations

import numpy as np

from training.evaluation.methods.negation import bundle_negation
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, sample
from training.generate.negation_grammar import NEGATION_FORMS


def negation_forms(es: EvalSet, cfg: UserEvalConfig, seed: int) -> dict[str, dict[str, float]]:
    """Per scorer, every two-sided figure of ``cfg.n_captions`` labelled images (empty with fewer
    than two labels: no image has an absent label to ask about)."""
    labels = sorted({i.record.label for i in es.labelled})  # type: ignore[union-attr]
    if len(labels) < 2:
        return {}
    picked = sample(es.labelled, cfg.n_captions, seed, salt=7)
    rng = np.random.default_rng([seed, 7])
    present = [item.record.label for item in picked]  # type: ignore[union-attr]
    absent = []
    for label in present:
        others = [other for other in labels if other != label]
        absent.append(others[int(rng.integers(len(others)))])
    images = np.stack([es.pixels(item.images[0]) for item in picked])
    return bundle_negation(es.bundle, images, present, absent, NEGATION_FORMS, list(es.bundle.text_models))
