"""A comparatives library for a user's labels: the pairs the model confuses, and texts for each.

1. Confused pairs: zero-shot predictions on a labelled calibration split, the top off-diagonal
   entries of the confusion matrix (``confused_pairs``).
2. Texts for each pair in both directions from a pluggable generator: ``TemplateGenerator``
   (from the label set's attributes, no network) or ``LLMGenerator`` (an OpenAI-compatible chat
   endpoint, ``training.generate.llm``).
3. The library (``[{"a", "b", "text"}, ...]``, the format ``comparatives.json`` of a version
   holds) goes into a new version, so ``POST /classify?comparative=true`` uses it for these labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from clipcore.methods.comparative import confused_pairs
from training.generate.differences import article, attribute_differences
from training.generate.llm import ChatClient, llm_comparatives


class ComparativeGenerator(Protocol):
    name: str

    def texts(self, a: str, b: str) -> list[str]:
        """Texts saying how label ``a`` differs from label ``b`` ("The first ..., while the second ...")."""
        ...


@dataclass
class TemplateGenerator:
    """From the label set: one text per differing declared attribute, else a label-only text."""

    labels: Mapping[str, Mapping[str, str]]
    name: str = "template"

    def texts(self, a: str, b: str) -> list[str]:
        by_attribute = attribute_differences(self.labels.get(a, {}), self.labels.get(b, {}))
        # The comparative is read as f(a) - f(b): name the classes too, so the text carries both.
        named = [
            t.replace("The first image has", f"The first image shows {article(a)} {a} with", 1).replace(
                "while the second has", f"while the second shows {article(b)} {b} with", 1
            )
            for t in by_attribute
        ]
        return named or [f"The first image shows {article(a)} {a}, while the second shows {article(b)} {b}."]


@dataclass
class LLMGenerator:
    client: ChatClient
    samples: int = 3
    name: str = "llm"

    def texts(self, a: str, b: str) -> list[str]:
        return llm_comparatives(self.client, a, b, self.samples)


def confused_label_pairs(
    y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray, labels: Sequence[str], k: int
) -> list[tuple[str, str, int]]:
    pairs = confused_pairs(np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64), len(labels), k)
    return [(labels[a], labels[b], count) for a, b, count in pairs]


def build_library(pairs: Sequence[tuple[str, str]], generator: ComparativeGenerator) -> list[dict[str, str]]:
    """Comparatives for each pair in both directions; a direction with no usable text is left out."""
    library = []
    for a, b in pairs:
        for first, second in ((a, b), (b, a)):
            for text in generator.texts(first, second):
                library.append({"a": first, "b": second, "text": text, "source": generator.name})
    return library
