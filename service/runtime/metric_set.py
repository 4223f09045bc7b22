"""The parts every group of service metrics shares: one registry, cached child series, buckets.

Each group (``request_metrics``, ``batch_metrics``, ``model_ops_metrics``) is a ``MetricSet``
whose metrics live in the instance's own registry; ``service.runtime.metrics.ServiceMetrics``
combines them into the one object the rest of the service records into.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["BATCH_SIZE_BUCKETS", "CACHE_LOOKUP_BUCKETS", "COSINE_BUCKETS", "CORRELATION_BUCKETS", "LATENCY_BUCKETS",
           "MetricSet"]  # fmt: skip


M = TypeVar("M", bound=MetricWrapperBase)

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Sub-millisecond resolution matters: LRU hits and tiny-model batches finish in well under 1 ms.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


# An LRU lookup takes microseconds and a loopback Redis MGET a few hundred: the cache needs
# finer buckets than requests, from 50 us to the 50 ms default Redis timeout.
CACHE_LOOKUP_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05,
)  # fmt: skip


# A shadow that is a copy of the primary scores 1.0; a retrained candidate 0.9-0.99; an unrelated
# model anything down to negative: fine steps near 1, coarse ones below.
COSINE_BUCKETS: tuple[float, ...] = (-0.5, 0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)
CORRELATION_BUCKETS: tuple[float, ...] = (-0.5, 0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)


class MetricSet:
    """A registry and the child series recorded into it, shared by the metric groups of one app."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # The child series the request path records into, by (metric, label values): prometheus_client's
        # labels() checks the values and takes a lock on every call, a dozen times per request.
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}

    def _child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)`` (values in the order of its label names), looked up once.
        A series removed from its metric must also leave here (``_forget_child``)."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]

    def _forget_child(self, metric: MetricWrapperBase, labels: tuple[str, ...]) -> None:
        self._children.pop((metric, labels), None)
