"""What the collection endpoints compute: embeddings from the pipeline, math from ``clipcore.methods``.

A search has a first stage, a kNN in the store (exact, or through the collection's HNSW index; by
the text's or the image's embedding, within the metadata filters; for a DCSM re-rank of a negated text, by
``clipcore.methods.retrieval.first_stage_query``), and at most one second stage over the first stage's ``k``
candidates: the PC-CLIP difference ``normalize(g(c) - g(query)) . f(difference)``
(``clipcore.methods.retrieval``) or DCSM (``ModelBundle.score_dense``, the scorer /score/dense uses) on the
DCSM image features stored with each item.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

import numpy as np

from clipcore.errors import ClipError, ErrorCode, bad_input
from clipcore.methods.common import l2_normalize
from clipcore.methods.retrieval import difference_scores, first_stage_query, first_stage_texts, order_by_scores
from service.api.dense_operations import require_dcsm
from service.api.operations import both
from service.api.schemas import ImageInput
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
from service.collections.store import CollectionInfo, NewItem, Scalar, StoredHit
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
    fields = [f"items.{i}.image" for i in range(len(req.items))]
    raw = await image_bytes(pipeline, [item.image for item in req.items], fields)
    count = await add_read_images(
        pipeline, rt, collections, info, [(item.id, item.metadata) for item in req.items], raw, fields, staged=False
    )
    return AddImagesResponse(model=model_ref(info), collection=info.name, added=[i.id for i in req.items], count=count)


async def image_bytes(pipeline: Pipeline, images: Sequence[ImageInput], fields: Sequence[str]) -> list[bytes]:
    """The bytes of each image (``data`` decoded, a ``url`` fetched, under the usual caps): a
    collection keeps them, so a ``sha256`` reference, whose bytes the server never had, is refused."""
    for image, field in zip(images, fields, strict=True):
        if image.sha256 is not None:
            raise bad_input(
                "a collection keeps the bytes of its images (to embed them again for a new model version): send "
                "the image as 'data' or 'url', not as a 'sha256' reference",
                f"{field}.sha256",
            )
    read = await pipeline.images.read(images, fields)
    return [read.raw[digest][0] for digest in read.ids]


async def add_read_images(
    pipeline: Pipeline,
    rt: ModelRuntime,
    collections: Collections,
    info: CollectionInfo,
    items: Sequence[tuple[str, Mapping[str, Scalar]]],
    raw: Sequence[bytes],
    fields: Sequence[str],
    *,
    staged: bool,
) -> int:
    """Embeds images already read (``raw``, one per item) with ``rt``, keeps their bytes, and
    stores the items (in the staged copy of a re-embedding when ``staged``); returns the count."""
    images = [ImageInput(data=base64.b64encode(data).decode("ascii")) for data in raw]
    dense: Sequence[np.ndarray | None]
    if info.dense:
        features = await pipeline.dense_images(rt, images, fields, pooled=True)
        assert features.pooled is not None
        vectors, dense = features.pooled, list(features.tokens)
    else:
        vectors, dense = (await pipeline.embed_images(rt, images, fields)).vectors, [None] * len(images)
    vectors = l2_normalize(vectors)  # cached embeddings are float16-rounded: stored as unit vectors
    # The bytes are kept before the items that name them are stored: an item never names a missing file.
    digests = await collections.call(collections.images.put, info.name, raw)
    new = [
        NewItem(item_id, metadata, vector, tokens, digest)
        for (item_id, metadata), vector, tokens, digest in zip(items, vectors, dense, digests, strict=True)
    ]
    upsert = collections.store.upsert_staged if staged else collections.store.upsert
    return await collections.call(upsert, info.name, new)


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
        if req.rerank == "dense":
            # The candidates of a re-rank are near what a negated text shows and away from what it
            # excludes (the evaluation's retrieval figures rank the same way).
            texts = await pipeline.embed_texts(rt, first_stage_texts(req.text), req.encoder)
            query = first_stage_query(req.text, l2_normalize(texts.vectors))
        else:
            query = l2_normalize((await pipeline.embed_texts(rt, [req.text], req.encoder)).vectors[0])
        hits = await collections.call(
            store.search, info.name, query, req.k if second_stage else wanted, req.filters, req.ef_search
        )
        if req.rerank == "dense" and hits:
            return await _dense_reranked(pipeline, rt, collections, info, req, hits)
        return _answer(info, hits, [h.cosine for h in hits], "cosine", req)
    assert req.image is not None
    if req.difference is None:
        image = await pipeline.embed_images(rt, [req.image], ["image"])
        query = l2_normalize(image.vectors[0])
        hits = await collections.call(store.search, info.name, query, wanted, req.filters, req.ef_search)
        return _answer(info, hits, [h.cosine for h in hits], "cosine", req)
    encoder = req.encoder or (PCCLIP_ENCODER if PCCLIP_ENCODER in rt.text_batchers else None)
    text, image = await both(
        pipeline.embed_texts(rt, [req.difference], encoder), pipeline.embed_images(rt, [req.image], ["image"])
    )
    query = l2_normalize(image.vectors[0])
    hits = await collections.call(store.search, info.name, query, req.k, req.filters, req.ef_search)
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
