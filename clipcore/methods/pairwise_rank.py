"""Difference-based pair ranking (numpy only).

A text ``T`` of the form "the first is X, while the second is Y" is compared with the direction
from image b to image a: ``s = normalize(g(Ia) - g(Ib)) . f(T)``. ``s > 0`` means image a is the
"first" of ``T`` (it has X). Since normalising divides by a positive number, ``sign(s)`` equals
``sign(g_a . f - g_b . f)``, so a whole list is ordered by the single scores ``g_i . f``: N image
encodes instead of N^2 pair evaluations, and the order agrees with every pairwise decision.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from clipcore.methods.common import as_float_array, check_finite_scalar

__all__ = ["pair_decision", "pair_scores", "rank_images"]


def pair_scores(g_a: np.ndarray, g_b: np.ndarray, f_t: np.ndarray) -> np.ndarray:
    """Difference scores ``s_i = normalize(g_a[i] - g_b[i]) . f_t[i]``, shape ``(N,)``.

    Args:
        g_a: ``(N, D)`` L2-normalised embeddings of the "a" images.
        g_b: ``(N, D)`` L2-normalised embeddings of the "b" images.
        f_t: ``(N, D)`` text embeddings, one per pair, or one ``(D,)`` text for all pairs;
            expected L2-normalised (then ``s`` is a cosine in ``[-1, 1]``). Only its direction
            matters for the sign.

    Where ``g_a[i] == g_b[i]`` exactly the difference has no direction and the score is
    ``0.0`` (never NaN). Each difference is first divided by its largest absolute entry, which
    leaves its direction unchanged but keeps the norm from underflowing for tiny differences.

    Raises:
        ValueError: on mismatched shapes.
    """
    a = as_float_array(g_a, "g_a", ndim=2)
    b = as_float_array(g_b, "g_b", ndim=2)
    t = as_float_array(f_t, "f_t")
    if a.shape != b.shape:
        raise ValueError(f"g_a {a.shape} and g_b {b.shape} must have the same shape")
    if t.ndim == 1:
        t = t[None, :]
    n, dim = a.shape
    if dim == 0:
        raise ValueError("embeddings must have at least one dimension")
    if t.ndim != 2 or t.shape[1] != dim or t.shape[0] not in (1, n):
        raise ValueError(f"f_t must be ({dim},) or ({n}, {dim}), got {t.shape}")
    diff = a - b
    scale = np.max(np.abs(diff), axis=1, keepdims=True)
    nonzero = scale[:, 0] > 0
    unit = np.divide(diff, scale, out=np.zeros_like(diff), where=scale > 0)
    norm = np.linalg.norm(unit, axis=1)
    dots = np.sum(unit * t, axis=1)
    return np.divide(dots, norm, out=np.zeros_like(dots), where=nonzero)


def pair_decision(score: float) -> Literal["a", "b"]:
    """Which image of a pair is the "first" of the text: ``"a"`` if ``score >= 0`` else ``"b"``.

    An exact tie (``score == 0``, e.g. identical images) carries no information; it is resolved
    to ``"a"``, the image of the pair listed first. This matches :func:`rank_images` when ``a``
    precedes ``b`` in its input, since its stable sort keeps input order for equal scores.

    Raises:
        ValueError: if ``score`` is NaN or infinite.
    """
    return "a" if check_finite_scalar(score, "score") >= 0.0 else "b"


def rank_images(g: np.ndarray, f_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order images by how much they show the "first" side of the text.

    Scores are ``s_i = g_i . f_t`` and the order is descending (stable, so equal scores keep
    input order). For any two images ``sign(normalize(g_a - g_b) . f) = sign(g_a . f - g_b . f)``
    because normalisation divides by the positive norm ``||g_a - g_b||``; hence image a precedes
    image b here exactly when the pairwise decision on ``(a, b)`` is ``"a"``.

    Args:
        g: ``(N, D)`` L2-normalised image embeddings.
        f_t: ``(D,)`` text embedding.

    Returns:
        ``(order, scores)``: indices into ``g`` (best first) and the ``(N,)`` scores in input
        order.

    Raises:
        ValueError: on mismatched shapes.
    """
    imgs = as_float_array(g, "g", ndim=2)
    text = as_float_array(f_t, "f_t", ndim=1)
    if text.shape[0] != imgs.shape[1]:
        raise ValueError(f"f_t has dimension {text.shape[0]}, expected {imgs.shape[1]}")
    scores = imgs @ text
    order = np.argsort(-scores, kind="stable")
    return order, scores
