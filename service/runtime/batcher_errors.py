"""What a batcher refuses or fails a submit with. Each error says what the HTTP layer answers
(the pipeline maps them: 429 or 503 with Retry-After, 413, 504); ``retry_after`` is the batcher's
estimate of when the queue has room again."""

from __future__ import annotations

__all__ = ["BatcherClosed", "BatcherError", "DeadlineExceeded", "QueueFull", "RequestTooLarge"]


class BatcherError(Exception):
    """Base of the batcher's own errors."""


class QueueFull(BatcherError):
    """The queue cannot take the request now; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BatcherClosed(QueueFull):
    """The batcher is stopping; a QueueFull so a plain 429 handler still covers it (503 is better)."""


class RequestTooLarge(BatcherError, ValueError):
    """More items than the whole queue can ever hold: retrying cannot help (HTTP 413)."""


class DeadlineExceeded(BatcherError):
    """The request's deadline passed before all its items ran."""
