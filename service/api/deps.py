"""Annotated dependencies shared by the routers: services, the serving runtime, auth."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from model_store import ModelStore
from service.api.errors import ApiError, ErrorCode
from service.auth import ApiKeyAuth
from service.config import Settings
from service.runtime.cache import EmbeddingCache
from service.runtime.canary import CANARY_KEY_HEADER, caller_key
from service.runtime.lifecycle import ModelManager, ModelRuntime
from service.runtime.metrics import ServiceMetrics
from service.runtime.pipeline import Pipeline


@dataclass
class Services:
    """Everything built at startup; one instance per app, on ``app.state.services``."""

    settings: Settings
    store: ModelStore
    metrics: ServiceMetrics
    cache: EmbeddingCache
    manager: ModelManager
    pipeline: Pipeline
    auth: ApiKeyAuth


# Dependencies are coroutines even where they do not await: FastAPI runs a plain function in its
# thread pool, two thread hand-offs per request for an attribute read.
async def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


async def serving_runtime(
    request: Request,
    services: ServicesDep,
    canary_key: Annotated[
        str | None,
        Header(
            alias=CANARY_KEY_HEADER,
            description="who the caller is, for canary routing: one key is always answered by the same version "
            "(default: the API key, else random)",
        ),
    ] = None,
) -> AsyncIterator[ModelRuntime]:
    """The runtime this request uses from start to end, even if a new version is swapped in: the
    canary's for the callers the alias routes to it, else the primary's."""
    key = caller_key(canary_key, request.headers.get("authorization"))
    async with services.manager.acquire(key) as runtime:
        request.state.model = runtime.ref  # for the access log line, X-Model and the metrics by version
        request.state.role = runtime.role
        yield runtime


RuntimeDep = Annotated[ModelRuntime, Depends(serving_runtime)]


async def get_pipeline(services: ServicesDep) -> Pipeline:
    return services.pipeline


PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]


def ensure_model(services: Services, runtime: ModelRuntime, requested: str | None) -> None:
    """A request may name the model it expects; anything but the serving one is a 404."""
    if requested is not None and not services.manager.matches(requested, runtime):
        raise ApiError(
            ErrorCode.unknown_model,
            f"model {requested!r} is not served here; this server serves {runtime.ref}",
            "model",
        )
