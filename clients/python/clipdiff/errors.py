"""Exceptions raised by the client, one class per family of HTTP status.

The server answers every error with ``{"error": {"code", "message", "field"}}``; the client
turns that envelope into a :class:`ClipServiceError` subclass so callers can catch by kind
(``except Overloaded``) instead of comparing status codes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

__all__ = [
    "BadRequest",
    "ClipServiceError",
    "ConnectionFailed",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "Unauthorized",
    "Unavailable",
    "error_from_response",
    "parse_retry_after",
]


class ClipServiceError(Exception):
    """An error answer of the service (or a failure to reach it).

    Attributes:
        status: HTTP status, or ``None`` when no answer was received.
        url: the method and URL that failed (``"POST http://host:8000/rank"``), when known.
        code: machine-readable code from the envelope (``"unknown_image"``, ...).
        message: human-readable explanation.
        field: the request field at fault, when the server names one.
    """

    def __init__(
        self, status: int | None, code: str, message: str, field: str | None = None, url: str | None = None
    ) -> None:
        where = f" {url}" if url else ""
        super().__init__(f"[{status}]{where} {code}: {message}" + (f" (field: {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.url = url


class BadRequest(ClipServiceError):
    """400 bad input or 422 schema violation: fix the request, do not retry."""


class Unauthorized(ClipServiceError):
    """401 / 403: missing or rejected API key."""


class NotFound(ClipServiceError):
    """404: unknown model, version or endpoint."""


class PayloadTooLarge(ClipServiceError):
    """413: body, image or batch over the server's limits."""


class Overloaded(ClipServiceError):
    """429: the server's queue is full; ``retry_after`` is its hint in seconds."""

    def __init__(
        self,
        status: int | None,
        code: str,
        message: str,
        field: str | None = None,
        url: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, message, field, url)
        self.retry_after = retry_after


class Unavailable(ClipServiceError):
    """503 / 504: not ready (model loading) or timed out upstream."""


class ConnectionFailed(Unavailable):
    """No HTTP answer at all (refused, connect timeout) after every retry."""


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _envelope(body: bytes) -> tuple[str | None, str | None, str | None]:
    """(code, message, field) from the error envelope; tolerant of foreign error bodies."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, body.decode("utf-8", "replace")[:500] or None, None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        field = err.get("field")
        return err.get("code"), err.get("message"), None if field is None else str(field)
    # A proxy or framework default body ({"detail": ...}) still deserves a readable message.
    if isinstance(data, dict) and "detail" in data:
        return None, json.dumps(data["detail"])[:500], None
    return None, json.dumps(data)[:500], None


_DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    413: "payload_too_large",
    422: "validation_error",
    429: "overloaded",
    503: "unavailable",
    504: "timeout",
}


def error_from_response(status: int, body: bytes, headers: Any, url: str | None = None) -> ClipServiceError:
    """Build the exception matching ``status`` from a response's body and headers (``url``: the
    method and URL of the request, named in the message)."""
    code, message, field = _envelope(body)
    if status == 404 and code is None:  # no error envelope: the path itself is unknown to the server
        message = (
            "the server has no such endpoint; check the client's base_url (the service's root, without a path) "
            "and that the server runs a version with this endpoint"
        )
    code = code or _DEFAULT_CODES.get(status, f"http_{status}")
    message = message or f"HTTP {status}"
    if status in (400, 422):
        return BadRequest(status, code, message, field, url)
    if status in (401, 403):
        return Unauthorized(status, code, message, field, url)
    if status == 404:
        return NotFound(status, code, message, field, url)
    if status == 413:
        return PayloadTooLarge(status, code, message, field, url)
    if status == 429:
        retry_after = parse_retry_after(headers.get("retry-after"))
        return Overloaded(status, code, message, field, url, retry_after=retry_after)
    if status in (503, 504):
        return Unavailable(status, code, message, field, url)
    return ClipServiceError(status, code, message, field, url)
