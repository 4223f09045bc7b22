"""Comparative prompting with margin gating (numpy only).

A comparative ``(a, b, d)`` says how class ``a`` differs from class ``b`` ("a ..., while b ...");
its text embedding ``d`` approximates ``f_a - f_b``, so ``f_a - d`` is a second estimate of
``f_b`` (and ``f_b + d`` one of ``f_a``). Blending these estimates into the class embeddings
separates classes the plain prompts confuse. Because the gain concentrates on images the standard
classifier is unsure about, the corrected prompts can be applied only where the top-1 minus
top-2 probability margin is small.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.common import as_float_array, check_finite_scalar, check_int, l2_normalize

__all__ = ["affected_classes", "apply_comparatives", "confused_pairs", "gated_probs", "margin"]

Comparative = tuple[int, int, np.ndarray]


def _check_index(value: int, num_classes: int, what: str) -> int:
    value = check_int(value, f"comparative {what} index")
    if not 0 <= value < num_classes:
        raise ValueError(f"comparative {what} index {value} is out of range [0, {num_classes})")
    return value


def _check_pair(comparative: Comparative, num_classes: int) -> tuple[int, int]:
    if len(comparative) != 3:
        raise ValueError("each comparative must be a triple (a, b, d)")
    a = _check_index(comparative[0], num_classes, "a")
    b = _check_index(comparative[1], num_classes, "b")
    if a == b:
        raise ValueError(f"comparative compares class {a} with itself")
    return a, b


def affected_classes(num_classes: int, comparatives: Sequence[Comparative], symmetric: bool) -> set[int]:
    """Classes whose embedding :func:`apply_comparatives` changes: every ``b``, plus ``a`` if
    ``symmetric``.

    Raises:
        ValueError: on a non-positive ``num_classes`` or an invalid comparative index.
    """
    num_classes = check_int(num_classes, "num_classes", low=1)
    out: set[int] = set()
    for comparative in comparatives:
        a, b = _check_pair(comparative, num_classes)
        out.add(b)
        if symmetric:
            out.add(a)
    return out


def apply_comparatives(
    class_emb: np.ndarray,
    comparatives: Sequence[Comparative],
    alpha: float = 0.9,
    symmetric: bool = False,
) -> np.ndarray:
    """Blend comparative estimates into the class embeddings.

    For each target ``b``: ``f_b <- normalize(alpha * f_b + (1 - alpha) * mean(f_a - d))`` over
    the comparatives ``(a, b, d)`` that target ``b``. With ``symmetric`` each comparative also
    targets ``a`` with the estimate ``f_b + d``. All estimates are computed from the original
    embeddings (the result does not depend on the order of the comparatives) and a class that
    is targeted several times averages all its estimates in one mean.

    Args:
        class_emb: ``(C, D)`` L2-normalised class embeddings.
        comparatives: ``(a, b, d)`` triples; ``d`` is the ``(D,)`` text embedding of the
            comparative, expected to be L2-normalised by the caller (like every ``f(T)``).
        alpha: weight of the original embedding, in ``[0, 1]`` (0.9 in the paper).
        symmetric: also update ``a`` from ``f_b + d``.

    Returns:
        A new ``(C, D)`` array; rows of classes without comparatives are bit-identical copies.

    Raises:
        ValueError: on bad shapes, indices out of range, ``a == b`` or ``alpha`` outside [0, 1].
    """
    alpha = check_finite_scalar(alpha, "alpha", low=0.0, high=1.0)
    emb = as_float_array(class_emb, "class_emb", ndim=2)
    num_classes, dim = emb.shape
    estimates: dict[int, list[np.ndarray]] = {}
    for i, comparative in enumerate(comparatives):
        a, b = _check_pair(comparative, num_classes)
        d = as_float_array(comparative[2], f"comparatives[{i}] d", ndim=1)
        if d.shape[0] != dim:
            raise ValueError(f"comparatives[{i}] d has dimension {d.shape[0]}, expected {dim}")
        estimates.setdefault(b, []).append(emb[a] - d)
        if symmetric:
            estimates.setdefault(a, []).append(emb[b] + d)
    out = emb.copy()
    for target, vectors in estimates.items():
        mixed = alpha * emb[target] + (1.0 - alpha) * np.mean(np.stack(vectors), axis=0)
        out[target] = l2_normalize(mixed)
    return out


def margin(probs: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 probability per row, shape ``(N,)``.

    A small margin marks an image the classifier is unsure about, which is where comparative
    prompts help most.

    Raises:
        ValueError: if ``probs`` is not ``(N, C)`` with ``C >= 2``.
    """
    p = as_float_array(probs, "probs", ndim=2)
    if p.shape[1] < 2:
        raise ValueError("margin needs at least 2 classes")
    top2 = np.partition(p, p.shape[1] - 2, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def gated_probs(
    probs_standard: np.ndarray,
    probs_comparative: np.ndarray,
    gate_margin: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Use comparative probabilities only for uncertain images.

    With ``gate_margin=None`` every row takes the comparative probabilities; otherwise row ``i``
    takes them only when ``margin(probs_standard)[i] < gate_margin`` and keeps the standard ones
    elsewhere (so ``gate_margin=0`` never applies them).

    Returns:
        ``(probs, applied)``: the ``(N, C)`` probabilities and the ``(N,)`` boolean mask of rows
        that took the comparative probabilities.

    Raises:
        ValueError: on mismatched shapes or a negative / non-finite ``gate_margin``.
    """
    std = as_float_array(probs_standard, "probs_standard", ndim=2)
    comp = as_float_array(probs_comparative, "probs_comparative", ndim=2)
    if std.shape != comp.shape:
        raise ValueError(f"probs_standard {std.shape} and probs_comparative {comp.shape} must have the same shape")
    if gate_margin is None:
        return comp.copy(), np.ones(comp.shape[0], dtype=bool)
    gate = check_finite_scalar(gate_margin, "gate_margin", low=0.0)
    applied = margin(std) < gate
    return np.where(applied[:, None], comp, std), applied


def confused_pairs(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int, k: int) -> list[tuple[int, int, int]]:
    """The ``k`` most confused unordered class pairs of a labelled calibration set.

    With confusion matrix ``M[t, p]`` (true ``t`` predicted as ``p``), a pair ``a < b`` counts
    ``M[a, b] + M[b, a]``. Pairs are sorted by that count (descending), ties by ``(a, b)``;
    pairs never confused are left out, so fewer than ``k`` may be returned.

    Returns:
        ``[(a, b, count), ...]`` with ``a < b``.

    Raises:
        ValueError: on mismatched or non-integer labels, labels out of range, or bad
            ``num_classes`` / ``k``.
    """
    num_classes = check_int(num_classes, "num_classes", low=1)
    k = check_int(k, "k", low=0)
    t, p = np.asarray(y_true), np.asarray(y_pred)
    for name, arr in (("y_true", t), ("y_pred", p)):
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"{name} must be a 1-D array of integer class indices")
        if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
            raise ValueError(f"{name} holds a class index outside [0, {num_classes})")
    if t.shape != p.shape:
        raise ValueError(f"y_true {t.shape} and y_pred {p.shape} must have the same length")
    n = num_classes
    counts = np.bincount(t.astype(np.int64) * n + p.astype(np.int64), minlength=n * n)
    confusion = counts.reshape(n, n)
    both = confusion + confusion.T
    rows, cols = np.triu_indices(n, k=1)
    pairs = [(int(a), int(b), int(both[a, b])) for a, b in zip(rows, cols) if both[a, b] > 0]
    pairs.sort(key=lambda item: (-item[2], item[0], item[1]))
    return pairs[:k]
