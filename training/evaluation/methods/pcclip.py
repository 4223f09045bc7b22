"""PC-CLIP's figures: pair ranking (which of two images is "the first" of a difference text) and
the difference geometry of a text encoder.

Pair ranking: a data source gives the pooled embeddings of each pair's true first and second
image and the text true of (first, second) read by one text encoder. Each pair is presented in a
random order (half the pairs swapped, so a model that ignores the text scores 0.5) and scored as
``POST /rank-pair`` scores it (``clipcore.methods.pairwise_rank.pair_scores``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.pairwise_rank import pair_scores


def swapped(rng: np.random.Generator, n: int) -> np.ndarray:
    """Which of ``n`` pairs to present swapped (the true first image as "b"), each with
    probability one half."""
    return rng.random(n) < 0.5


def presented(firsts: np.ndarray, seconds: np.ndarray, swap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) images of every pair: (first, second), or (second, first) where ``swap``."""
    return np.where(swap[:, None], seconds, firsts), np.where(swap[:, None], firsts, seconds)


def ranked_right(a: np.ndarray, b: np.ndarray, texts: np.ndarray, swap: np.ndarray) -> np.ndarray:
    """Per pair, whether the model names the true first image (a where not ``swap``, else b)."""
    return (pair_scores(a, b, texts) > 0) != swap


def difference_geometry(
    classes: np.ndarray, pairs: Sequence[tuple[int, int, np.ndarray, np.ndarray]]
) -> dict[str, float]:
    """Does text space obey difference geometry (in the spirit of the paper's Table 7)?

    ``classes`` holds one class prompt's embedding per label (``f("a photo of a c shape.")``);
    ``pairs`` holds ``(i, j, f(T_ij), f(T_ji))`` for ordered label pairs, ``T_ij`` a text that
    names label i first and j second. ``difference_alignment``: mean cos(f(T_ij),
    normalize(f_i - f_j)); ``reversal_cosine``: mean cos(f(T_ij), f(T_ji)) (negative when order is
    encoded); ``prompt_distance``: mean cosine distance between the class prompts.
    """
    align, rev = [], []
    for i, j, t_ij, t_ji in pairs:
        diff = classes[i] - classes[j]
        align.append(float(t_ij @ diff / (np.linalg.norm(diff) + 1e-12)))
        rev.append(float(t_ij @ t_ji))
    sims = classes @ classes.T
    off = sims[~np.eye(len(classes), dtype=bool)]
    return {
        "difference_alignment": float(np.mean(align)),
        "reversal_cosine": float(np.mean(rev)),
        "prompt_distance": float(np.mean(1 - off)),
    }
