"""Pair ranking on the user's data: which of two images is "the first" of a difference text.

Texts are PC-CLIP's class-difference texts (``training.generate.differences``): "The first image
shows a shirt, while the second shows a coat." and, where the label set declares attributes, one
per differing attribute. The two images are presented in a random order per pair (half the pairs
swapped), so a model that ignores the text scores 0.5. The user's own pair records in the
evaluated split are scored the same way; the figure is ``training.evaluation.methods.pcclip``'s, as
on the shapes world.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from training.datasets.records import PairRecord
from training.datasets.source import ImageRef
from training.evaluation.methods.pcclip import presented, ranked_right, swapped
from training.evaluation.userdata.data import EvalSet, UserEvalConfig
from training.generate.differences import attribute_differences, label_difference

Pair = tuple[ImageRef, ImageRef, str, str]  # first image, second image, text true of (first, second), kind


def label_pairs(es: EvalSet, n: int, seed: int) -> list[Pair]:
    """``n`` pairs of labelled images with different labels; the text of each is drawn from its
    label text and its attribute texts (kind ``label`` or ``attribute``)."""
    by_label = es.images_by_label()
    names = sorted(by_label)
    if len(names) < 2:
        return []
    rng = random.Random(seed * 1000 + 2)
    out: list[Pair] = []
    for _ in range(n):
        a, b = rng.sample(names, 2)
        texts = [(label_difference(a, b), "label")]
        texts += [(t, "attribute") for t in attribute_differences(es.dataset.labels.get(a, {}),
                                                                    es.dataset.labels.get(b, {}))]  # fmt: skip
        text, kind = rng.choice(texts)
        out.append((rng.choice(by_label[a]), rng.choice(by_label[b]), text, kind))
    return out


def record_pairs(es: EvalSet) -> list[Pair]:
    return [
        (i.images[0], i.images[1], i.record.difference, "records") for i in es.pairs if isinstance(i.record, PairRecord)
    ]


def ranking(es: EvalSet, pairs: Sequence[Pair], encoders: Sequence[str], seed: int) -> dict[str, float]:
    """Accuracy per encoder, overall (``rank_pair.<encoder>``) and per kind of text."""
    if not pairs:
        return {}
    firsts = es.embed([p[0] for p in pairs])
    seconds = es.embed([p[1] for p in pairs])
    swap = swapped(np.random.default_rng([seed, 3]), len(pairs))
    ga, gb = presented(firsts, seconds, swap)
    kinds = np.array([p[3] for p in pairs])
    out: dict[str, float] = {}
    for enc in encoders:
        correct = ranked_right(ga, gb, es.bundle.encode_texts([p[2] for p in pairs], enc), swap)
        for kind in sorted(set(kinds)):
            out[f"rank_pair.{kind}.{enc}"] = float(correct[kinds == kind].mean())
    return out


def pair_ranking(es: EvalSet, cfg: UserEvalConfig, encoders: Sequence[str], seed: int) -> dict[str, float]:
    flat = ranking(es, label_pairs(es, cfg.n_pairs, seed), encoders, seed)
    flat.update(ranking(es, record_pairs(es), encoders, seed))
    return flat
