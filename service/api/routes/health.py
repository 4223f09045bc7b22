"""Probes and metrics: /healthz (alive), /readyz (the default model is loaded and warm; the models it
serves only with ``probes_list_models``), /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import ServicesDep
from service.api.errors import ApiError, ErrorCode
from service.api.routes.models import served_models
from service.api.schemas import HealthResponse, ReadyResponse, error_response_doc

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    return HealthResponse(status="ok")


@router.get("/readyz", response_model=ReadyResponse, responses={503: error_response_doc("not_ready", retry_after=True)})
async def readyz(services: ServicesDep) -> ReadyResponse:
    manager = services.manager
    current = manager.current
    if current is None:
        # Unauthenticated callers (load balancers) get a reason without paths; the log has the detail.
        raise ApiError(ErrorCode.not_ready, manager.not_ready_message(), headers={"Retry-After": "1"})
    # Ready once the default model serves: it answers requests that name none. The others'
    # states are listed (one still loading, or held out by max_loaded_models, does not make
    # the replica unready) only when the settings say so: this probe needs no key.
    listed = services.settings.probes_list_models
    return ReadyResponse(
        ready=True,
        model=current.ref if listed else None,
        redis=services.cache.redis_state,
        store="ok" if manager.watch_error is None else "unreadable",
        models=served_models(services.models.status()) if listed else [],
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus exposition"}},
)
async def metrics(services: ServicesDep) -> Response:
    body, content_type = services.metrics.render()
    return Response(content=body, media_type=content_type)
