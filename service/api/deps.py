"""Annotated dependencies shared by the routers: services, the pipeline, the model a request names."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from model_store import ModelStore
from service.auth import ApiKeyAuth
from service.config import Settings
from service.runtime.cache import EmbeddingCache
from service.runtime.canary import CANARY_KEY_HEADER, caller_key
from service.runtime.lifecycle import ModelManager, ModelRuntime
from service.runtime.metrics import ServiceMetrics
from service.runtime.pipeline import Pipeline
from service.runtime.served import Selection, ServedModels


@dataclass
class Services:
    """Everything built at startup; one instance per app, on ``app.state.services``."""

    settings: Settings
    store: ModelStore
    metrics: ServiceMetrics
    cache: EmbeddingCache
    models: ServedModels
    pipeline: Pipeline
    auth: ApiKeyAuth

    @property
    def manager(self) -> ModelManager:
        """The default entry of the served set: it answers requests that name no model."""
        return self.models.default


# Dependencies are coroutines even where they do not await: FastAPI runs a plain function in its
# thread pool, two thread hand-offs per request for an attribute read.
async def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_caller_key(
    request: Request,
    canary_key: Annotated[
        str | None,
        Header(
            alias=CANARY_KEY_HEADER,
            description="who the caller is, for canary routing: one key is always answered by the same version "
            "(default: the API key, else random)",
        ),
    ] = None,
) -> bytes | None:
    """Who the request comes from, for the canary routing of the entry it picks
    (``service.runtime.canary.caller_key``)."""
    return caller_key(canary_key, request.headers.get("authorization"))


CallerKeyDep = Annotated[bytes | None, Depends(get_caller_key)]
# Answers that depend on the caller's key (which version answers them) vary by these headers.
VARY_BY_CALLER = f"{CANARY_KEY_HEADER}, Authorization"


async def get_pipeline(services: ServicesDep) -> Pipeline:
    return services.pipeline


PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]


@contextlib.asynccontextmanager
async def use_model(
    request: Request, services: Services, model: Selection, key: bytes | None = None
) -> AsyncIterator[ModelRuntime]:
    """The runtime of ``model`` (from ``services.models.resolve``: an unknown name is a 404 before
    the request's input is checked) that answers the caller ``key`` (``CallerKeyDep``): the entry's
    canary for the callers its alias routes to it, else its primary; the version the request's
    ``model`` named, if it named one. Held from start to end even if a new version is swapped in.
    Under a memory budget, a model that is not loaded loads first."""
    async with services.models.acquire_entry(model, key) as runtime:
        request.state.model = runtime.ref  # for the access log line, X-Model and the metrics by version
        request.state.entry = runtime.entry  # the metrics' `model` label
        request.state.role = runtime.role
        yield runtime
