"""SemCLIP's test on the user's captions: does a caption beat its negation for its own image?

Negations come from ``training.generate.negatives.toggle_negation`` ("with a hood" -> "without a
hood", "a shirt" -> "no shirt"); the figure is ``clipcore.methods.semclip.original_over_negation``
for every text encoder of the version (``base`` and, when trained, the SemCLIP variants).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.semclip import original_over_negation
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, sample
from training.generate.negatives import toggle_negation


def semclip_negation(es: EvalSet, cfg: UserEvalConfig, encoders: Sequence[str], seed: int) -> dict[str, float]:
    picked = sample(es.captioned(), cfg.n_captions, seed, salt=5)
    rows = [(p[0].images[0], p[1], toggle_negation(p[1])) for p in picked]
    rows = [r for r in rows if r[2] is not None and r[2] != r[1]]
    if not rows:
        return {}
    images = es.embed([r[0] for r in rows])
    out = {}
    for enc in encoders:
        orig = es.bundle.encode_texts([r[1] for r in rows], enc)
        neg = es.bundle.encode_texts([str(r[2]) for r in rows], enc)
        out[f"semclip.orig_over_neg.{enc}"] = float(np.mean(original_over_negation(images, orig, neg)))
    return out
