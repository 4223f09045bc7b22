"""What each endpoint computes: embeddings from the pipeline, math from ``clipcore.methods``.

No formula lives here; these functions only gather inputs (prompts, comparatives, image and text
embeddings) in the shapes the pure method functions take and turn their outputs into responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np

from clipcore.methods.common import l2_normalize, softmax
from clipcore.methods.comparative import apply_comparatives, gated_probs
from clipcore.methods.pairwise_rank import pair_decision, pair_scores, rank_images
from clipcore.methods.yukino import yes_no_scores
from clipcore.tasks import flat_prompts, label_embeddings, label_prompts, label_scores, top_labels
from service.api.errors import ApiError, ErrorCode, bad_input
from service.api.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    ClassifyResult,
    ComparativeInfo,
    EmbedRequest,
    EmbedResponse,
    LabelScore,
    MeasuredEffect,
    PairResult,
    RankedImage,
    RankPairRequest,
    RankPairResponse,
    RankRequest,
    RankResponse,
)
from service.api.vector_encoding import encode_rows
from service.runtime.assembly import ModelRuntime
from service.runtime.cache import text_digest
from service.runtime.pipeline import ImageEmbeddings, Pipeline, TextEmbeddings

A = TypeVar("A")
B = TypeVar("B")


async def both(first: Coroutine[Any, Any, A], second: Coroutine[Any, Any, B]) -> tuple[A, B]:
    """Run two coroutines concurrently (decode images while texts encode); on failure cancel the
    other and raise the first error as itself, not as an ExceptionGroup."""
    try:
        async with asyncio.TaskGroup() as group:
            a = group.create_task(first)
            b = group.create_task(second)
    except BaseExceptionGroup as group_error:
        errors = list(group_error.exceptions)
        raise next((e for e in errors if isinstance(e, ApiError)), errors[0]) from None
    return a.result(), b.result()


def select_comparatives(
    req: ClassifyRequest, library: list[dict[str, Any]], enabled: bool
) -> tuple[list[tuple[str, str, str]], str]:
    """Comparatives to apply and where they came from ("request", "library" or "none")."""
    if not enabled:
        if req.comparatives is not None:
            raise bad_input("comparatives are only used with ?comparative=true", "comparatives")
        return [], "none"
    if req.comparatives is not None:
        return [(c.a, c.b, c.text) for c in req.comparatives], "request"
    labels = set(req.labels)
    found = [
        (str(c["a"]), str(c["b"]), str(c["text"]))
        for c in library
        if c.get("a") in labels and c.get("b") in labels and c.get("a") != c.get("b") and c.get("text")
    ]
    return found, ("library" if found else "none")


def measured_effects(rt: ModelRuntime, labels: list[str]) -> list[MeasuredEffect] | None:
    """The library's effect as the version's eval.json recorded it (None without one); the dataset
    whose labels are the request's comes first."""
    found = [
        MeasuredEffect(
            dataset=m.dataset,
            classes=len(m.labels),
            same_labels=set(m.labels) == set(labels),
            confused_classes=list(m.confused_classes),
            seeds=m.seeds,
            images_per_seed=m.images_per_seed,
            accuracy_standard=m.accuracy_standard,
            accuracy_comparative=m.accuracy_comparative,
            change=m.change,
            change_stderr=m.change_stderr,
            confused_standard=m.confused_standard,
            confused_comparative=m.confused_comparative,
        )  # fmt: skip
        for m in rt.measured_comparatives
    ]
    return sorted(found, key=lambda e: not e.same_labels) or None


def _prompts(req: ClassifyRequest) -> list[list[str]]:
    return label_prompts(req.labels, req.templates, req.descriptions)


def _results(probs: np.ndarray, scores: np.ndarray, labels: list[str], k: int) -> list[ClassifyResult]:
    return [
        ClassifyResult(label=best[0][0], top_k=[LabelScore(label=lb, probability=p, cosine=c) for lb, p, c in best])
        for best in top_labels(probs, scores, labels, k)
    ]


async def classify_yukino(
    pipeline: Pipeline, rt: ModelRuntime, req: ClassifyRequest, comparative: bool
) -> ClassifyResponse:
    if reason := rt.bundle.per_token_unsupported("method 'yukino'"):
        raise ApiError(ErrorCode.unsupported_for_family, reason, "method")
    head = rt.bundle.yukino
    if head is None or rt.yukino_batcher is None:
        raise ApiError(
            ErrorCode.unknown_component,
            f"{rt.ref} has no YUKINO component (component 'yukino'); "
            "method 'yukino' needs a model version published with one",
            "method",
        )
    if comparative or req.comparatives is not None:
        raise bad_input("comparative prompting applies to method 'standard' only", "method")
    if req.encoder not in (None, head.text_encoder):
        raise bad_input(f"method 'yukino' matches with its own text encoder {head.text_encoder!r}", "encoder")
    prompts = _prompts(req)
    fields = [f"images.{i}" for i in range(len(req.images))]
    text_emb, image_prompts = await both(
        pipeline.embed_texts(rt, flat_prompts(prompts), head.text_encoder),
        pipeline.yukino_prompts(rt, req.images, fields),
    )
    f_c, _ = label_embeddings(prompts, text_emb.vectors)
    p = image_prompts.vectors
    scores = yes_no_scores(p[:, 0], p[:, 1], f_c)
    probs = softmax(float(head.config.get("scale", rt.logit_scale)) * scores, axis=-1)
    info = ComparativeInfo(applied=False, pairs=[], alpha=req.alpha, source="none")
    return ClassifyResponse(
        model=rt.ref,
        method="yukino",
        comparative=info,
        results=_results(probs, scores, req.labels, req.top_k),
        truncated_texts=_count(text_emb),
    )


async def classify(pipeline: Pipeline, rt: ModelRuntime, req: ClassifyRequest, comparative: bool) -> ClassifyResponse:
    if req.method == "yukino":
        return await classify_yukino(pipeline, rt, req, comparative)
    prompts = _prompts(req)
    comps, source = select_comparatives(req, rt.bundle.comparatives, comparative)
    texts = flat_prompts(prompts) + [text for _, _, text in comps]
    fields = [f"images.{i}" for i in range(len(req.images))]
    text_emb, image_emb = await both(
        pipeline.embed_texts(rt, texts, req.encoder), pipeline.embed_images(rt, req.images, fields)
    )
    g = image_emb.vectors
    f_c, offset = label_embeddings(prompts, text_emb.vectors)
    scale = rt.logit_scale
    probs, cosine = label_scores(g, f_c, scale)
    gated: list[bool] | None = None
    if comps:
        index = {label: i for i, label in enumerate(req.labels)}
        d = l2_normalize(text_emb.vectors[offset:])  # cached values are float16-rounded
        triples = [(index[a], index[b], d[k]) for k, (a, b, _) in enumerate(comps)]
        f_cmp = apply_comparatives(f_c, triples, alpha=req.alpha, symmetric=req.symmetric)
        probs_cmp, cosine_cmp = label_scores(g, f_cmp, scale)
        probs, applied = gated_probs(probs, probs_cmp, req.gate_margin)
        cosine = np.where(applied[:, None], cosine_cmp, cosine)
        if req.gate_margin is not None:
            gated = [bool(x) for x in applied]
    results = _results(probs, cosine, req.labels, req.top_k)
    info = ComparativeInfo(
        applied=bool(comps),
        pairs=list(dict.fromkeys((a, b) for a, b, _ in comps)),  # one entry per pair, however many texts
        alpha=req.alpha,
        source=source,  # type: ignore[arg-type]
        images_gated=gated,
        measured=measured_effects(rt, req.labels) if source == "library" else None,
    )
    return ClassifyResponse(model=rt.ref, comparative=info, results=results, truncated_texts=_count(text_emb))


async def rank_pair(pipeline: Pipeline, rt: ModelRuntime, req: RankPairRequest) -> RankPairResponse:
    if req.pairs is None:
        assert req.image_a is not None and req.image_b is not None and req.difference is not None
        images, fields, texts = [req.image_a, req.image_b], ["image_a", "image_b"], [req.difference]
    else:
        images = [img for p in req.pairs for img in (p.image_a, p.image_b)]
        fields = [f"pairs.{i}.{side}" for i in range(len(req.pairs)) for side in ("image_a", "image_b")]
        texts = [p.difference for p in req.pairs]
    text_emb, image_emb = await both(
        pipeline.embed_texts(rt, texts, req.encoder), pipeline.embed_images(rt, images, fields)
    )
    g = image_emb.vectors
    scores = pair_scores(g[0::2], g[1::2], l2_normalize(text_emb.vectors))
    results = [PairResult(first=pair_decision(float(s)), score=float(s)) for s in scores]
    truncated = _count(text_emb)
    if req.pairs is None:
        return RankPairResponse(model=rt.ref, first=results[0].first, score=results[0].score, truncated_texts=truncated)
    return RankPairResponse(model=rt.ref, results=results, truncated_texts=truncated)


async def rank(pipeline: Pipeline, rt: ModelRuntime, req: RankRequest) -> RankResponse:
    fields = [f"images.{i}" for i in range(len(req.images))]
    text_emb, image_emb = await both(
        pipeline.embed_texts(rt, [req.difference], req.encoder), pipeline.embed_images(rt, req.images, fields)
    )
    order, scores = rank_images(image_emb.vectors, l2_normalize(text_emb.vectors[0]))
    return RankResponse(
        model=rt.ref,
        ranking=[RankedImage(index=int(i), score=float(scores[i])) for i in order],
        scores=[float(s) for s in scores],
        truncated_texts=_count(text_emb),
    )


async def embed(pipeline: Pipeline, rt: ModelRuntime, req: EmbedRequest) -> EmbedResponse:
    if req.texts is not None:
        text_emb = await pipeline.embed_texts(rt, req.texts, req.encoder)
        return EmbedResponse(
            model=rt.ref,
            dim=int(text_emb.vectors.shape[1]),
            encoding_format=req.encoding_format,
            embeddings=encode_rows(text_emb.vectors, req.encoding_format),
            ids=[text_digest(t) for t in req.texts],
            truncated=text_emb.truncated,
        )
    assert req.images is not None
    image_emb: ImageEmbeddings = await pipeline.embed_images(
        rt, req.images, [f"images.{i}" for i in range(len(req.images))]
    )
    return EmbedResponse(
        model=rt.ref,
        dim=int(image_emb.vectors.shape[1]),
        encoding_format=req.encoding_format,
        embeddings=encode_rows(image_emb.vectors, req.encoding_format),
        ids=image_emb.ids,
    )


def _count(text_emb: TextEmbeddings) -> int | None:
    n = sum(text_emb.truncated)
    return n or None
