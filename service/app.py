"""The FastAPI application: ``create_app(settings)`` wires settings, store, model, cache and routes.

Startup order (lifespan): store -> embedding cache (Redis optional) -> the served set, whose
models load and warm in the background (so /healthz answers at once and /readyz says 503 until
the default model is warm) and then watch their aliases for hot swaps. Shutdown reverses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.security import HTTPBearer

from model_store import ModelStore, open_backend
from model_store.version import package_version
from service.api.deps import Services
from service.api.direct_routes import DirectRoutesMiddleware
from service.api.errors import install_error_handlers
from service.api.middleware import (
    AdmissionMiddleware,
    AuthMiddleware,
    BodyLimitMiddleware,
    HeadMiddleware,
    ObserveMiddleware,
    SecurityHeadersMiddleware,
)
from service.api.multipart import MultipartFormMiddleware, form_models
from service.api.routes import classify, collections, dense, embed, health, models, openai, rank
from service.api.routes.docs import install_docs
from service.api.routes.playground import install_playground
from service.auth import ApiKeyAuth
from service.collections.resume import resume_jobs
from service.collections.service import Collections
from service.config import Settings
from service.fastapi_telemetry import settle_telemetry
from service.runtime.cache import EmbeddingCache
from service.runtime.heap import collect_young_less_often, settle
from service.runtime.metrics import ServiceMetrics
from service.runtime.pipeline import Pipeline
from service.runtime.served import ServedModels

log = logging.getLogger("service")
RESUME_WAIT_S = 5.0  # how long start-up waits for the store's list of running jobs before serving


def build_services(settings: Settings) -> Services:
    metrics = ServiceMetrics()
    store = ModelStore(open_backend(settings.store, settings.store_cache_dir))
    cache = EmbeddingCache(
        settings.redis_url_value(),
        ttl_s=settings.cache_ttl_s,
        lru_items=settings.lru_items,
        timeout_s=settings.redis_timeout_s,
        retry_after_s=settings.redis_retry_after_s,
        metrics=metrics,
        timeouts_to_open=settings.redis_timeouts_to_open,
        successes_to_close=settings.redis_successes_to_close,
    )
    return Services(
        settings=settings,
        store=store,
        metrics=metrics,
        cache=cache,
        models=ServedModels(settings, store, metrics),
        pipeline=Pipeline(settings, cache, metrics),
        auth=ApiKeyAuth(settings),
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings if settings is not None else Settings()
    services = build_services(settings)
    user_collections = Collections(settings.collections, services.metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("starting with settings %s", json.dumps(settings.redacted(), sort_keys=True))
        if settle_telemetry(app):
            log.debug("no OpenTelemetry provider configured: FastAPI's own telemetry is off")
        collect_young_less_often()
        if settings.redis_url is not None and not await services.cache.ping():
            log.warning(
                "redis at the configured redis_url is unreachable; serving with the in-process cache "
                "only until it comes back"
            )
        settle()  # what the imports made lives as long as the process: kept out of collections
        await services.models.start()
        # Jobs a stopped server left running are taken up before it serves (a collection being
        # re-embedded answers 503 from the first request); a database not reachable yet is
        # waited for in the background.
        import_check = collections.item_check(user_collections.settings)
        resuming = asyncio.create_task(resume_jobs(services, services.pipeline, user_collections, import_check))
        await asyncio.wait([resuming], timeout=RESUME_WAIT_S)
        try:
            yield
        finally:
            resuming.cancel()
            # Each part closes even if one before it fails. The collections first: their running
            # jobs stop at their next batch while the models still serve it (a re-embedding
            # stopped with the server keeps its record and goes on at the next start), never on
            # a model closed under them.
            for part in (user_collections, services.models, services.pipeline, services.cache):
                try:
                    await part.close()
                except Exception:
                    log.exception("closing %s failed", type(part).__name__)

    app = FastAPI(
        title="CLIP difference & composition scoring service",
        version=package_version(),  # one version: the package's, as --version prints it
        lifespan=lifespan,
        docs_url=None,  # served from the package by service.api.routes.docs (no CDN)
        redoc_url=None,
        description="Zero-shot classification, comparative prompting and difference ranking with CLIP models. "
        'Errors are always {"error": {"code", "message", "field"}}.',
    )
    app.state.services = services
    app.state.collections = user_collections
    install_error_handlers(app)
    # Keys are enforced by AuthMiddleware; this only documents the scheme in the OpenAPI spec, and
    # only on a server that has keys (the committed contract is that of the default, open server).
    documented = [Depends(HTTPBearer(auto_error=False, description="API key"))] if services.auth.enabled else []
    routers = [module.router for module in (classify, rank, dense, embed, models, openai, collections)]
    for router in routers:
        app.include_router(router, dependencies=documented)
    app.include_router(health.router)
    install_docs(app)
    if settings.playground:
        install_playground(app)
    # Added last = outermost. Order of a request: security headers -> observe -> HEAD as GET -> CORS
    # -> admission -> auth -> body cap -> multipart forms to JSON -> (on the engine, pre-decoded
    # requests to the answering routes: service.api.direct_routes) -> routes, so every answer carries
    # the security headers, metrics and the access log see every answer (a HEAD as a HEAD, on its
    # route), CORS preflights need no key, a request over the in-flight bound costs no key check
    # and an upload is counted by the cap before it is parsed.
    app.add_middleware(DirectRoutesMiddleware, routes=[route for router in routers for route in router.routes])
    app.add_middleware(
        MultipartFormMiddleware,
        limits=settings.limits,
        forms=form_models(routers),
        files_by_route={collections.ADD_IMAGES: settings.collections.max_items_per_add},
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(AuthMiddleware, auth=services.auth)
    app.add_middleware(AdmissionMiddleware, limit=settings.limits.max_concurrent_requests)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(HeadMiddleware)
    app.add_middleware(ObserveMiddleware, metrics=services.metrics)
    app.add_middleware(SecurityHeadersMiddleware)
    return app
