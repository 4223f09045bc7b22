"""ASGI middleware: API keys (401/403), request body cap (413), metrics and one access-log line,
and the security headers of every answer.

All are plain ASGI (not ``BaseHTTPMiddleware``) so bodies stream through untouched and the
cap counts bytes as they arrive, whatever Content-Length claims. Authentication runs before
the body is read or parsed: an unauthenticated client cannot make the server parse anything.
"""

from __future__ import annotations

import json
import logging
import time

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import ApiError, ErrorCode, error_response
from service.api.security import HTML_POLICY, SECURITY_HEADERS
from service.auth import ApiKeyAuth, is_public
from service.runtime.metrics import ServiceMetrics
from service.runtime.pipeline import REQUEST_STAGES, RequestStages

access_log = logging.getLogger("service.access")

# The security headers as ASGI header pairs, made once rather than per answer.
_SECURITY_RAW: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in SECURITY_HEADERS.items()
)


def request_header(scope: Scope, name: bytes) -> bytes | None:
    """The last value of header ``name`` (lower case) of an ASGI request, or None (as a dict of
    the headers would say, without building one per request)."""
    found = None
    for key, value in scope.get("headers") or ():
        if key == name:
            found = value
    return found


class BodyTooLarge(HTTPException):
    """Raised from ``receive``; an HTTPException so FastAPI's body reader re-raises it as is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than {limit} bytes")


class SecurityHeadersMiddleware:
    """Adds ``SECURITY_HEADERS`` to every answer (``X-Content-Type-Options: nosniff``,
    ``X-Frame-Options: DENY``), and to every HTML page a ``Content-Security-Policy`` (``html_policy``
    unless the page set its own) and ``Referrer-Policy: no-referrer``. A header the application set
    itself is kept."""

    def __init__(self, app: ASGIApp, html_policy: str = HTML_POLICY) -> None:
        self.app = app
        self.html_policy = html_policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                # A copy: a response object may hand the same header list to every request it answers.
                raw = list(message.get("headers", []))
                present = {name.lower() for name, _ in raw}
                # The usual answer (JSON, none of these set by the route) takes the plain path.
                raw.extend(pair for pair in _SECURITY_RAW if pair[0] not in present)
                content_type = next((value for name, value in raw if name.lower() == b"content-type"), b"")
                if content_type.startswith(b"text/html"):
                    headers = MutableHeaders(raw=raw)
                    headers.setdefault("Content-Security-Policy", self.html_policy)
                    headers.setdefault("Referrer-Policy", "no-referrer")
                    raw = headers.raw
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class HeadMiddleware:
    """``HEAD`` on every ``GET`` route: the ``GET`` answer's status and headers without its body, as
    Starlette's own routes do (FastAPI's routes answer 405 to a ``HEAD``). A ``HEAD`` request runs
    the route as a ``GET`` in a copy of the scope (the server's own scope still says ``HEAD``, so it
    sends no body either), and the body the route sends is dropped here; a route without ``GET``
    still answers 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        as_get = {**scope, "method": "GET"}

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        try:
            await self.app(as_get, receive, without_body)
        finally:
            # The route the router found, for the metrics and the access log around this middleware.
            if "route" in as_get:
                scope["route"] = as_get["route"]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = request_header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(
                ErrorCode.payload_too_large,
                f"request body is larger than {self.max_bytes} bytes",
                headers={"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


class AdmissionMiddleware:
    """At most ``limit`` API requests in the process at once (the probes, metrics and pages are not
    counted): past it, 429 ``overloaded`` with ``Retry-After`` at once, before the body is read,
    so a flood of clients costs their connections, not their bodies and decodes (TEI's
    ``--max-concurrent-requests`` does the same)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.held = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        if self.held >= self.limit:
            response = error_response(
                ErrorCode.overloaded,
                f"server is overloaded: {self.held} requests in progress (limits.max_concurrent_requests); retry later",
                headers={"Retry-After": "1"},
            )
            await response(scope, receive, send)
            return
        self.held += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.held -= 1


class AuthMiddleware:
    def __init__(self, app: ASGIApp, auth: ApiKeyAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.auth.enabled and not is_public(scope.get("path", "")):
            header = request_header(scope, b"authorization")
            try:
                self.auth.check(header.decode("latin-1") if header is not None else None)
            except ApiError as exc:
                await error_response(exc.code, exc.message, exc.field, exc.headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ObserveMiddleware:
    """Counts and times every request by route template (and by the model version that answered
    it), names that version in ``X-Model`` and logs one JSON line for it."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        stages = RequestStages()
        token = REQUEST_STAGES.set(stages)

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                model = (scope.get("state") or {}).get("model")
                if stages.batches or model:
                    headers = list(message.get("headers", []))
                    if stages.batches:
                        headers.append((b"x-queue-time", f"{stages.queue_s * 1000:.2f}".encode()))
                        headers.append((b"x-inference-time", f"{stages.inference_s * 1000:.2f}".encode()))
                    if model:  # the version that answered (a canary's callers get the canary's)
                        headers.append((b"x-model", model.encode()))
                    message = {**message, "headers": headers}
            await send(message)

        self.metrics.inflight_requests.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            REQUEST_STAGES.reset(token)
            self.metrics.inflight_requests.dec()
            seconds = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            method = scope.get("method", "")
            self.metrics.observe_request(route, method, status, seconds)
            state = scope.get("state") or {}
            if state.get("model"):
                entry = state.get("entry") or state["model"]
                self.metrics.observe_answer(entry, state["model"], state.get("role", "primary"), status, seconds)
            if access_log.isEnabledFor(logging.INFO):  # the line is made only where it is written
                access_log.info(
                    json.dumps(
                        {
                            "route": route,
                            "method": method,
                            "status": status,
                            "ms": round(seconds * 1000, 2),
                            "model": state.get("model"),
                        }
                    )
                )
