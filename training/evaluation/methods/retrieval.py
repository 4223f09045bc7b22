"""Retrieval figures: recall@1 and recall@10 of text and difference queries over a gallery, ranked as a
collection search ranks (``clipcore.methods.retrieval``), with chance.

* **Text queries** (``compositional``, ``negated``): cosine alone (the whole gallery by
  ``f(text) . g(c)``) against a search's ``rerank: "dense"``: the first stage's top ``RERANK_K``
  (by ``f(text) . g(c)``, or for a negated text by ``normalize(f(shown) - f(absent)) . g(c)``:
  ``clipcore.methods.retrieval.first_stage_query``) re-ranked by DCSM on the whole text.
* **Difference queries** ("like this one, but <difference>"): the first stage's top ``RERANK_K``
  by ``g(query) . g(c)`` (the query image left out), ranked by PC-CLIP
  ``normalize(g(c) - g(query)) . f(text)`` or by the usual baseline
  ``normalize(g(query) + f(text)) . g(c)``; the same text embedding for both (the PC-CLIP
  encoder where the version has one, as the service picks it).

A query's right items are every gallery item that satisfies it (``relevant``), so recall@k is
``clipcore.methods.retrieval.recall_at_k`` (precision@k where more than k satisfy it). A data
source builds the gallery and the queries; keys are ``retrieval.<kind>.<ranking>.r<k>`` and
``retrieval.<kind>.chance.r<k>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clipcore.methods.retrieval import (
    chance_recall_at_k,
    cosine_top_k,
    difference_scores,
    first_stage_query,
    first_stage_texts,
    order_by_scores,
    recall_at_k,
    reranked,
    sum_scores,
)
from clipcore.models.bundle import ModelBundle

RERANK_K = 100  # the first-stage candidates a second stage ranks (the service's default ``k``)
RECALL_AT = (1, 10)
PCCLIP_ENCODER = "pcclip"
# (the figure that replaces another, the one it replaces) per kind of query.
SECOND_STAGE = {"text": ("dcsm", "cosine"), "difference": ("pcclip", "sum")}


@dataclass
class TextQueries:
    """Texts of one kind of query and, per text, which gallery items satisfy it."""

    kind: str  # "compositional" | "negated"
    texts: list[str]
    relevant: np.ndarray  # (Q, G) bool


@dataclass
class DifferenceQueries:
    """ "Like gallery item ``query[i]``, but ``texts[i]``": the texts are true of (first = a right
    item, second = the query image)."""

    query: np.ndarray  # (Q,) gallery index of each query image
    texts: list[str]
    relevant: np.ndarray  # (Q, G) bool; the query image itself is never a right item


def answerable(relevant: np.ndarray) -> np.ndarray:
    """Which queries have at least one right item (the others cannot be scored)."""
    return np.asarray(np.asarray(relevant, dtype=bool).any(axis=1))


def _recalls(prefix: str, rankings: Sequence[np.ndarray], relevant: np.ndarray) -> dict[str, float]:
    return {
        f"{prefix}.r{k}": float(np.mean([recall_at_k(r, rel, k) for r, rel in zip(rankings, relevant, strict=True)]))
        for k in RECALL_AT
    }


def _chance(prefix: str, relevant: np.ndarray, gallery: int) -> dict[str, float]:
    counts = np.asarray(relevant, dtype=bool).sum(axis=1)
    return {
        f"{prefix}.r{k}": float(np.mean([chance_recall_at_k(gallery, int(n), k) for n in counts])) for k in RECALL_AT
    }


@torch.no_grad()
def dense_scores(bundle: ModelBundle, tokens: np.ndarray, candidates: np.ndarray, text: str) -> np.ndarray:
    """DCSM's scores of one text on the candidates' image tokens, in one batch (the same scorer
    ``POST /score/dense`` and a ``rerank: "dense"`` search run, one map per candidate)."""
    assert bundle.dcsm is not None
    layout = bundle.dense_layouts([text])[0]
    text_tokens = torch.from_numpy(bundle.encode_dense_texts([text]))
    n = len(candidates)
    scores, _ = bundle.dcsm.score_maps(
        torch.from_numpy(np.ascontiguousarray(tokens[candidates], dtype=np.float32)),
        text_tokens.expand(n, -1, -1),
        torch.from_numpy(layout.valid)[None].expand(n, -1),
        torch.from_numpy(layout.row_index)[None].expand(n, -1),
    )
    return scores.float().numpy()


def text_retrieval(
    bundle: ModelBundle, pooled: np.ndarray, tokens: np.ndarray | None, queries: TextQueries, k: int = RERANK_K
) -> dict[str, float]:
    """Figures of one kind of text query over a gallery (``pooled``: (G, D) unit image embeddings;
    ``tokens``: (G, 1+P, D) DCSM image tokens, None without a scorer), the re-rank over the first
    stage's top ``k`` (a search's ``k``). Queries with no right item in the gallery are left out."""
    keep = answerable(queries.relevant)
    texts = [t for t, k in zip(queries.texts, keep, strict=True) if k]
    relevant = queries.relevant[keep]
    if not texts:
        return {}
    prefix = f"retrieval.{queries.kind}"
    embedded = bundle.encode_texts(texts)  # the default encoder: what a search by text embeds with
    cosine = [order_by_scores(pooled @ e) for e in embedded]
    out = _recalls(f"{prefix}.cosine", cosine, relevant)
    out.update(_chance(f"{prefix}.chance", relevant, len(pooled)))
    if tokens is not None and bundle.dcsm is not None:
        # Every query's first-stage texts in one encode (a text, or a negated one's two parts).
        groups = [first_stage_texts(text) for text in texts]
        stage = bundle.encode_texts([part for group in groups for part in group])
        bounds = np.cumsum([len(group) for group in groups])[:-1]
        dense = []
        for text, parts in zip(texts, np.split(stage, bounds), strict=True):
            query = first_stage_query(text, parts)
            candidates = cosine_top_k(pooled, query, k)
            dense.append(reranked(candidates, dense_scores(bundle, tokens, candidates, text)))
        out.update(_recalls(f"{prefix}.dcsm", dense, relevant))
    return out


def difference_retrieval(
    bundle: ModelBundle, pooled: np.ndarray, queries: DifferenceQueries, k: int = RERANK_K
) -> dict[str, float]:
    """Figures of difference queries over a gallery (``pooled``: (G, D) unit image embeddings), both
    rankings over the first stage's top ``k``."""
    keep = answerable(queries.relevant)
    if not keep.any():
        return {}
    texts = [t for t, k in zip(queries.texts, keep, strict=True) if k]
    query, relevant = queries.query[keep], queries.relevant[keep]
    encoder = PCCLIP_ENCODER if PCCLIP_ENCODER in bundle.text_models else None
    embedded = bundle.encode_texts(texts, encoder)
    others = np.ones(len(pooled), dtype=bool)
    ranked: dict[str, list[np.ndarray]] = {"pcclip": [], "sum": []}
    for q, text in zip(query, embedded, strict=True):
        others[:] = True
        others[q] = False  # the query image is not an answer to "like this one, but ..."
        rest = np.flatnonzero(others)
        candidates = rest[cosine_top_k(pooled[rest], pooled[q], k)]
        ranked["pcclip"].append(reranked(candidates, difference_scores(pooled[candidates], pooled[q], text)))
        ranked["sum"].append(reranked(candidates, sum_scores(pooled[candidates], pooled[q], text)))
    out: dict[str, float] = {}
    for name, rankings in ranked.items():
        out.update(_recalls(f"retrieval.difference.{name}", rankings, relevant))
    out.update(_chance("retrieval.difference.chance", relevant, len(pooled) - 1))
    return out


def retrieval_gains(flat: Mapping[str, float]) -> dict[str, float]:
    """What each second stage adds on the same queries of one seed: ``gain.retrieval.<kind>.dcsm.r<k>``
    (DCSM re-rank minus cosine) and ``gain.retrieval.difference.pcclip.r<k>`` (PC-CLIP minus the sum
    baseline)."""
    out = {}
    for key, value in flat.items():
        parts = key.split(".")
        if parts[0] != "retrieval" or len(parts) != 4:
            continue
        for ours, theirs in SECOND_STAGE.values():
            replaced = ".".join([*parts[:2], theirs, parts[3]])
            if parts[2] == ours and replaced in flat:
                out[f"gain.{key}"] = value - flat[replaced]
    return out
