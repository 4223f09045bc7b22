"""The one doorway from a request to a model: resolve, route, lease, answer, and shadow.

A route resolves the request's ``model`` first (``ServedModels.resolve``: an unknown name is a 404
before the request's input is checked), then hands it with its operation (a function of the
runtime) to ``Answering``: ``ServedModels.lease`` loads the entry if a memory budget had unloaded
it, routes the caller (``X-Canary-Key``, else the API key) to the entry's canary or primary, or to
the version the ``model`` named (``RoleTable.route``), and holds that runtime to the end of the
operation even if a new version is swapped in meanwhile. When the request is sampled for the
entry's shadow, the same operation is handed to the entry's shadow runner as a background task of
the response, run once the answer has been sent; its answer is compared (``shadowing.summarize``)
and never returned.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import BackgroundTasks, Depends, Request
from pydantic import BaseModel

from service.api.deps import CanaryKeyHeader, Services
from service.api.shadowing import summarize
from service.runtime.canary import caller_key
from service.runtime.model_runtime import ModelRuntime
from service.runtime.served import Selection
from service.runtime.shadow import ShadowJob

__all__ = ["AnswerDep", "Answering", "use_model"]

R = TypeVar("R", bound=BaseModel)


@contextlib.asynccontextmanager
async def use_model(
    request: Request, services: Services, model: Selection, key: bytes | None = None
) -> AsyncIterator[ModelRuntime]:
    """The runtime of ``model`` that answers the caller ``key`` (``ServedModels.lease``), held from
    start to end, for a route that answers without shadowing."""
    async with services.models.lease(model, key) as runtime:
        note_answerer(request, runtime)
        yield runtime


def note_answerer(request: Request, runtime: ModelRuntime) -> None:
    request.state.model = runtime.ref  # for the access log line, X-Model and the metrics by version
    request.state.entry = runtime.entry  # the metrics' `model` label
    request.state.role = runtime.role


@dataclass
class Answering:
    """Call it with what the request's ``model`` picks (``ServedModels.resolve``) and the
    endpoint's operation (a function of the runtime): it returns the answer."""

    request: Request
    services: Services
    key: bytes | None  # the caller, for the entry's canary routing
    endpoint: str
    background: BackgroundTasks

    async def __call__(self, model: Selection, operation: Callable[[ModelRuntime], Awaitable[R]]) -> R:
        # ``use_model``'s body, without its generator (one per answer)
        async with self.services.models.lease(model, self.key) as runtime:
            note_answerer(self.request, runtime)
            answer = await operation(runtime)
        entry = model.entry
        version = entry.shadow_sample()
        if version is not None:
            job = ShadowJob(version, self.endpoint, answer, operation, summarize)
            self.background.add_task(entry.offer_shadow, job)
        return answer


async def answering(request: Request, background: BackgroundTasks, canary_key: CanaryKeyHeader = None) -> Answering:
    """The one dependency of the answering routes (FastAPI solves each dependency, and the path,
    query, header and cookie parameters of each, on every request): the services, the caller's key
    (``get_caller_key``'s header, read here) and the endpoint come with it."""
    route = request.scope.get("route")
    endpoint = route.path if route is not None else request.url.path
    key = caller_key(canary_key, request.headers.get("authorization"))
    return Answering(request, request.app.state.services, key, endpoint, background)


AnswerDep = Annotated[Answering, Depends(answering)]
