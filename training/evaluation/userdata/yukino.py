"""Winoground-style 2x2 items on the user's data: two images, each with the caption true of it.

Items pair two labelled images of different labels (captions ``label_caption``), or the two images
of the user's pair records when their labels are known. Text / image / group scores
(``clipcore.methods.yukino.winoground``) for plain cosine with the base encoder and, when the
version has a YUKINO head, for its yes/no prompts of each image's inverted pseudo-token.
"""

from __future__ import annotations

import random

import numpy as np

from clipcore.methods.yukino import paired_yes_no_scores, winoground
from training.datasets.source import ImageRef
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, label_caption


def items_2x2(es: EvalSet, n: int, seed: int) -> list[tuple[ImageRef, ImageRef, str, str]]:
    by_label = es.images_by_label()
    names = sorted(by_label)
    if len(names) < 2:
        return []
    rng = random.Random(seed * 1000 + 6)
    out = []
    for _ in range(n):
        a, b = rng.sample(names, 2)
        out.append((rng.choice(by_label[a]), rng.choice(by_label[b]), label_caption(a), label_caption(b)))
    return out


def yukino_2x2(es: EvalSet, cfg: UserEvalConfig, seed: int) -> dict[str, float]:
    items = items_2x2(es, cfg.n_yukino, seed)
    if not items:
        return {}
    bundle = es.bundle
    g0, g1 = es.embed([i[0] for i in items]), es.embed([i[1] for i in items])
    b0, b1 = bundle.encode_texts([i[2] for i in items], "base"), bundle.encode_texts([i[3] for i in items], "base")
    scores = {"cosine": [np.sum(g * c, axis=1) for g, c in ((g0, b0), (g0, b1), (g1, b0), (g1, b1))]}
    if bundle.yukino is not None:
        enc = bundle.yukino.text_encoder
        c0, c1 = bundle.encode_texts([i[2] for i in items], enc), bundle.encode_texts([i[3] for i in items], enc)
        p0 = bundle.yukino_prompts(np.stack([es.pixels(i[0]) for i in items]))
        p1 = bundle.yukino_prompts(np.stack([es.pixels(i[1]) for i in items]))

        def yn(p: np.ndarray, c: np.ndarray) -> np.ndarray:
            return paired_yes_no_scores(p[:, 0], p[:, 1], c)

        scores["yukino"] = [yn(p0, c0), yn(p0, c1), yn(p1, c0), yn(p1, c1)]
    flat = {}
    for method, (s00, s01, s10, s11) in scores.items():
        for name, hits in winoground(s00, s01, s10, s11).items():
            flat[f"winoground.{name}.{method}"] = float(hits.mean())
    return flat
