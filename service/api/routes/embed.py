"""POST /embed: raw embeddings of texts or images (ids usable later as {"sha256": id})."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import operations
from service.api.answering import AnswerDep
from service.api.json_body import JsonBodyRoute
from service.api.multipart import openapi_form
from service.api.schemas import ERROR_RESPONSES, EmbedRequest, EmbedResponse
from service.api.validation import check_embed

router = APIRouter(tags=["embed"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post(
    "/embed", response_model=EmbedResponse, response_model_exclude_none=True, openapi_extra=openapi_form(EmbedRequest)
)
async def embed(req: EmbedRequest, answer: AnswerDep) -> EmbedResponse:
    services = answer.services
    model = services.models.resolve(req.model)
    check_embed(req, services.settings.limits)
    return await answer(model, lambda rt: operations.embed(services.pipeline, rt, req))
