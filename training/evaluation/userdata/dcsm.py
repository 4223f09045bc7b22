"""DCSM against plain cosine on hard negatives of the user's captions.

Each caption is scored against a caption that is false of its image and differs by one edit
(``training.generate.negatives``: swapped attributes, a flipped relation, a toggled negation), plus
the user's own negatives where the data has them, and for labelled images (data without
captions) the caption of another label (kind ``label``). 2-way accuracy: the true caption must score
higher (chance 0.5). Cosine uses the base encoder's pooled embeddings; DCSM uses the version's
scorer over token x patch maps (``ModelBundle.score_dense``), what ``POST /score/dense`` answers.
"""

from __future__ import annotations

import numpy as np

from training.evaluation.userdata.data import EvalSet, UserEvalConfig, label_caption, sample
from training.generate.negatives import attribute_words, hard_negatives

Triple = tuple[int, str, str, str]  # index of the image in the sample, caption, negative, kind


def negative_triples(es: EvalSet, cfg: UserEvalConfig, seed: int) -> tuple[list, list[Triple]]:
    picked = sample(es.captioned(), cfg.n_captions, seed, salt=4)
    words = attribute_words(es.dataset.labels)
    triples: list[Triple] = []
    labels = sorted(es.dataset.labels)
    rng = np.random.default_rng([seed, 4])
    for index, (item, caption, own) in enumerate(picked):
        for kind, negative in hard_negatives(caption, words).items():
            triples.append((index, caption, negative, kind))
        triples.extend((index, caption, negative, "user") for negative in own)
        own_label = getattr(item.record, "label", None)
        if own_label is not None and caption == label_caption(own_label):  # a labelled image: another label
            others = [label for label in labels if label != own_label]
            if others:
                triples.append((index, caption, label_caption(others[int(rng.integers(len(others)))]), "label"))
    return picked, triples


def accuracy_by_kind(triples: list[Triple], correct: np.ndarray) -> dict[str, float]:
    kinds = np.array([t[3] for t in triples])
    out = {"all": float(correct.mean())}
    for kind in sorted(set(kinds)):
        out[kind] = float(correct[kinds == kind].mean())
    return out


def dense_vs_cosine(es: EvalSet, cfg: UserEvalConfig, seed: int) -> dict[str, float]:
    picked, triples = negative_triples(es, cfg, seed)
    if not triples:
        return {}
    bundle = es.bundle
    images = es.embed([p[0].images[0] for p in picked])
    idx = np.array([t[0] for t in triples])
    pos = bundle.encode_texts([t[1] for t in triples], "base")
    neg = bundle.encode_texts([t[2] for t in triples], "base")
    cos = np.sum(images[idx] * pos, axis=1) > np.sum(images[idx] * neg, axis=1)
    flat = {f"hard_negatives.cosine.{k}": v for k, v in accuracy_by_kind(triples, cos).items()}
    if bundle.dcsm is None:
        return flat
    correct = np.zeros(len(triples), dtype=bool)
    tokens = bundle.encode_dense_images(np.stack([es.pixels(p[0].images[0]) for p in picked]))
    for image_index in sorted(set(idx.tolist())):
        rows = np.flatnonzero(idx == image_index)
        texts = [triples[r][1] for r in rows] + [triples[r][2] for r in rows]
        scores, _ = bundle.score_dense(tokens[image_index], bundle.encode_dense_texts(texts),
                                       bundle.dense_layouts(texts))  # fmt: skip
        correct[rows] = scores[: len(rows)] > scores[len(rows) :]
    flat.update({f"hard_negatives.dcsm.{k}": v for k, v in accuracy_by_kind(triples, correct).items()})
    return flat
