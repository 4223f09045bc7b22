"""The captions a base CLIP trains on at each step of a user's data.

By default every image keeps one caption: its ``caption`` record's, or "a photo of a {label}."
for a labelled image (``training.userdata.context.captioned_images``). With attribute captions
(``BaseRun.attribute_captions``), a labelled image whose label declares two or more attributes
(labels.json) that are not negations ("no collar") is captioned at each step, half the time, by
two of them without the label's name
(``training.generate.attribute_captions.attribute_description``): a text tower that only ever
read "a photo of a {label}." leaves "sleeves" or "collar" at their random embeddings, so a
search by attributes finds nothing in its first stage.

Attribute captions start where the text tower's freeze ends: while it is frozen its random
embeddings serve as fixed class targets (``training.methods.base``), which one caption per label
keeps and varied descriptions would not.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from training.generate.attribute_captions import affirmed, attribute_description

ATTRIBUTE_SHARE = 0.5  # the rest keep "a photo of a {label}.", the prompt zero-shot classification asks with


@dataclass
class BaseCaptions:
    """Each image's fixed caption and, for labelled images, its label (``None`` for a caption record)."""

    texts: Sequence[str]
    labels_of: Sequence[str | None]
    declared: Mapping[str, Mapping[str, str]]  # label -> attribute -> value (labels.json)
    attribute_captions: bool = False
    attributes_from: int = 0  # the first step that draws attribute captions (the text freeze's end)

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels_of):
            raise ValueError("one label (or None) per caption")
        if self.attribute_captions and not self.describable():
            raise ValueError(
                "--attribute-captions: no label of the training images declares two attributes in labels.json"
                " (besides negations such as 'no collar')"
            )

    def describable(self) -> set[str]:
        """The labels with two or more declared attributes that are not negations (those an
        attribute caption describes)."""
        used = {label for label in self.labels_of if label is not None}
        return {label for label in used if len(affirmed(self.declared.get(label, {}))) >= 2}

    def at(self, step: int, rows: Sequence[int], seed: int) -> list[str]:
        """The captions of images ``rows`` at ``step``: the same for the same (seed, step) whatever
        ran before, so a resumed run sees the batches a straight one did."""
        if not self.attribute_captions or step < self.attributes_from:
            return [self.texts[i] for i in rows]
        rng = random.Random(int(np.random.default_rng([seed, step, 11]).integers(2**62)))
        out = []
        for i in rows:
            label = self.labels_of[i]
            described = None
            if label is not None and rng.random() < ATTRIBUTE_SHARE:
                described = attribute_description(self.declared, label, rng)
            out.append(described or self.texts[i])
        return out
