"""Retrieval on a user's labelled images: a gallery of ``n_gallery`` of them searched by text and by
"like this one, but ..." (figures: ``training.evaluation.methods.retrieval``).

A query's right items are the gallery images whose label satisfies it:

* compositional: two attributes of one label, bound to one item, without its name: "something with
  long sleeves and a pointed collar." is satisfied by every label that declares both values
  (labels.json; data without attributes has none of these queries);
* negated: an attribute value that several labels declare, with one of those labels negated: "a
  thing with long sleeves, not a coat." is satisfied by the other labels with long sleeves
  (pullovers and shirts), not by coats, which the attribute alone would bring; a few labels satisfy
  each, so chance stays low. (A label alone negated, "there is no shirt in this photo.", is
  satisfied by nine labels of ten: a random order scores 0.9 and the figure says nothing.)

Both are written in the frames DCSM trains on for labelled data
(``training.generate.attribute_captions``), as the shapes world's queries are written in its
training forms: the images are held out, the phrasings are not (held-out phrasings are what
the ``negation_forms.*`` figures measure).
* difference: a gallery image of label A with "The first image shows a B, while the second shows
  an A." (first = the wanted image, second = the query: PC-CLIP's label difference text) for a
  label B drawn for it; the right items are the gallery's images of B (``n_captions`` queries per
  seed, at most one per gallery image).
"""

from __future__ import annotations

import numpy as np

from training.evaluation.methods.retrieval import (
    DifferenceQueries,
    TextQueries,
    difference_retrieval,
    text_retrieval,
)
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, sample
from training.generate.attribute_captions import NEGATED_LABEL_FRAMES, PAIR_FRAMES, phrase, shared_values
from training.generate.differences import article, label_difference


def compositional_queries(labels: dict[str, dict[str, str]], gallery_labels: list[str]) -> TextQueries:
    """One query per frame and pair of attributes a label declares (the same text once)."""
    rows: dict[str, set[str]] = {}
    for frame in PAIR_FRAMES:
        for attrs in labels.values():
            names = sorted(attrs)
            for i, first in enumerate(names):
                for second in names[i + 1 :]:
                    text = frame.format(p=phrase(first, attrs[first]), q=phrase(second, attrs[second]))
                    wanted = {first: attrs[first], second: attrs[second]}
                    rows[text] = {lab for lab, a in labels.items() if all(a.get(k) == v for k, v in wanted.items())}
    relevant = np.array([[g in right for g in gallery_labels] for right in rows.values()], dtype=bool)
    return TextQueries("compositional", list(rows), relevant.reshape(len(rows), len(gallery_labels)))


def negated_queries(labels: dict[str, dict[str, str]], gallery_labels: list[str]) -> TextQueries:
    """One query per frame, attribute value and label among those declaring it, where at least one
    other label declares it too (so the query has right items and the negated label is the
    distractor the attribute brings); a value that is a negation itself ("no collar") is left out,
    one negation per query."""
    rows: dict[str, set[str]] = {}
    for frame in NEGATED_LABEL_FRAMES:
        for (name, value), having in shared_values(labels).items():
            for label in having:
                rows[frame.format(p=phrase(name, value), a=f"{article(label)} {label}")] = set(having) - {label}
    relevant = np.array([[g in right for g in gallery_labels] for right in rows.values()], dtype=bool)
    return TextQueries("negated", list(rows), relevant.reshape(len(rows), len(gallery_labels)))


def difference_queries(gallery_labels: list[str], n: int, seed: int) -> DifferenceQueries:
    names = sorted(set(gallery_labels))
    rng = np.random.default_rng([seed, 9])
    picked = rng.permutation(len(gallery_labels))[:n]
    texts, relevant = [], []
    for q in picked:
        own = gallery_labels[q]
        wanted = [name for name in names if name != own][int(rng.integers(len(names) - 1))]
        texts.append(label_difference(wanted, own))
        relevant.append([g == wanted for g in gallery_labels])
    return DifferenceQueries(picked, texts, np.array(relevant, dtype=bool).reshape(len(texts), len(gallery_labels)))


def retrieval(es: EvalSet, cfg: UserEvalConfig, seed: int) -> dict[str, float]:
    """``retrieval.*`` figures of one seed (empty with fewer than two labels)."""
    labels = sorted({i.record.label for i in es.labelled})  # type: ignore[union-attr]
    if len(labels) < 2:
        return {}
    picked = sample(es.labelled, cfg.n_gallery, seed, salt=9)
    gallery_labels = [item.record.label for item in picked]  # type: ignore[union-attr]
    refs = [item.images[0] for item in picked]
    pooled = es.embed(refs)
    bundle = es.bundle
    tokens = None
    if bundle.dcsm is not None:
        pixels = np.stack([es.pixels(r) for r in refs])
        tokens = np.concatenate(
            [bundle.encode_dense_images(pixels[i : i + es.batch_size]) for i in range(0, len(pixels), es.batch_size)]
        )
    declared = {name: dict(es.dataset.labels.get(name, {})) for name in labels}
    k = cfg.rerank_k
    out = text_retrieval(bundle, pooled, tokens, compositional_queries(declared, gallery_labels), k)
    out.update(text_retrieval(bundle, pooled, tokens, negated_queries(declared, gallery_labels), k))
    if len(set(gallery_labels)) >= 2:
        differences = difference_queries(gallery_labels, cfg.n_captions, seed)
        out.update(difference_retrieval(bundle, pooled, differences, k))
    return out
