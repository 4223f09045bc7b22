"""Prometheus metrics for one service instance.

Each ``ServiceMetrics`` owns its own ``CollectorRegistry`` rather than the process-global one, so
several apps (and their tests) can live in one process without duplicate-metric errors.
Metric names are part of the operations contract (dashboards, autoscaling on queue time): change
them only together with the deploy files, and list the old name in docs/changelog.md. Every name
follows Prometheus naming: the ``clip_`` prefix, base units in the name (``_seconds``, ``_bytes``,
``_ratio`` for shares and percentages, which are exported as 0-1), ``_total`` on counters and
``_info`` on gauges that are always 1 and carry their information in labels
(tests/unit/runtime/test_metrics.py checks them all).

The metrics are grouped by what records them, one module each: ``request_metrics`` (HTTP requests
and their inputs), ``batch_metrics`` (batchers and the embedding cache) and ``model_ops_metrics``
(loads, swaps, auto backends, canary and shadow versions); ``ServiceMetrics`` combines them, so
every caller records into one object.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service.runtime.batch_metrics import BatchMetrics, ModelMetrics
from service.runtime.metric_set import BATCH_SIZE_BUCKETS, CACHE_LOOKUP_BUCKETS, CORRELATION_BUCKETS, COSINE_BUCKETS
from service.runtime.model_ops_metrics import ModelOperationsMetrics
from service.runtime.request_metrics import RequestMetrics

__all__ = ["BATCH_SIZE_BUCKETS", "CACHE_LOOKUP_BUCKETS", "COSINE_BUCKETS", "CORRELATION_BUCKETS", "ModelMetrics",
           "ServiceMetrics"]  # fmt: skip


class ServiceMetrics(RequestMetrics, BatchMetrics, ModelOperationsMetrics):
    """All metrics of one app; the attributes are plain prometheus_client metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._register_request_metrics()
        self._register_batch_metrics()
        self._register_model_operations_metrics()

    def render(self) -> tuple[bytes, str]:
        """Exposition body and its content type, for the /metrics route."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
