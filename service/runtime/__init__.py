"""Serving runtime: batching, the embedding cache, the request pipeline, model lifecycle and metrics.

Model lifecycle (docs/design.md, section 6): ``served`` (the served set and its memory budget,
``budget``), per entry ``lifecycle.ModelManager`` with its role table (``roles``), version loader
(``loader``), reconciler (``reconciler``, failures through ``policy``) and drain (``drain``);
``model_runtime.ModelRuntime`` is one loaded version, built by ``assembly``.

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
