"""One closed set of error codes and the error that carries one, with no transport attached.

Everything below the HTTP layer (the runtime, image decoding, the core) raises ``ClipError``;
the API maps each code to its HTTP status and the JSON envelope in one place
(``service/api/errors.py``), as TEI maps its core error types to status codes in its router.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    bad_input = "bad_input"
    bad_image = "bad_image"
    urls_disabled = "urls_disabled"
    url_forbidden = "url_forbidden"
    unauthorized = "unauthorized"
    forbidden = "forbidden"
    not_found = "not_found"
    unknown_model = "unknown_model"
    unknown_image = "unknown_image"
    unknown_component = "unknown_component"
    unknown_collection = "unknown_collection"
    collection_exists = "collection_exists"
    version_mismatch = "version_mismatch"
    unsupported_for_family = "unsupported_for_family"
    method_not_allowed = "method_not_allowed"
    payload_too_large = "payload_too_large"
    validation_error = "validation_error"
    overloaded = "overloaded"
    internal_error = "internal_error"
    bad_gateway = "bad_gateway"
    not_ready = "not_ready"
    timeout = "timeout"


class ClipError(Exception):
    """A failure a caller can act on: its ``code``, a message, the input ``field`` it concerns
    (dotted path, if one) and, for temporary failures, when to retry (seconds)."""

    def __init__(self, code: ErrorCode, message: str, field: str | None = None, *, retry_after: float | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


def bad_input(message: str, field: str | None = None) -> ClipError:
    return ClipError(ErrorCode.bad_input, message, field)


def too_large(message: str, field: str | None = None) -> ClipError:
    return ClipError(ErrorCode.payload_too_large, message, field)
