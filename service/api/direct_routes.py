"""The engine's short way to the answering routes, for the requests a front-end pre-decoded.

On the engine (``workers`` > 1) one Python thread does everything but the towers, and FastAPI's
own share of an ``/embed`` answer (the router's match, the exception and exit-stack layers,
dependency solving, the endpoint's context, the response model's validation) was about a third of
it (docs/benchmarks.md, "The engine's share"). For a request ``EngineGate`` unpacked (pixels in
``PREDECODED``) to a route of ``DIRECT_PATHS`` with no query string, this innermost middleware
calls the route's own endpoint function itself: the same request model parsed as FastAPI parses
it, the same ``answering`` dependency (model resolution, canary key, shadow), the same response
bytes. Every middleware around it (security headers, metrics and access log, admission, keys, the
body cap) still runs once, as for any request. Whatever this path would answer differently is left
to FastAPI: a body that does not parse or validate goes down the usual path unchanged (its 422 is
FastAPI's), and a ``ClipError`` is answered by the application's own handler for it. A single
process never sets ``PREDECODED``, so it never takes this path.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

import pydantic
from fastapi import BackgroundTasks, Request
from fastapi.datastructures import DefaultPlaceholder
from fastapi.exceptions import ResponseValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.answering import answering
from service.api.errors import ClipError, error_response, headers_for
from service.api.json_body import parse_json
from service.asgi_body import is_json, read_body, replayed
from service.runtime.canary import CANARY_KEY_HEADER
from service.split.wire import PREDECODED

__all__ = ["DIRECT_PATHS", "DirectRoutesMiddleware"]

# The routes whose bodies front-ends pre-decode (service.split.predecode.IMAGE_ROUTES).
DIRECT_PATHS = frozenset(("/embed", "/classify", "/rank", "/rank-pair", "/score/dense"))
# The parameters an endpoint of this path may have: its body, the answering dependency, the request,
# and query parameters with defaults (taken only for a request without a query string).
_BODY, _ANSWER, _REQUEST = "req", "answer", "request"
_CANARY = CANARY_KEY_HEADER.lower().encode("latin-1")


@dataclass(frozen=True)
class DirectRoute:
    route: APIRoute
    body_model: type[pydantic.BaseModel]
    endpoint: Callable[..., Awaitable[Any]]
    takes_request: bool


def direct_route(route: BaseRoute) -> DirectRoute | None:
    """The route as this path calls it, or None for one whose endpoint takes more than it supplies."""
    if not isinstance(route, APIRoute) or route.path not in DIRECT_PATHS or "POST" not in (route.methods or ()):
        return None
    parameters = inspect.signature(route.endpoint).parameters
    body_model = get_type_hints(route.endpoint).get(_BODY)
    extra = [p for name, p in parameters.items() if name not in (_BODY, _ANSWER, _REQUEST)]
    if (
        _BODY not in parameters
        or _ANSWER not in parameters
        or not (isinstance(body_model, type) and issubclass(body_model, pydantic.BaseModel))
        or any(p.default is inspect.Parameter.empty for p in extra)
        or route.dependencies  # none today: FastAPI would solve them, this path does not
        or route.response_field is None
        or not isinstance(route.response_class, DefaultPlaceholder)  # FastAPI's own JSON answer
    ):
        return None
    return DirectRoute(route, body_model, route.endpoint, _REQUEST in parameters)


class DirectRoutesMiddleware:
    """See the module docstring. ``routes``: the routes of the API's routers (included without a
    prefix, so a route's path is the request's)."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        found = (direct_route(route) for route in routes)
        self.direct = {d.route.path: d for d in found if d is not None}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = (
            self.direct.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope["query_string"]
            else None
        )
        if direct is None or PREDECODED.get() is None or not is_json(scope):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        try:
            req = direct.body_model.model_validate(parse_json(body), from_attributes=True)
        except (ValueError, RecursionError):  # pydantic's ValidationError is a ValueError
            await self.app(scope, replayed(body, receive), send)  # FastAPI says what is wrong
            return
        await self._answer(direct, req, scope, receive, send)

    async def _answer(
        self, direct: DirectRoute, req: pydantic.BaseModel, scope: Scope, receive: Receive, send: Send
    ) -> None:
        scope["route"] = direct.route  # for the metrics and the access log, as the router sets it
        request = Request(scope, receive)
        background = BackgroundTasks()
        canary = next((v.decode("latin-1") for k, v in scope["headers"] if k == _CANARY), None)
        arguments: dict[str, Any] = {_BODY: req, _ANSWER: await answering(request, background, canary)}
        if direct.takes_request:
            arguments[_REQUEST] = request
        try:
            answer = await direct.endpoint(**arguments)
        except ClipError as exc:  # as the application's handler for it answers (service.api.errors)
            await error_response(exc.code, exc.message, exc.field, headers_for(exc))(scope, receive, send)
            return
        route = direct.route
        field = route.response_field
        assert field is not None
        # FastAPI's own serialisation of the answer; its validation only where the endpoint did not
        # return the response model itself (the operations build it: nothing to check again).
        if type(answer) is not route.response_model:
            answer, errors = field.validate(answer, {}, loc=("response",))
            if errors:
                raise ResponseValidationError(errors=errors, body=answer)
        content = field.serialize_json(
            answer,
            include=route.response_model_include,
            exclude=route.response_model_exclude,
            by_alias=route.response_model_by_alias,
            exclude_none=route.response_model_exclude_none,
            exclude_unset=route.response_model_exclude_unset,
            exclude_defaults=route.response_model_exclude_defaults,
        )
        # The shadow's run (``background``) comes after the answer is sent, as FastAPI runs it.
        response = Response(content, route.status_code or 200, media_type="application/json", background=background)
        await response(scope, receive, send)
