"""How a handler answers: on the request's runtime, and again on the shadow after the answer is sent.

``AnswerDep`` runs an endpoint's operation on the runtime of the served-set entry the request
names (``use_model``: that entry's canary for the callers routed to it) and, when the request is
sampled for that entry's shadow, hands the same operation to that entry's shadow runner as a
background task of the response, which Starlette runs once the answer has been sent. The
shadow's answer is compared with the one sent and never returned.

``summarize`` says what is compared of each endpoint's answer: the top-1 label per image
(/classify), the decision per pair (/rank-pair), the top image (/rank), the best caption and the
scores (/score/dense), the embeddings (/embed, /v1/embeddings).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import BackgroundTasks, Depends, Request
from pydantic import BaseModel

from service.api.deps import CanaryKeyHeader, Services, use_model
from service.api.openai_schemas import EmbeddingsResponse
from service.api.schemas import ClassifyResponse, DenseResponse, EmbedResponse, RankPairResponse, RankResponse
from service.api.vector_encoding import decode_rows
from service.runtime.canary import caller_key
from service.runtime.lifecycle import ModelRuntime
from service.runtime.served import Selection
from service.runtime.shadow import Answer, ShadowJob

__all__ = ["AnswerDep", "Answering", "summarize"]

R = TypeVar("R", bound=BaseModel)


def summarize(answer: BaseModel) -> Answer:
    """What a shadow comparison looks at in one endpoint's answer."""
    if isinstance(answer, ClassifyResponse):
        return Answer(decisions=tuple(r.label for r in answer.results))
    if isinstance(answer, RankPairResponse):
        pairs = answer.results if answer.results is not None else []
        return Answer(decisions=tuple(p.first for p in pairs) if pairs else (answer.first,))
    if isinstance(answer, RankResponse):
        return Answer(decisions=(answer.ranking[0].index,) if answer.ranking else ())
    if isinstance(answer, DenseResponse):
        return Answer(decisions=(answer.best,), scores=tuple(answer.scores))
    if isinstance(answer, EmbedResponse):
        return Answer(vectors=decode_rows(answer.embeddings, answer.encoding_format))
    if isinstance(answer, EmbeddingsResponse):
        rows = [item.embedding for item in answer.data]
        return Answer(vectors=decode_rows(rows, "base64" if rows and isinstance(rows[0], str) else "float"))
    raise TypeError(f"no shadow comparison for {type(answer).__name__}")


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
        async with use_model(self.request, self.services, model, self.key) as runtime:
            answer = await operation(runtime)
        entry = model.entry
        version = entry.shadow_sample()
        if version is not None:
            job = ShadowJob(version, self.endpoint, answer, operation, summarize)
            self.background.add_task(entry.shadows.offer, job)
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
