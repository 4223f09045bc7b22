"""YUKINO's figures: Winoground-style 2x2 items (two images, each with the caption true of it) and
SugarCREPE-style swap tests (one image: its caption against the other's).

A data source gives, for each item, the two images' pooled embeddings or YUKINO yes/no prompt
embeddings and the two captions read by a text encoder; the scores of the four (image, caption)
combinations are plain cosine or YUKINO's paired yes/no score (``clipcore.methods.yukino``, what
the service computes), read as text / image / group scores by ``winoground``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.yukino import paired_yes_no_scores, winoground

Scores = list[np.ndarray]  # s00, s01, s10, s11: image i with caption j


def cosine_2x2(g0: np.ndarray, g1: np.ndarray, c0: np.ndarray, c1: np.ndarray) -> Scores:
    """Cosine of each image's pooled embedding with each caption."""
    return [np.sum(g * c, axis=1) for g, c in ((g0, c0), (g0, c1), (g1, c0), (g1, c1))]


def yes_no_2x2(p0: np.ndarray, p1: np.ndarray, c0: np.ndarray, c1: np.ndarray) -> Scores:
    """YUKINO's paired yes/no score of each image's prompts ``(N, 2, D)`` (yes, no) with each caption."""

    def yn(p: np.ndarray, c: np.ndarray) -> np.ndarray:
        return paired_yes_no_scores(p[:, 0], p[:, 1], c)

    return [yn(p0, c0), yn(p0, c1), yn(p1, c0), yn(p1, c1)]


def winoground_means(scores: Scores) -> dict[str, float]:
    """Text, image and group scores over all items."""
    return {name: float(hits.mean()) for name, hits in winoground(*scores).items()}


def winoground_by_kind(scores: dict[str, Scores], kinds: np.ndarray, kind_order: Sequence[str]) -> dict[str, float]:
    """Per scoring method: text / image / group scores overall (``<method>.winoground.<score>``)
    and per kind of item (``<method>.winoground.<kind>.<score>``), and the swap test per kind
    (``<method>.swap.<kind>``: each image's own caption above the other's)."""
    flat: dict[str, float] = {}
    for method, (s00, s01, s10, s11) in scores.items():
        for name, hits in winoground(s00, s01, s10, s11).items():
            flat[f"{method}.winoground.{name}"] = float(hits.mean())
            for kind in kind_order:
                flat[f"{method}.winoground.{kind}.{name}"] = float(hits[kinds == kind].mean())
        swap = np.concatenate([s00 > s01, s11 > s10])
        for kind in kind_order:
            flat[f"{method}.swap.{kind}"] = float(swap[np.concatenate([kinds, kinds]) == kind].mean())
    return flat
