"""The one closed set of API errors and the handlers that render them.

Every non-2xx answer has the body ``{"error": {"code", "message", "field"}}``, whatever raised
it: a ``ClipError`` (from anywhere below: its code gives the status), an ``ApiError`` of the
HTTP layer, FastAPI's request validation, Starlette's routing (404/405), the body
size guard, or an unexpected exception (500, traceback logged, never details to the client).

Decisions clients can rely on:

* Schema violations (wrong types, missing or extra fields, out-of-range numbers) and malformed
  JSON bodies are 422 ``validation_error``; ``field`` is the dotted path (``images.0.data``),
  ``null`` for a body that is not JSON at all.
* Semantically bad input the request models let through (empty lists, blank texts, duplicate
  labels, a template without exactly one ``{}``, undecodable base64 or images) is 400, also
  where the OpenAPI schema states the rule (minItems, uniqueItems, a pattern).
* Going over a configured limit (body bytes, image bytes or pixels, number of images, labels,
  texts, pairs, text length) is 413 ``payload_too_large``.
* A request the serving model version cannot answer because it lacks a component (dense
  scoring without a DCSM scorer) is 404 ``unknown_component``: retrying will not help until a
  version with that component serves.
* A method the serving model's family cannot run (per-token text features of a CustomTextCLIP
  such as SigLIP or MobileCLIP) is 400 ``unsupported_for_family``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from service.api.security import SECURITY_HEADERS

__all__ = ["STATUS", "ApiError", "ClipError", "ErrorCode", "bad_input", "error_response", "too_large"]

log = logging.getLogger("service.errors")


STATUS: dict[ErrorCode, int] = {
    ErrorCode.bad_input: 400,
    ErrorCode.bad_image: 400,
    ErrorCode.urls_disabled: 400,
    ErrorCode.url_forbidden: 400,
    ErrorCode.unauthorized: 401,
    ErrorCode.forbidden: 403,
    ErrorCode.not_found: 404,
    ErrorCode.unknown_model: 404,
    ErrorCode.unknown_image: 404,
    ErrorCode.unknown_component: 404,
    ErrorCode.unknown_collection: 404,
    ErrorCode.collection_exists: 409,  # a collection of that name exists
    ErrorCode.version_mismatch: 409,  # a collection's version is no longer the one its model serves
    # A method the serving model's family cannot run (per-token text features of a CustomTextCLIP):
    # the request cannot succeed on this model, whatever is retried.
    ErrorCode.unsupported_for_family: 400,
    ErrorCode.method_not_allowed: 405,
    ErrorCode.payload_too_large: 413,
    ErrorCode.validation_error: 422,
    ErrorCode.overloaded: 429,
    ErrorCode.internal_error: 500,
    ErrorCode.bad_gateway: 502,  # a configured image URL could not be fetched
    ErrorCode.not_ready: 503,
    ErrorCode.timeout: 504,
}


class ApiError(ClipError):
    """A ``ClipError`` raised by the HTTP layer itself, with extra response headers (an auth
    challenge)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(code, message, field, retry_after=retry_after)
        self.headers = headers or {}


def retry_after_header(seconds: float) -> str:
    """Retry-After in whole seconds, at least 1 (clients sleep that long)."""
    return str(max(1, math.ceil(seconds)))


def headers_for(exc: ClipError) -> dict[str, str]:
    headers = dict(getattr(exc, "headers", {}) or {})
    if exc.retry_after is not None:
        headers.setdefault("Retry-After", retry_after_header(exc.retry_after))
    return headers


def error_body(code: ErrorCode | str, message: str, field: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "code": str(getattr(code, "value", code)),
            "message": utf8_safe(message),
            "field": None if field is None else utf8_safe(field),
        }
    }


def utf8_safe(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry escaped: a field path can hold a client's own
    key, and an unpaired surrogate there (JSON allows ``"\\ud800"``) made the error itself a 500."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    code: ErrorCode, message: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message, field), status_code=STATUS[code], headers=headers)


def dotted(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """``("body", "images", 0, "data")`` -> ``"images.0.data"``; the ``body`` prefix is implied."""
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or None


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ClipError)
    return error_response(exc.code, exc.message, exc.field, headers_for(exc))


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return error_response(
            ErrorCode.validation_error, f"request body is not valid JSON: {first.get('msg', '')}", None
        )
    field = dotted(first.get("loc", ()))
    message = str(first.get("msg", "invalid request"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return error_response(ErrorCode.validation_error, message, field)


_HTTP_CODES = {
    400: ErrorCode.bad_input,
    401: ErrorCode.unauthorized,
    403: ErrorCode.forbidden,
    404: ErrorCode.not_found,
    405: ErrorCode.method_not_allowed,
    413: ErrorCode.payload_too_large,
    422: ErrorCode.validation_error,
    429: ErrorCode.overloaded,
    503: ErrorCode.not_ready,
    504: ErrorCode.timeout,
}


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")

# FastAPI's words for a body its JSON parser gave up on (e.g. nested deeper than Python's recursion
# limit): a malformed body, which the API answers 422 like any other invalid JSON.
_UNPARSABLE_BODY = "There was an error parsing the body"


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette raises these for unknown routes and methods; FastAPI for unreadable bodies.
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _UNPARSABLE_BODY:
        return error_response(ErrorCode.validation_error, "request body is not valid JSON (or nested too deeply)")
    code = _HTTP_CODES.get(exc.status_code, ErrorCode.internal_error)
    message = exc.detail if isinstance(exc.detail, str) else code.value.replace("_", " ")
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404 and message == "Not Found":  # Starlette's words for a path no route has
        message = f"no endpoint {where}; the API's endpoints are listed at /docs and /openapi.json"
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and message == "Method Not Allowed":
        allowed = _allowed_methods(request) or headers.get("allow") or headers.get("Allow")
        if allowed:
            headers = {k: v for k, v in headers.items() if k.lower() != "allow"} | {"Allow": allowed}
        message = f"{where} is not allowed" + (f"; this path takes {allowed}" if allowed else "")
    response = error_response(code, message, None, headers)
    if exc.status_code not in _HTTP_CODES:
        response.status_code = exc.status_code
    return response


def _allowed_methods(request: Request) -> str:
    """Every method some route takes on this path: Starlette's Allow names only the first
    route's (a path served by several routes, one per method, would list one)."""
    routes = getattr(request.app, "routes", [])
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]
    return ", ".join(allowed)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    # Starlette sends this answer from outside every middleware: it brings its security headers itself.
    return error_response(ErrorCode.internal_error, "internal server error", headers=SECURITY_HEADERS)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ClipError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
