"""Captions of a labelled image by its label's declared attributes (labels.json), without the label's
name, each with hard negatives that a scorer can only tell apart by reading the attributes.

* attribute pair: "something with long sleeves and a plain front." (a pullover) against the same
  caption with one value another label declares for that attribute ("... short sleeves and a plain
  front.", a t-shirt) and against another label's pair;
* attribute with a negated label: "a thing with long sleeves, not a coat." for a label that declares
  the value while another does too, against the caption that negates the image's own label;
* a description alone (``attribute_description``): the attribute pair's caption without its
  negatives, what a base CLIP trains on beside "a photo of a {label}." (``clip-train base
  --attribute-captions``) so its text tower reads the attribute words a search asks with.

The retrieval figures of ``clip-train evaluate --data`` ask their compositional and negated
queries in these frames (``training.evaluation.userdata.retrieval``) on held-out images, as the
shapes world's queries use its training forms. Pure: strings and a seeded rng in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from training.generate.differences import article

PAIR_FRAMES = ("something with {p} and {q}.", "{p} and {q}", "a thing with {p} and {q}.")
NEGATED_LABEL_FRAMES = ("a thing with {p}, not {a}.", "{p} without being {a}")
NEGATING_WORDS = frozenset({"no", "not", "without"})
Labels = Mapping[str, Mapping[str, str]]


def phrase(name: str, value: str) -> str:
    """``long sleeves``, ``a pointed collar``: a value with its attribute, as the evaluation writes it."""
    return f"{value} {name}"


def shared_values(labels: Labels) -> dict[tuple[str, str], list[str]]:
    """Each (attribute, value) that two or more labels declare, with those labels in sorted order;
    a value that is a negation itself ("no collar") is left out: one negation per caption."""
    declaring: dict[tuple[str, str], list[str]] = {}
    for label, attrs in sorted(labels.items()):
        for name, value in attrs.items():
            if name in affirmed(attrs):
                declaring.setdefault((name, value), []).append(label)
    return {key: having for key, having in sorted(declaring.items()) if len(having) >= 2}


def attribute_pair(labels: Labels, label: str, rng: random.Random) -> tuple[str, list[str]] | None:
    """A caption of two of ``label``'s attributes and its hard negatives (None with fewer than two
    attributes, or when no edit describes another label's item)."""
    attrs = labels.get(label, {})
    if len(attrs) < 2:
        return None
    first, second = rng.sample(sorted(attrs), 2)
    frame = PAIR_FRAMES[rng.randrange(len(PAIR_FRAMES))]

    def caption(a: Mapping[str, str]) -> str:
        return frame.format(p=phrase(first, a[first]), q=phrase(second, a[second]))

    own = caption(attrs)
    negatives = []
    for name in (first, second):
        for other, other_attrs in sorted(labels.items()):
            value = other_attrs.get(name)
            if other != label and value is not None and value != attrs[name]:
                negatives.append(caption({**attrs, name: value}))
    others = [a for lab, a in sorted(labels.items()) if lab != label and first in a and second in a]
    negatives += [caption(a) for a in others]
    negatives = [n for n in dict.fromkeys(negatives) if n != own]
    return (own, negatives) if negatives else None


def affirmed(attrs: Mapping[str, str]) -> dict[str, str]:
    """The attributes whose value is not a negation itself ("no collar" is left out)."""
    return {name: value for name, value in attrs.items() if value.split()[0].lower() not in NEGATING_WORDS}


def attribute_description(labels: Labels, label: str, rng: random.Random) -> str | None:
    """A caption of two of ``label``'s declared attributes in one of ``PAIR_FRAMES``, without the
    label's name: "something with long sleeves and a plain front." (None with fewer than two
    attributes that are not negations). No negation is written, not even a declared "no collar":
    a pooled text embedding cannot learn "no" from contrastive captions, it learns "no" as a
    feature of the items that lack something, and then prefers "no photo of a shirt." to "a
    photo of a shirt." on most photos; the held-out negation phrasings stay unread too."""
    attrs = affirmed(labels.get(label, {}))
    if len(attrs) < 2:
        return None
    first, second = rng.sample(sorted(attrs), 2)
    frame = PAIR_FRAMES[rng.randrange(len(PAIR_FRAMES))]
    return frame.format(p=phrase(first, attrs[first]), q=phrase(second, attrs[second]))


def attribute_without_label(labels: Labels, label: str, rng: random.Random) -> tuple[str, list[str]] | None:
    """ "A thing with long sleeves, not a coat." for an image of ``label`` (a pullover), with the
    caption negating the image's own label as the hard negative (None when no other label
    declares a value of ``label``'s)."""
    options = [
        (name, value, other)
        for (name, value), having in shared_values(labels).items()
        if label in having
        for other in having
        if other != label
    ]
    if not options:
        return None
    name, value, other = options[rng.randrange(len(options))]
    frame = NEGATED_LABEL_FRAMES[rng.randrange(len(NEGATED_LABEL_FRAMES))]

    def caption(negated: str) -> str:
        return frame.format(p=phrase(name, value), a=f"{article(negated)} {negated}")

    return caption(other), [caption(label)]
