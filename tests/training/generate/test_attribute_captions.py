"""Captions of a labelled image by its declared attributes: each caption is true of the image's
label and every hard negative false of it."""

from __future__ import annotations

import random

from training.generate.attribute_captions import attribute_description, attribute_pair, attribute_without_label

LABELS = {
    "t-shirt": {"sleeves": "short", "front": "plain", "collar": "no"},
    "pullover": {"sleeves": "long", "front": "plain", "collar": "no"},
    "coat": {"sleeves": "long", "front": "open", "collar": "a wide"},
    "shirt": {"sleeves": "long", "front": "buttoned", "collar": "a pointed"},
    "bag": {"handles": "carrying"},
}


def describes(caption: str, attrs: dict[str, str]) -> bool:
    """Whether every "<value> <name>" the caption names is ``attrs``' value."""
    named = [(n, v) for labels in LABELS.values() for n, v in labels.items() if f"{v} {n}" in caption]
    return all(attrs.get(n) == v for n, v in named if f" {v} {n}" in f" {caption}")


def test_an_attribute_pair_is_true_of_its_label_and_each_negative_is_not() -> None:
    rng = random.Random(0)
    for _ in range(50):
        for label, attrs in LABELS.items():
            made = attribute_pair(LABELS, label, rng)
            if len(attrs) < 2:
                assert made is None
                continue
            assert made is not None
            caption, negatives = made
            assert label not in caption and describes(caption, attrs)
            assert negatives and caption not in negatives
            assert not any(describes(n, attrs) for n in negatives)


def test_an_attribute_with_a_negated_label_negates_another_label_and_its_negative_the_own() -> None:
    rng = random.Random(1)
    caption, negatives = attribute_without_label(LABELS, "pullover", rng) or ("", [])
    assert "pullover" not in caption and negatives and all("pullover" in n for n in negatives)
    assert any(other in caption for other in ("t-shirt", "coat", "shirt"))
    assert attribute_without_label(LABELS, "bag", rng) is None  # no other label has carrying handles
    # "no collar" is a negation already: never an attribute with a negated label
    for _ in range(50):
        made = attribute_without_label(LABELS, "t-shirt", rng)
        assert made is not None and "no collar" not in made[0]


def test_a_description_names_two_affirmed_attributes_of_its_label_and_no_label() -> None:
    rng = random.Random(2)
    for _ in range(50):
        for label, attrs in LABELS.items():
            caption = attribute_description(LABELS, label, rng)
            if label == "bag":  # one attribute
                assert caption is None
                continue
            assert caption is not None and describes(caption, attrs)
            assert not any(name in caption for name in LABELS) and "no " not in caption, caption
    # "no collar" is a negation: with one other attribute left there is no pair to describe
    assert attribute_description({"dress": {"sleeves": "short", "legs": "no"}}, "dress", rng) is None
