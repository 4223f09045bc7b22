"""Caption over its negation, for every text encoder of the version besides ``base``.

The captions and their negations are exactly those of the hard-negative family's ``negation`` kind
(the same seeded sample, ``training.generate.negatives.toggle_negation``: "with a hood" -> "without
a hood", "a shirt" -> "no shirt"), so ``negation.<encoder>`` is that family's
``hard_negatives.cosine.negation`` (which uses the ``base`` encoder) read with another text encoder:
PC-CLIP's, SemCLIP's, ... The figure is ``training.evaluation.methods.semclip.caption_over_negation``:
the share of images whose pooled embedding is closer to the caption than to its negation (chance
0.5).
"""

from __future__ import annotations

from collections.abc import Sequence

from training.evaluation.methods.semclip import caption_over_negation
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, negative_triples


def negation_by_encoder(es: EvalSet, cfg: UserEvalConfig, encoders: Sequence[str], seed: int) -> dict[str, float]:
    picked, triples = negative_triples(es, cfg, seed)
    rows = [t for t in triples if t[3] == "negation"]
    if not rows or not encoders:
        return {}
    images = es.embed([picked[t[0]][0].images[0] for t in rows])
    out = {}
    for enc in encoders:
        orig = es.bundle.encode_texts([t[1] for t in rows], enc)
        neg = es.bundle.encode_texts([t[2] for t in rows], enc)
        out[f"negation.{enc}"] = caption_over_negation(images, orig, neg)
    return out
