"""DCSM against plain cosine on hard negatives of the user's captions.

Each caption is scored against a caption that is false of its image and differs by one edit
(``training.generate.negatives``: swapped attributes, a flipped relation, a toggled negation), plus
the user's own negatives where the data has them, and for labelled images (data without
captions) the caption of another label (kind ``label``); ``data.negative_triples`` draws them.
2-way accuracy: the true caption must score higher (chance 0.5). Cosine uses the base encoder's
pooled embeddings; DCSM uses the version's scorer over token x patch maps
(``ModelBundle.score_dense``), what ``POST /score/dense`` answers; the figures are
``training.evaluation.methods.dcsm``'s.
"""

from __future__ import annotations

import numpy as np

from training.evaluation.methods.dcsm import accuracy_by_kind, bundle_wins, cosine_wins
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, negative_triples


def dense_vs_cosine(es: EvalSet, cfg: UserEvalConfig, seed: int) -> dict[str, float]:
    picked, triples = negative_triples(es, cfg, seed)
    if not triples:
        return {}
    bundle = es.bundle
    images = es.embed([p[0].images[0] for p in picked])
    idx = np.array([t[0] for t in triples])
    pos = bundle.encode_texts([t[1] for t in triples], "base")
    neg = bundle.encode_texts([t[2] for t in triples], "base")
    kinds = [t[3] for t in triples]
    flat = {
        f"hard_negatives.cosine.{k}": v for k, v in accuracy_by_kind(kinds, cosine_wins(images[idx], pos, neg)).items()
    }
    if bundle.dcsm is None:
        return flat
    tokens = bundle.encode_dense_images(np.stack([es.pixels(p[0].images[0]) for p in picked]))
    correct = bundle_wins(bundle, tokens, idx, [t[1] for t in triples], [t[2] for t in triples])
    flat.update({f"hard_negatives.dcsm.{k}": v for k, v in accuracy_by_kind(kinds, correct).items()})
    return flat
