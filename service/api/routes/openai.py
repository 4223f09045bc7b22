"""OpenAI-compatible routes: ``POST /v1/embeddings`` and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.api import openai_embeddings
from service.api.deps import PipelineDep, ServicesDep, use_model
from service.api.openai_schemas import EmbeddingsRequest, EmbeddingsResponse, OpenAIModelList
from service.api.schemas import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES)


@router.post("/embeddings", response_model=EmbeddingsResponse)
async def create_embeddings(
    req: EmbeddingsRequest, request: Request, services: ServicesDep, pipeline: PipelineDep
) -> EmbeddingsResponse:
    model = services.models.resolve(req.model)
    async with use_model(request, services, model) as runtime:
        return await openai_embeddings.embeddings(pipeline, runtime, req, services.settings.limits)


@router.get("/models", response_model=OpenAIModelList)
async def list_models(services: ServicesDep) -> OpenAIModelList:
    return openai_embeddings.model_list(services.models.status())
