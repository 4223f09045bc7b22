"""Serving runtime: batching, the embedding cache, the request pipeline, model lifecycle and metrics.

It raises ``clipcore.errors.ClipError`` and never imports the HTTP layer (an import contract).
"""

from service.runtime.batcher import (
    BatcherClosed,
    BatcherError,
    DeadlineExceeded,
    DynamicBatcher,
    QueueFull,
    RequestTooLarge,
    SubmitTimings,
)
from service.runtime.cache import EmbeddingCache, bytes_digest, embedding_key, text_digest
from service.runtime.metrics import ServiceMetrics

__all__ = [
    "BatcherClosed",
    "BatcherError",
    "DeadlineExceeded",
    "DynamicBatcher",
    "EmbeddingCache",
    "QueueFull",
    "RequestTooLarge",
    "ServiceMetrics",
    "SubmitTimings",
    "bytes_digest",
    "embedding_key",
    "text_digest",
]
