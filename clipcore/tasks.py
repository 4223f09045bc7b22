"""Task functions: embeddings in, answers out, shared by the service, the evaluation and the naive
server, so a figure in an evaluation describes exactly what the API answers.

Classification is: prompts per label (templates and descriptions), their embeddings averaged per
label, probabilities and cosines of each image against each label, the top labels per image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from clipcore.methods.zero_shot import (
    DEFAULT_TEMPLATES,
    class_embeddings,
    expand_prompts,
    top_k,
    zero_shot_logits,
    zero_shot_probs,
)

__all__ = ["LabelScores", "flat_prompts", "label_embeddings", "label_prompts", "label_scores", "top_labels"]

LabelScores = list[tuple[str, float, float]]  # (label, probability, cosine), best first


def label_prompts(
    labels: Sequence[str],
    templates: Sequence[str] | None = None,
    descriptions: Mapping[str, Sequence[str]] | None = None,
) -> list[list[str]]:
    """The prompts of each label: every template filled with it, plus its free descriptions."""
    templates = list(templates) if templates is not None else list(DEFAULT_TEMPLATES)
    descriptions = descriptions or {}
    return [expand_prompts(label, templates, descriptions.get(label)) for label in labels]


def flat_prompts(prompts: Sequence[Sequence[str]]) -> list[str]:
    """Every prompt once per label, in label order (the order ``label_embeddings`` reads them)."""
    return [p for group in prompts for p in group]


def label_embeddings(prompts: Sequence[Sequence[str]], vectors: np.ndarray) -> tuple[np.ndarray, int]:
    """One embedding per label (the normalised mean of its prompts' rows of ``vectors``, which
    holds ``flat_prompts(prompts)`` first) and how many rows that used."""
    sizes = {len(group) for group in prompts}
    if len(sizes) == 1:  # the same templates for every label: one reshape, no per-label work
        (k,) = sizes
        n = k * len(prompts)
        return class_embeddings(vectors[:n].reshape(len(prompts), k, -1)), n
    groups, offset = [], 0
    for group in prompts:
        groups.append(vectors[offset : offset + len(group)])
        offset += len(group)
    return class_embeddings(groups), offset


def label_scores(images: np.ndarray, labels: np.ndarray, logit_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities (softmax of scaled cosines) and cosines, ``(N images, C labels)`` each."""
    _, cosine = zero_shot_logits(images, labels, logit_scale)
    return zero_shot_probs(images, labels, logit_scale), cosine


def top_labels(probs: np.ndarray, scores: np.ndarray, labels: Sequence[str], k: int) -> list[LabelScores]:
    """Per image, its ``k`` best labels with probability and score, best first."""
    return [top_k(probs[i], scores[i], list(labels), k) for i in range(probs.shape[0])]
