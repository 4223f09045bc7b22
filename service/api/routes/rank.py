"""POST /rank-pair and POST /rank: difference-based ordering of images."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import operations
from service.api.answering import AnswerDep
from service.api.json_body import JsonBodyRoute
from service.api.multipart import openapi_form
from service.api.schemas import ERROR_RESPONSES, RankPairRequest, RankPairResponse, RankRequest, RankResponse
from service.api.validation import check_rank, check_rank_pair

router = APIRouter(tags=["rank"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post(
    "/rank-pair",
    response_model=RankPairResponse,
    response_model_exclude_none=True,
    openapi_extra=openapi_form(RankPairRequest),
)
async def rank_pair(req: RankPairRequest, answer: AnswerDep) -> RankPairResponse:
    services = answer.services
    model = services.models.resolve(req.model)
    check_rank_pair(req, services.settings.limits)
    return await answer(model, lambda rt: operations.rank_pair(services.pipeline, rt, req))


@router.post(
    "/rank", response_model=RankResponse, response_model_exclude_none=True, openapi_extra=openapi_form(RankRequest)
)
async def rank(req: RankRequest, answer: AnswerDep) -> RankResponse:
    services = answer.services
    model = services.models.resolve(req.model)
    check_rank(req, services.settings.limits)
    return await answer(model, lambda rt: operations.rank(services.pipeline, rt, req))
