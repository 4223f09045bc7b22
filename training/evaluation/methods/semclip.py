"""SemCLIP's figures: a caption over its negation, retrieval of original and paraphrased captions,
the composite score, and zero-shot with negated prompts.

A data source gives pooled image embeddings and, read by one text encoder, each image's caption,
its paraphrase and its negation (``clipcore.methods.semclip`` holds the math the service shares).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.semclip import composite_score, original_over_negation, retrieval_top1


def caption_over_negation(images: np.ndarray, originals: np.ndarray, negations: np.ndarray) -> float:
    """Share of images whose embedding is closer to their caption than to its negation (chance 0.5)."""
    return float(np.mean(original_over_negation(images, originals, negations)))


def triplet_figures(
    images: np.ndarray,
    originals: np.ndarray,
    paraphrases: np.ndarray,
    negations: np.ndarray,
    kinds: np.ndarray,
    kind_order: Sequence[str],
) -> dict[str, float]:
    """Caption over negation (overall and per kind of negation, in ``kind_order``), top-1
    text-to-image retrieval of the original and the paraphrased captions among these images, and
    the composite score."""
    correct = original_over_negation(images, originals, negations)
    acc_o, acc_p = float(retrieval_top1(originals, images).mean()), float(retrieval_top1(paraphrases, images).mean())
    acc_n = float(correct.mean())
    figures = {
        "orig_over_neg": acc_n,
        "retrieval_orig": acc_o,
        "retrieval_para": acc_p,
        "composite": composite_score(acc_o, acc_p, acc_n),
    }
    for kind in kind_order:
        if (kinds == kind).any():
            figures[f"orig_over_neg.{kind}"] = float(correct[kinds == kind].mean())
    return figures


def prompt_accuracy(images: np.ndarray, classes: np.ndarray, names: Sequence[str], truth: np.ndarray) -> float:
    """Zero-shot accuracy with one prompt per class (the argmax of cosines): with negated prompts
    ("this is not a photo of a X.") a model that reads "not" picks a wrong class."""
    pred = np.asarray(names)[np.argmax(images @ classes.T, axis=1)]
    return float(np.mean(pred == truth))
