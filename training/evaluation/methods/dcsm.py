"""DCSM's figure: 2-way accuracy of a caption over a hard negative of it for the same image (chance
0.5), by DCSM's dense score and by plain pooled cosine, overall and per kind of negative.

Two scoring paths, kept side by side because each source's figures are defined by theirs: the
shapes world scores a whole set of items at once through ``DenseEncoder`` and the scorer
(``encoder_wins``; its image tokens also feed the world's training-free readout), a user's dataset
scores each image's captions through the version's bundle (``bundle_wins``), exactly what
``POST /score/dense`` answers. A data source gives the images, the captions and their negatives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from clipcore.models.bundle import ModelBundle
from clipcore.models.dense import DCSMHead, DenseEncoder


def cosine_wins(images: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """Per row, whether the image's pooled embedding is closer to the caption than to the negative."""
    return np.sum(images * positives, axis=1) > np.sum(images * negatives, axis=1)


def bundle_wins(
    bundle: ModelBundle, tokens: np.ndarray, image_of: np.ndarray, positives: Sequence[str], negatives: Sequence[str]
) -> np.ndarray:
    """Per row, whether DCSM scores the caption above the negative on image ``image_of[row]``
    (``tokens``: the dense tokens of each image), one call of ``bundle.score_dense`` per image."""
    correct = np.zeros(len(image_of), dtype=bool)
    for image_index in sorted(set(image_of.tolist())):
        rows = np.flatnonzero(image_of == image_index)
        texts = [positives[r] for r in rows.tolist()] + [negatives[r] for r in rows.tolist()]
        scores, _ = bundle.score_dense(tokens[image_index], bundle.encode_dense_texts(texts),
                                       bundle.dense_layouts(texts))  # fmt: skip
        correct[rows] = scores[: len(rows)] > scores[len(rows) :]
    return correct


@torch.no_grad()
def encoder_wins(
    encoder: DenseEncoder,
    head: DCSMHead | None,
    positives: Sequence[str],
    negatives: Sequence[str],
    images: np.ndarray,
) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    """Per item (image ``i`` with caption ``positives[i]`` and negative ``negatives[i]``): cosine
    and, with a scorer, DCSM wins; and the image tokens."""
    pooled, img_tok = encoder.image_features(images)
    pos, neg = encoder.text_features(list(positives)), encoder.text_features(list(negatives))
    out = {"cosine": ((pooled * pos.pooled).sum(1) > (pooled * neg.pooled).sum(1)).numpy()}
    if head is not None:
        out["dcsm"] = (head.score(img_tok, pos) > head.score(img_tok, neg)).numpy()
    return out, img_tok


def accuracy_by_kind(kinds: Sequence[str], correct: np.ndarray) -> dict[str, float]:
    """Accuracy overall (``all``) and per kind of negative, kinds in sorted order."""
    kind_of = np.array(list(kinds))
    out = {"all": float(correct.mean())}
    for kind in sorted(set(kind_of)):
        out[kind] = float(correct[kind_of == kind].mean())
    return out
