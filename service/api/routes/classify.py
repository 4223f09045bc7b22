"""POST /classify: zero-shot classification, optionally with comparative prompting."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from service.api import operations
from service.api.answering import AnswerDep
from service.api.json_body import JsonBodyRoute
from service.api.multipart import openapi_form
from service.api.schemas import ERROR_RESPONSES, ClassifyRequest, ClassifyResponse
from service.api.validation import check_classify

router = APIRouter(tags=["classify"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post(
    "/classify",
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    openapi_extra=openapi_form(ClassifyRequest),
)
async def classify(
    req: ClassifyRequest,
    request: Request,
    answer: AnswerDep,
    comparative: Annotated[bool, Query(description="apply comparative prompts (request or model library)")] = False,
) -> ClassifyResponse:
    services = answer.services
    model = services.models.resolve(req.model)
    check_classify(req, services.settings.limits)
    return await answer(model, lambda rt: operations.classify(services.pipeline, rt, req, comparative))
