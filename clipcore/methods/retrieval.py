"""Ranking a gallery of images for a query, and how well a ranking finds the right items (numpy only).

The stages are those of a collection search (``POST /collections/{name}/search``): a first stage
ranks the gallery by cosine with the query's embedding and keeps the top ``k``; a second stage
reorders those ``k`` candidates by its own scores (DCSM, or the PC-CLIP difference
``normalize(g(c) - g(query)) . f(text)``), ties keeping the first stage's order. The first stage
of a DCSM re-rank honours a text's negation (``first_stage_query``): it asks for what the text
shows and away from what it excludes, and DCSM then reads the whole text. The evaluation
(``clip-train evaluate``) ranks with the same functions, so its figures describe what the service
answers.

Pure: arrays in, arrays out; inputs are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.common import as_float_array, check_int, l2_normalize
from clipcore.methods.negated_query import split_negation
from clipcore.methods.pairwise_rank import pair_scores

__all__ = [
    "chance_recall_at_k",
    "cosine_top_k",
    "difference_scores",
    "first_stage_query",
    "first_stage_texts",
    "order_by_scores",
    "recall_at_k",
    "reranked",
    "sum_scores",
]


def order_by_scores(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Positions of ``scores``, highest first; equal scores keep their input order (stable)."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")


def cosine_top_k(gallery: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """The first stage: indices of the ``k`` gallery rows with the highest ``gallery . query``
    (all rows when the gallery is smaller), best first, ties in gallery order.

    Args:
        gallery: ``(N, D)`` L2-normalised image embeddings.
        query: ``(D,)`` L2-normalised query embedding (a text's or an image's).
    """
    rows = as_float_array(gallery, "gallery", ndim=2)
    q = as_float_array(query, "query", ndim=1)
    if q.shape[0] != rows.shape[1]:
        raise ValueError(f"query has dimension {q.shape[0]}, expected {rows.shape[1]}")
    check_int(k, "k", low=1)
    return order_by_scores(rows @ q)[:k]


def first_stage_texts(text: str) -> list[str]:
    """The texts whose embeddings make the first-stage query of a dense re-rank of ``text``: the text
    itself, or for a negated text (``clipcore.methods.negated_query``) its shown part and its absent
    part ("a red circle", "a blue square" of "a red circle without a blue square"), or its absent
    part alone ("a shirt" of "this is not a shirt")."""
    negated = split_negation(text)
    if negated is None:
        return [text]
    return [negated.absent] if negated.shown is None else [negated.shown, negated.absent]


def first_stage_query(text: str, embedded: np.ndarray) -> np.ndarray:
    """The first-stage query of a dense re-rank of ``text`` from the embeddings of
    ``first_stage_texts(text)`` (``(n, D)``, L2-normalised, in that order): the text's own
    embedding, or ``normalize(f(shown) - f(absent))`` (``-f(absent)`` with nothing shown) for a
    negated text, so the candidates handed to the re-rank are near what it asks to see and away
    from what it excludes; the text's own embedding lands near both."""
    negated = split_negation(text)
    e = as_float_array(embedded, "embedded", ndim=2)
    wanted = 1 if negated is None or negated.shown is None else 2
    if e.shape[0] != wanted:
        raise ValueError(f"{e.shape[0]} embeddings for the {wanted} first-stage texts of {text!r}")
    if negated is None:
        return e[0]
    return l2_normalize(-e[0] if negated.shown is None else e[0] - e[1])


def reranked(candidates: np.ndarray, scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """A second stage: ``candidates`` (gallery indices in first-stage order) reordered by their
    ``scores`` (one per candidate), highest first; ties keep the first stage's order."""
    cand = np.asarray(candidates)
    s = np.asarray(scores, dtype=np.float64)
    if cand.ndim != 1 or s.shape != cand.shape:
        raise ValueError(f"scores {s.shape} must match candidates {cand.shape}, one score each")
    return cand[order_by_scores(s)]


def difference_scores(candidates: np.ndarray, query: np.ndarray, text: np.ndarray) -> np.ndarray:
    """PC-CLIP's "like this one, but <text>": ``normalize(g(c) - g(query)) . f(text)`` per candidate.

    Args:
        candidates: ``(N, D)`` L2-normalised image embeddings ``g(c)``.
        query: ``(D,)`` L2-normalised embedding ``g(query)`` of the query image.
        text: ``(D,)`` L2-normalised embedding ``f(text)`` of a difference text true of
            (first = the wanted image, second = the query image).

    A candidate equal to the query has no difference and scores ``0.0``.
    """
    c = as_float_array(candidates, "candidates", ndim=2)
    q = as_float_array(query, "query", ndim=1)
    return pair_scores(c, np.broadcast_to(q, c.shape), as_float_array(text, "text", ndim=1))


def sum_scores(candidates: np.ndarray, query: np.ndarray, text: np.ndarray) -> np.ndarray:
    """The usual composed-query baseline: ``normalize(g(query) + f(text)) . g(c)`` per candidate."""
    c = as_float_array(candidates, "candidates", ndim=2)
    q = as_float_array(query, "query", ndim=1)
    t = as_float_array(text, "text", ndim=1)
    if not (q.shape == t.shape and q.shape[0] == c.shape[1]):
        raise ValueError(f"query {q.shape} and text {t.shape} must both be ({c.shape[1]},)")
    return c @ l2_normalize(q + t)


def recall_at_k(ranking: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """Share of the right items a ranking puts in its first ``k`` places, out of as many as fit:
    ``|relevant ∩ top k| / min(k, |relevant|)``.

    With one right item this is the usual recall@k (is it in the top k); with at least ``k``
    right items (a negated query that most of a gallery satisfies) it is precision@k, so a
    ranking that fills its top k with right items scores 1 either way.

    Args:
        ranking: gallery indices, best first (a whole ranking or only its head).
        relevant: ``(N,)`` bool, which gallery items satisfy the query; at least one must.
    """
    check_int(k, "k", low=1)
    right = np.asarray(relevant, dtype=bool)
    total = int(right.sum())
    if total == 0:
        raise ValueError("a query needs at least one right item in the gallery")
    return float(right[np.asarray(ranking)[:k]].sum()) / min(k, total)


def chance_recall_at_k(n_gallery: int, n_relevant: int, k: int) -> float:
    """``recall_at_k`` of a ranking drawn at random: the top ``k`` of ``n_gallery`` items hold
    ``k * n_relevant / n_gallery`` right items on average (hypergeometric mean), out of
    ``min(k, n_relevant)``."""
    check_int(n_gallery, "n_gallery", low=1)
    check_int(n_relevant, "n_relevant", low=1)
    check_int(k, "k", low=1)
    if n_relevant > n_gallery:
        raise ValueError(f"n_relevant {n_relevant} exceeds the gallery's {n_gallery} items")
    shown = min(k, n_gallery)
    return shown * n_relevant / n_gallery / min(k, n_relevant)
