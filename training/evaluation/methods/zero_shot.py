"""Zero-shot classification's figures: accuracy, per class, the confusion matrix and its most
confused pairs.

Two readings of the same classifier, kept apart because each source's figures are defined by
theirs: the shapes world reads the argmax of cosines over each attribute's labels (images whose
true value is not among them left out), a user's dataset the argmax of the service's
probabilities (``POST /classify``, ``training.evaluation.methods.comparatives``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.comparative import confused_pairs
from clipcore.methods.zero_shot import zero_shot_logits


def attribute_accuracy(images: np.ndarray, classes: np.ndarray, labels: Sequence[str], truth: np.ndarray) -> float:
    """Share of images whose best label by cosine is their true value, among those whose true
    value is one of ``labels``."""
    keep = np.isin(truth, labels)
    logits, _ = zero_shot_logits(images[keep], classes, 1.0)
    return float(np.mean(np.asarray(labels)[logits.argmax(1)] == truth[keep]))


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(y_true * n + y_pred, minlength=n * n).reshape(n, n)


def label_figures(labels: Sequence[str], y: np.ndarray, pred: np.ndarray) -> tuple[dict[str, float], dict[str, object]]:
    """Accuracy (``zeroshot.acc``); per-class accuracy, the confusion matrix and the three most
    confused pairs (details)."""
    n = len(labels)
    per_class = {labels[c]: float(np.mean(pred[y == c] == c)) for c in range(n) if (y == c).any()}
    details: dict[str, object] = {
        "per_class": per_class,
        "confusion": confusion(y, pred, n).tolist(),
        "confused_pairs": [(labels[a], labels[b], c) for a, b, c in confused_pairs(y, pred, n, 3)],
    }
    return {"zeroshot.acc": float(np.mean(pred == y))}, details
