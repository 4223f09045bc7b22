"""POST /score/dense (DCSM dense scoring) and POST /score/dense/heatmap (its per-token maps as a PNG)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api import dense_operations
from service.api.answering import AnswerDep, use_model
from service.api.deps import CallerKeyDep, PipelineDep, ServicesDep
from service.api.json_body import JsonBodyRoute
from service.api.multipart import openapi_form
from service.api.schemas import ERROR_RESPONSES, DenseRequest, DenseResponse, HeatmapRequest
from service.api.validation import check_dense, check_heatmap

router = APIRouter(tags=["dense"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


class PNGResponse(Response):
    media_type = "image/png"


# FastAPI documents a "model" in the route's media type (image/png here); errors are JSON.
_JSON_ERRORS: dict[int | str, dict[str, object]] = {
    status: {
        **{k: v for k, v in doc.items() if k != "model"},
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for status, doc in ERROR_RESPONSES.items()
}


@router.post(
    "/score/dense",
    response_model=DenseResponse,
    response_model_exclude_none=True,
    openapi_extra=openapi_form(DenseRequest),
)
async def score_dense(req: DenseRequest, answer: AnswerDep) -> DenseResponse:
    services = answer.services
    model = services.models.resolve(req.model)
    check_dense(req, services.settings.limits)
    return await answer(model, lambda rt: dense_operations.score_dense(services.pipeline, rt, req))


@router.post(
    "/score/dense/heatmap",
    response_class=PNGResponse,
    openapi_extra=openapi_form(HeatmapRequest),
    responses={
        **_JSON_ERRORS,
        200: {
            "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
            "description": "PNG: the image beside one patch-grid map per token of the text",
        },
    },
)
async def dense_heatmap(
    req: HeatmapRequest, request: Request, services: ServicesDep, pipeline: PipelineDep, key: CallerKeyDep
) -> PNGResponse:
    model = services.models.resolve(req.model)
    check_heatmap(req, services.settings.limits)
    async with use_model(request, services, model, key) as runtime:
        return PNGResponse(await dense_operations.heatmap(pipeline, runtime, req))
