"""Retrieval on a user's labelled images: a gallery of ``n_gallery`` of them searched by text and by
"like this one, but ..." (figures: ``training.evaluation.methods.retrieval``).

A query's right items are the gallery images whose label satisfies it:

* compositional: two attributes of one label, bound to one item, without its name: "a photo of an
  item with long sleeves and a pointed collar." is satisfied by every label that declares both
  values (labels.json; data without attributes has none of these queries);
* negated: every label in the negated form of each phrasing of the negation grammar
  (``training.generate.negation_grammar``, docs/negation.md): "there is no shirt in this photo." is
  satisfied by every image of another label, as "a dress without sleeves" is by the dresses that
  have none (most of a gallery satisfies it, so chance is high and recall@10 is precision@10);
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
from training.generate.differences import label_difference
from training.generate.negation_grammar import NEGATION_FORMS


def attribute_phrase(name: str, value: str) -> str:
    """``long sleeves``, ``a pointed collar``, ``no collar``: a declared value with its attribute."""
    return f"{value} {name}"


def compositional_queries(labels: dict[str, dict[str, str]], gallery_labels: list[str]) -> TextQueries:
    """One query per pair of attributes a label declares (the same text once)."""
    rows: dict[str, set[str]] = {}
    for attrs in labels.values():
        names = sorted(attrs)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                text = (f"a photo of an item with {attribute_phrase(first, attrs[first])} and "
                        f"{attribute_phrase(second, attrs[second])}.")  # fmt: skip
                wanted = {first: attrs[first], second: attrs[second]}
                rows[text] = {label for label, a in labels.items() if all(a.get(k) == v for k, v in wanted.items())}
    relevant = np.array([[g in right for g in gallery_labels] for right in rows.values()], dtype=bool)
    return TextQueries("compositional", list(rows), relevant.reshape(len(rows), len(gallery_labels)))


def negated_queries(names: list[str], gallery_labels: list[str]) -> TextQueries:
    texts, relevant = [], []
    for form in NEGATION_FORMS:
        for label in names:
            texts.append(form.pair(label)[1])
            relevant.append([g != label for g in gallery_labels])
    return TextQueries("negated", texts, np.array(relevant, dtype=bool).reshape(len(texts), len(gallery_labels)))


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
    out = text_retrieval(bundle, pooled, tokens, compositional_queries(declared, gallery_labels))
    out.update(text_retrieval(bundle, pooled, tokens, negated_queries(labels, gallery_labels)))
    if len(set(gallery_labels)) >= 2:
        out.update(difference_retrieval(bundle, pooled, difference_queries(gallery_labels, cfg.n_captions, seed)))
    return out
