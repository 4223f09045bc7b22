"""What the DCSM endpoints compute: dense features from the pipeline, scores from the bundle.

Dense image and text features come through the pipeline (cache, then batched encodes); the
map and score math is ``clipcore.methods.dcsm``, reached through ``ModelBundle.score_dense`` on
the version's model thread. Each text is scored on its own, so scores never depend on what
else a request (or a concurrent one) contains.
"""

from __future__ import annotations

import numpy as np

from clipcore.heatmap import heatmap_png, heatmap_title
from clipcore.methods.common import l2_normalize
from clipcore.methods.zero_shot import zero_shot_logits
from service.api.errors import ApiError, ErrorCode
from service.api.operations import both
from service.api.schemas import DenseRequest, DenseResponse, HeatmapRequest
from service.runtime.assembly import ModelRuntime
from service.runtime.pipeline import DenseImages, DenseTexts, Pipeline


def require_dcsm(runtime: ModelRuntime) -> None:
    if reason := runtime.bundle.per_token_unsupported("dense scoring (DCSM)"):
        raise ApiError(ErrorCode.unsupported_for_family, reason)
    if runtime.bundle.dcsm is None or runtime.dense_image_batcher is None:
        raise ApiError(
            ErrorCode.unknown_component,
            f"{runtime.ref} has no DCSM scorer (component 'dcsm'); dense scoring needs a model "
            "version published with one",
        )


async def _score(runtime: ModelRuntime, image: DenseImages, texts: DenseTexts) -> tuple[np.ndarray, np.ndarray]:
    bundle = runtime.bundle
    return await runtime.run(lambda: bundle.score_dense(image.tokens[0], texts.tokens, texts.layouts))


async def score_dense(pipeline: Pipeline, rt: ModelRuntime, req: DenseRequest) -> DenseResponse:
    require_dcsm(rt)
    (image, texts), pooled = await both(
        both(pipeline.dense_images(rt, [req.image], ["image"]), pipeline.dense_texts(rt, req.texts)),
        pipeline.embed_texts(rt, req.texts, None),
    )
    scores, maps = await _score(rt, image, texts)
    assert image.pooled is not None
    # Cached embeddings are float16-rounded: renormalise so this is a true cosine.
    _, cosine = zero_shot_logits(l2_normalize(image.pooled), l2_normalize(pooled.vectors), rt.logit_scale)
    layouts = texts.layouts
    truncated = sum(lay.truncated or cut for lay, cut in zip(layouts, pooled.truncated, strict=True))
    return DenseResponse(
        model=rt.ref,
        scores=[float(s) for s in scores],
        best=int(np.argmax(scores)),
        cosine=[float(c) for c in cosine[0]],
        maps=[maps[i][lay.valid].tolist() for i, lay in enumerate(layouts)] if req.return_maps else None,
        tokens=[list(lay.labels) for lay in layouts] if req.return_maps else None,
        functional_words=[list(lay.words) for lay in layouts],
        truncated_texts=truncated or None,
    )


async def heatmap(pipeline: Pipeline, rt: ModelRuntime, req: HeatmapRequest) -> bytes:
    """PNG of the text's per-token maps beside the image (``clipcore.heatmap``)."""
    require_dcsm(rt)
    image, texts = await both(
        pipeline.dense_images(rt, [req.image], ["image"], pooled=False, with_pixels=True),
        pipeline.dense_texts(rt, [req.text]),
    )
    scores, maps = await _score(rt, image, texts)
    layout, pixels = texts.layouts[0], image.pixels[0]
    assert pixels is not None  # references are refused by validation
    rows = maps[0][layout.valid]
    functional = list(layout.row_index[layout.valid] >= 0)
    title = heatmap_title(req.text, float(scores[0]))
    return await pipeline.offload(lambda: heatmap_png(pixels, rows, layout.labels, functional, title=title))
