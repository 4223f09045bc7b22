"""Difference texts for PC-CLIP from a user's labels and attributes (no pairs need to be written).

PC-CLIP learns from pairs ``(I1, I2, T12)`` where ``T12`` says how image 1 differs from image 2
in the paper's form "The first image ..., while the second ...". A labelled dataset gives such
pairs for free: two images of different labels, and a text built from their labels and, where
the label set declares them, the attributes that differ. Both orders of every pair are made
(``(a, b)`` and ``(b, a)``), so the model sees each direction.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from training.datasets.records import LabelRecord
from training.datasets.source import Item


def article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def label_difference(a: str, b: str) -> str:
    return f"The first image shows {article(a)} {a}, while the second shows {article(b)} {b}."


def attribute_differences(attrs_a: Mapping[str, str], attrs_b: Mapping[str, str]) -> list[str]:
    """One text per attribute the two labels both declare with different values."""
    texts = []
    for key in sorted(set(attrs_a) & set(attrs_b)):
        va, vb = attrs_a[key], attrs_b[key]
        if va != vb:
            texts.append(f"The first image has {va} {key}, while the second has {vb} {key}.")
    return texts


def difference_texts(a: str, b: str, labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Every difference text of the ordered pair ``(a, b)``: by label, then by each attribute."""
    return [label_difference(a, b), *attribute_differences(labels.get(a, {}), labels.get(b, {}))]


@dataclass(frozen=True)
class GeneratedPair:
    """A pair of labelled images and a text that says how the first differs from the second."""

    first: Item
    second: Item
    difference: str


def pairs_from_labels(
    items: Sequence[Item], labels: Mapping[str, Mapping[str, str]], n_pairs: int, seed: int = 0
) -> list[GeneratedPair]:
    """``n_pairs`` pairs of images with different labels, each in both orders (so ``2 * n_pairs``
    results), texts drawn from ``difference_texts``."""
    labelled = [i for i in items if isinstance(i.record, LabelRecord)]
    by_label: dict[str, list[Item]] = {}
    for item in labelled:
        by_label.setdefault(item.record.label, []).append(item)  # type: ignore[union-attr]
    names = sorted(by_label)
    if len(names) < 2:
        raise ValueError("difference texts need images of at least two labels")
    rng = random.Random(seed)
    out: list[GeneratedPair] = []
    for _ in range(n_pairs):
        a, b = rng.sample(names, 2)
        ia, ib = rng.choice(by_label[a]), rng.choice(by_label[b])
        out.append(GeneratedPair(ia, ib, rng.choice(difference_texts(a, b, labels))))
        out.append(GeneratedPair(ib, ia, rng.choice(difference_texts(b, a, labels))))
    return out
