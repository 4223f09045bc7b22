"""Winoground-style 2x2 items on the user's data: two images, each with the caption true of it.

Items pair two labelled images of different labels (captions ``label_caption``), or the two images
of the user's pair records when their labels are known. Text / image / group scores
(``training.evaluation.methods.yukino``) for plain cosine with the base encoder and, when the
version has a YUKINO head, for its yes/no prompts of each image's inverted pseudo-token.
"""

from __future__ import annotations

import random

import numpy as np

from training.datasets.source import ImageRef
from training.evaluation.methods.yukino import cosine_2x2, winoground_means, yes_no_2x2
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
    scores = {"cosine": cosine_2x2(g0, g1, b0, b1)}
    if bundle.yukino is not None:
        enc = bundle.yukino.text_encoder
        c0, c1 = bundle.encode_texts([i[2] for i in items], enc), bundle.encode_texts([i[3] for i in items], enc)
        p0 = bundle.yukino_prompts(np.stack([es.pixels(i[0]) for i in items]))
        p1 = bundle.yukino_prompts(np.stack([es.pixels(i[1]) for i in items]))
        scores["yukino"] = yes_no_2x2(p0, p1, c0, c1)
    flat = {}
    for method, method_scores in scores.items():
        for name, value in winoground_means(method_scores).items():
            flat[f"winoground.{name}.{method}"] = value
    return flat
