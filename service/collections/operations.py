"""What the collection endpoints compute: embeddings from the pipeline, math from ``clipcore.methods``.

A search has a first stage, an exact kNN in the store (by the text's or the image's embedding,
within the metadata filters), and at most one second stage over the first stage's ``k``
candidates: the PC-CLIP difference ``normalize(g(c) - g(query)) . f(difference)``
(``clipcore.methods.retrieval``) or DCSM (``ModelBundle.score_dense``, the scorer /score/dense uses) on the
DCSM image features stored with each item.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.errors import ClipError, ErrorCode, bad_input
from clipcore.methods.common import l2_normalize
from clipcore.methods.retrieval import difference_scores, order_by_scores
from service.api.dense_operations import require_dcsm
from service.api.operations import both
from service.collections.schemas import (
    AddImagesRequest,
    AddImagesResponse,
    HitScores,
    SearchHit,
    SearchRequest,
    SearchResponse,
    Stage,
)
from service.collections.service import Collections, model_ref
from service.collections.store import CollectionInfo, NewItem, StoredHit
from service.runtime.assembly import ModelRuntime
from service.runtime.pipeline import Pipeline

PCCLIP_ENCODER = "pcclip"


def stores_dense(runtime: ModelRuntime) -> bool:
    """Whether a collection on this version keeps DCSM image features (for ``rerank: "dense"``)."""
    bundle = runtime.bundle
    return (
        bundle.dcsm is not None
        and runtime.dense_image_batcher is not None
        and bundle.per_token_unsupported("dense scoring (DCSM)") is None
    )


async def add_images(
    pipeline: Pipeline, rt: ModelRuntime, collections: Collections, info: CollectionInfo, req: AddImagesRequest
) -> AddImagesResponse:
    images = [item.image for item in req.items]
    fields = [f"items.{i}.image" for i in range(len(req.items))]
    dense: Sequence[np.ndarray | None]
    if info.dense:
        features = await pipeline.dense_images(rt, images, fields, pooled=True)
        assert features.pooled is not None
        vectors, dense = features.pooled, list(features.tokens)
    else:
        vectors, dense = (await pipeline.embed_images(rt, images, fields)).vectors, [None] * len(images)
    vectors = l2_normalize(vectors)  # cached embeddings are float16-rounded: stored as unit vectors
    items = [
        NewItem(item.id, item.metadata, vector, tokens)
        for item, vector, tokens in zip(req.items, vectors, dense, strict=True)
    ]
    count = await collections.call(collections.store.upsert, info.name, items)
    return AddImagesResponse(model=model_ref(info), collection=info.name, added=[i.id for i in req.items], count=count)


async def search(
    pipeline: Pipeline, rt: ModelRuntime, collections: Collections, info: CollectionInfo, req: SearchRequest
) -> SearchResponse:
    wanted = req.offset + req.limit
    assert req.k is not None  # the route sets the default
    if req.rerank == "dense":
        if req.text is None:
            raise bad_input("rerank 'dense' scores a text against the candidates: search by 'text'", "rerank")
        require_dcsm(rt)
        if not info.dense:
            raise ClipError(ErrorCode.unknown_component, f"collection {info.name!r} keeps no DCSM features", "rerank")
    # A second stage ranks the first stage's k candidates only: pages past them are empty.
    second_stage = req.rerank is not None or req.difference is not None
    store = collections.store
    if req.text is not None:
        text = await pipeline.embed_texts(rt, [req.text], req.encoder)
        query = l2_normalize(text.vectors[0])
        hits = await collections.call(store.search, info.name, query, req.k if second_stage else wanted, req.filters)
        if req.rerank == "dense" and hits:
            return await _dense_reranked(pipeline, rt, collections, info, req, hits)
        return _answer(info, hits, [h.cosine for h in hits], "cosine", req)
    assert req.image is not None
    if req.difference is None:
        image = await pipeline.embed_images(rt, [req.image], ["image"])
        query = l2_normalize(image.vectors[0])
        hits = await collections.call(store.search, info.name, query, wanted, req.filters)
        return _answer(info, hits, [h.cosine for h in hits], "cosine", req)
    encoder = req.encoder or (PCCLIP_ENCODER if PCCLIP_ENCODER in rt.text_batchers else None)
    text, image = await both(
        pipeline.embed_texts(rt, [req.difference], encoder), pipeline.embed_images(rt, [req.image], ["image"])
    )
    query = l2_normalize(image.vectors[0])
    hits = await collections.call(store.search, info.name, query, req.k, req.filters)
    if not hits:
        return _answer(info, hits, [], "difference", req)
    candidates = np.stack([h.vector for h in hits])
    scores = difference_scores(candidates, query, l2_normalize(text.vectors[0]))
    return _answer(info, hits, [float(s) for s in scores], "difference", req)


async def _dense_reranked(
    pipeline: Pipeline,
    rt: ModelRuntime,
    collections: Collections,
    info: CollectionInfo,
    req: SearchRequest,
    hits: list[StoredHit],
) -> SearchResponse:
    assert req.text is not None
    texts = await pipeline.dense_texts(rt, [req.text])
    tokens = await collections.call(collections.store.dense_tokens, info.name, [h.id for h in hits])
    bundle = rt.bundle
    # Each candidate is scored on its own, as /score/dense scores one image: the same score there.
    scores = await rt.run(lambda: [float(bundle.score_dense(t, texts.tokens, texts.layouts)[0][0]) for t in tokens])
    return _answer(info, hits, scores, "dense", req)


def _answer(
    info: CollectionInfo, hits: list[StoredHit], scores: Sequence[float], stage: Stage, req: SearchRequest
) -> SearchResponse:
    """Hits ordered by ``scores`` (descending; ties keep the first stage's order), paged."""
    order = order_by_scores(scores).tolist()
    page = order[req.offset : req.offset + req.limit]
    out = []
    for i in page:
        hit = hits[i]
        extra = {stage: scores[i]} if stage != "cosine" else {}
        out.append(
            SearchHit(id=hit.id, metadata=hit.metadata, stage=stage, scores=HitScores(cosine=hit.cosine, **extra))
        )
    return SearchResponse(model=model_ref(info), collection=info.name, candidates=len(hits), hits=out)
