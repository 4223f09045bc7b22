"""SemCLIP: the projection subspace and the evaluation figures (numpy).

Training (``clipcore.methods.losses.semclip_loss``) projects L2-normalised text embeddings onto
``n`` fixed random orthonormal directions; paraphrases are pulled together and negations pushed
apart there, while the contrastive image-text loss keeps the full space aligned with images.
"""

from __future__ import annotations

import numpy as np


def projection_directions(dim: int, n: int = 2, seed: int = 0) -> np.ndarray:
    """``(n, dim)`` orthonormal rows, fixed by ``seed`` (QR of a Gaussian matrix)."""
    if not 1 <= n <= dim:
        raise ValueError(f"n must be in [1, {dim}], got {n}")
    gaussian = np.random.default_rng([seed, 4242]).standard_normal((dim, n))
    q, _ = np.linalg.qr(gaussian)
    return np.ascontiguousarray(q.T, dtype=np.float32)


def original_over_negation(images: np.ndarray, originals: np.ndarray, negations: np.ndarray) -> np.ndarray:
    """Per item: does the image match its original caption better than the negated one?"""
    return np.sum(images * originals, axis=1) > np.sum(images * negations, axis=1)


def retrieval_top1(texts: np.ndarray, images: np.ndarray) -> np.ndarray:
    """Per text ``i``: is image ``i`` the most similar of all images (text-to-image top-1)?"""
    return np.argmax(texts @ images.T, axis=1) == np.arange(len(texts))


def composite_score(acc_original: float, acc_paraphrase: float, acc_negation: float) -> float:
    """``(acc_o + acc_p + max(0, 2 (acc_n - 0.5))) / 3``: negation counts only above chance."""
    return (acc_original + acc_paraphrase + max(0.0, 2.0 * (acc_negation - 0.5))) / 3.0


__all__ = ["composite_score", "original_over_negation", "projection_directions", "retrieval_top1"]
