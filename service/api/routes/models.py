"""GET /models and GET /models/{name}: what the store holds and which versions serve."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Response

from clipcore.backends.base import AutoDecision
from clipcore.models.components import BASE_ENCODER, Components
from model_store import ModelNotFound, ModelStore, StoreError
from service.api.deps import VARY_BY_CALLER, CallerKeyDep, ServicesDep
from service.api.errors import ApiError, ErrorCode
from service.api.json_body import JsonBodyRoute
from service.api.schemas import (
    ERROR_RESPONSES,
    AutoInfo,
    CacheInfo,
    CanaryInfo,
    ModelInfo,
    ModelsResponse,
    QuarantineInfo,
    RetimeInfo,
    ServedModel,
    ShadowEndpointInfo,
    ShadowInfo,
    VersionInfo,
)
from service.config import Limits
from service.runtime.policy import Quarantine
from service.runtime.retime import RetimeState
from service.runtime.roles import CANARY, SHADOW
from service.runtime.served import EntryStatus, shown_name

router = APIRouter(tags=["models"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute)
log = logging.getLogger("service.models")


def _eval_annex(store: ModelStore, name: str, version: str) -> dict[str, Any] | None:
    try:
        raw = store.read_annex(name, version, "eval.json")
        data = None if raw is None else json.loads(raw)
    except (OSError, ValueError) as exc:  # an unreadable report must not hide the model list
        log.warning("ignoring unreadable eval.json of %s@%s: %s", name, version, exc)
        return None
    return data if isinstance(data, dict) else None


def _problem(exc: Exception, store: ModelStore) -> str:
    """A short reason: the error and its message, with paths relative to the store (callers need
    not know where it is mounted; the log has the full error)."""
    root = str(store.backend.local_path(""))
    return f"{type(exc).__name__}: {exc}".replace(root + os.sep, "").replace(root, ".")[:300]


def describe(
    store: ModelStore,
    name: str,
    served: list[EntryStatus],
    autos: dict[str, AutoDecision] | None = None,
    retimes: dict[str, RetimeState] | None = None,
) -> ModelInfo:
    """One model's versions, marked where an entry of the served set serves them (with how auto
    chose its backend, from ``autos`` by name@version, and where its re-timing stands, from
    ``retimes``). A version (or alias table) that cannot be
    read is listed with its error instead of failing the whole answer: the others, and the serving
    ones, stay visible."""
    serving_refs = {entry.serving for entry in served if entry.serving is not None}
    autos, retimes = autos or {}, retimes or {}
    versions_listed = store.list_versions(name)  # ModelNotFound for an unknown name
    alias_error = None
    try:
        aliases = store.aliases(name)
    except Exception as exc:
        aliases, alias_error = {}, _problem(exc, store)
        log.warning("cannot read the aliases of %s: %s: %s", name, type(exc).__name__, exc)
    versions = []
    for version in versions_listed:
        try:
            manifest = store.manifest(name, version)
            components = Components.from_manifest(manifest.components)
        except Exception as exc:
            log.warning("cannot read the manifest of %s@%s: %s: %s", name, version, type(exc).__name__, exc)
            versions.append(
                VersionInfo(
                    version=version,
                    created_at="",
                    aliases=sorted(a for a, v in aliases.items() if v == version),
                    serving=f"{name}@{version}" in serving_refs,
                    text_encoders=[],
                    default_text_encoder="",
                    components=[],
                    metrics={},
                    error=_problem(exc, store),
                )
            )
            continue
        encoders = [BASE_ENCODER, *components.text_encoders]
        versions.append(
            VersionInfo(
                version=version,
                created_at=manifest.created_at,
                aliases=sorted(a for a, v in aliases.items() if v == version),
                serving=f"{name}@{version}" in serving_refs,
                text_encoders=encoders,
                default_text_encoder=components.default_text_encoder,
                components=components.optional,
                metrics=dict(manifest.metrics),
                eval=_eval_annex(store, name, version),
                auto=_auto_info(autos.get(f"{name}@{version}"), retimes.get(f"{name}@{version}")),
            )
        )
    # What a request naming just this model gets: the first entry of that name.
    first = next((entry.serving for entry in served if entry.name == name and entry.serving is not None), None)
    serving_version = first.partition("@")[2] if first is not None else None
    return ModelInfo(name=name, aliases=aliases, serving=serving_version, versions=versions, error=alias_error)


def served_models(served: list[EntryStatus]) -> list[ServedModel]:
    return [
        ServedModel(
            ref=entry.ref,
            serving=entry.serving,
            state=entry.state,
            default=entry.default,
            store="ok" if entry.store_ok else "unreadable",
            canary=entry.canary,
            answers=entry.answers,
            quarantine=_quarantine_info(entry.quarantine),
        )
        for entry in served
    ]


def _quarantine_info(quarantine: Quarantine | None) -> QuarantineInfo | None:
    if quarantine is None:
        return None
    until = datetime.fromtimestamp(quarantine.until_epoch(), UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return QuarantineInfo(version=quarantine.version, reason=quarantine.reason, refused=quarantine.refused,
                          failures=quarantine.failures, until=until)  # fmt: skip


def _auto_info(decision: AutoDecision | None, retime: RetimeState | None = None) -> AutoInfo | None:
    if decision is None:
        return None
    retimed = RetimeInfo(**{k: v for k, v in asdict(retime).items() if k != "version"}) if retime else None
    return AutoInfo(**asdict(decision), decision=decision.provenance, retime=retimed)


def _retimes(services: ServicesDep) -> dict[str, RetimeState]:
    """name@version -> where the re-timing of its ``auto`` decision stands, for serving primaries."""
    views = (entry.view() for entry in services.models.entries)
    return {view.primary.ref: view.retime for view in views if view.primary is not None and view.retime is not None}


def _autos(services: ServicesDep) -> dict[str, AutoDecision]:
    """name@version -> how auto chose its backend, for every loaded runtime that auto chose
    (canaries and shadows included)."""
    views = [entry.view() for entry in services.models.entries]
    runtimes = (rt for view in views for rt in (view.primary, view.canary, view.shadow))
    return {rt.ref: rt.auto for rt in runtimes if rt is not None and rt.auto is not None}


def with_split(info: ModelInfo, services: ServicesDep) -> ModelInfo:
    """``info`` with the canary and shadow of the alias that this model's first served-set entry
    following an alias routes by (the entry a request naming just the model gets), if any."""
    views = (entry.view() for entry in services.models.entries if entry.name == info.name)
    view = next((v for v in views if v.alias is not None), None)
    if view is None or view.alias is None:
        return info
    entry = view.alias
    if entry.canary is not None:
        canary = entry.canary
        loaded = view.canary is not None and view.canary.version == canary.version
        info.canary = CanaryInfo(version=canary.version, weight=canary.weight, loaded=loaded,
                                 problem=None if loaded else view.side_problems.get(CANARY))  # fmt: skip
    if entry.shadow is not None:
        shadow = entry.shadow
        endpoints = {
            endpoint: ShadowEndpointInfo(
                compared=stats.compared,
                dropped=stats.dropped,
                failed=stats.failed,
                agreement=stats.agreement,
                mean_cosine=stats.mean_cosine,
                mean_correlation=stats.mean_correlation,
            )
            for endpoint, stats in sorted(view.shadow_stats.items())
        }
        loaded = view.shadow is not None and view.shadow.version == shadow.version
        info.shadow = ShadowInfo(
            version=shadow.version, fraction=shadow.fraction, loaded=loaded, endpoints=endpoints,
            problem=None if loaded else view.side_problems.get(SHADOW),
        )  # fmt: skip
    return info


def _store_unreadable(exc: StoreError) -> ApiError:
    """A store that cannot be read (S3 down, a broken mount) is a 503; its location and the
    cause go to the log only: response bodies reach unauthenticated callers."""
    log.warning("cannot read the model store: %s: %s", type(exc).__name__, exc)
    return ApiError(ErrorCode.not_ready, "model store is not readable; the server log says why")


# Plain ``def``: FastAPI runs these in its thread pool, so store reads never block the loop.
@router.get("/models", response_model=ModelsResponse)
def list_models(services: ServicesDep, key: CallerKeyDep, response: Response) -> ModelsResponse:
    response.headers["Vary"] = VARY_BY_CALLER  # `served[].answers` is the caller's
    served = services.models.status(key)
    serving = served[0].serving
    store = services.store
    try:
        autos, retimes = _autos(services), _retimes(services)
        models = [
            with_split(describe(store, name, served, autos, retimes), services) for name in sorted(store.list_models())
        ]
    except StoreError as exc:
        raise _store_unreadable(exc) from None
    cache = services.cache
    state = cache.redis_state
    info = CacheInfo(redis=state, last_error=cache.last_error if state != "up" else None, lru_items=len(cache))
    return ModelsResponse(serving=serving, served=served_models(served), models=models, cache=info)


@router.get("/models/{name}", response_model=ModelInfo)
def get_model(name: str, services: ServicesDep) -> ModelInfo:
    try:
        described = describe(services.store, name, services.models.status(), _autos(services), _retimes(services))
        return with_split(described, services)
    except (ModelNotFound, ValueError):  # InvalidName is a ValueError: treat as unknown
        raise ApiError(ErrorCode.unknown_model, f"no model named {shown_name(name)} in the store", "name") from None
    except StoreError as exc:  # after ModelNotFound, which is a StoreError too
        raise _store_unreadable(exc) from None


@router.get("/limits", response_model=Limits)
def get_limits(services: ServicesDep) -> Limits:
    """What one request may hold here (over a count or size: 413). Clients split larger work
    by these numbers."""
    return services.settings.limits
