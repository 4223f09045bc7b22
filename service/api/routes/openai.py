"""OpenAI-compatible routes: ``POST /v1/embeddings`` and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api import openai_embeddings
from service.api.answering import AnswerDep
from service.api.deps import VARY_BY_CALLER, CallerKeyDep, ServicesDep
from service.api.json_body import JsonBodyRoute
from service.api.openai_schemas import EmbeddingsRequest, EmbeddingsResponse, OpenAIModelList
from service.api.schemas import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/embeddings", response_model=EmbeddingsResponse)
async def create_embeddings(req: EmbeddingsRequest, answer: AnswerDep) -> EmbeddingsResponse:
    services = answer.services
    model = services.models.resolve(req.model)
    return await answer(
        model, lambda rt: openai_embeddings.embeddings(services.pipeline, rt, req, services.settings.limits)
    )


@router.get("/models", response_model=OpenAIModelList)
async def list_models(services: ServicesDep, key: CallerKeyDep, response: Response) -> OpenAIModelList:
    """The ids `model` may take, each with the version that answers this caller (`answers`, by the
    request's `X-Canary-Key`, else its API key)."""
    response.headers["Vary"] = VARY_BY_CALLER
    return openai_embeddings.model_list(services.models.status(key))
