"""Batcher and embedding-cache metrics: batch sizes, queue waits and depths, encode times,
refusals and failures per served-set entry and batcher; cache lookups per layer and result."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from service.runtime.metric_set import BATCH_SIZE_BUCKETS, CACHE_LOOKUP_BUCKETS, LATENCY_BUCKETS, MetricSet

__all__ = ["BatchMetrics", "ModelMetrics"]


class BatchMetrics(MetricSet):
    """What the batchers and the embedding cache record."""

    def _register_batch_metrics(self) -> None:
        r = self.registry
        self.batch_size = Histogram(
            "clip_batch_size",
            "Items per batch handed to the model.",
            ["model", "batcher"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_wait_seconds = Histogram(
            "clip_batch_wait_seconds",
            "Time the oldest item of a batch spent queued before it ran.",
            ["model", "batcher"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.encode_seconds = Histogram(
            "clip_encode_seconds",
            "Model run time per batch.",
            ["model", "batcher"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "clip_queue_depth",
            "Items waiting in a batcher queue.",
            ["model", "batcher"],
            registry=r,
        )
        self.batcher_rejected_total = Counter(
            "clip_batcher_rejected_total",
            "Requests a batcher did not serve, by reason (queue_full, closed, deadline, cancelled, over_budget).",
            ["model", "batcher", "reason"],
            registry=r,
        )
        self.batch_failures_total = Counter(
            "clip_batch_failures_total",
            "Batches whose model call raised.",
            ["model", "batcher"],
            registry=r,
        )
        self.cache_requests_total = Counter(
            "clip_cache_requests_total",
            "Embedding cache lookups per key, by layer and result.",
            ["layer", "result"],
            registry=r,
        )
        self.cache_lookup_seconds = Histogram(
            "clip_cache_lookup_seconds",
            "Time of one embedding-cache lookup (all keys of a get_many) per layer: the in-process LRU "
            "pass, and the Redis round trip for the keys the LRU missed.",
            ["layer"],
            buckets=CACHE_LOOKUP_BUCKETS,
            registry=r,
        )

    def observe_batch(self, batcher: str, size: int, wait_s: float, run_s: float, model: str = "") -> None:
        self._child(self.batch_size, model, batcher).observe(size)
        self._child(self.batch_wait_seconds, model, batcher).observe(wait_s)
        self._child(self.encode_seconds, model, batcher).observe(run_s)

    def set_queue_depth(self, batcher: str, depth: int, model: str = "") -> None:
        self._child(self.queue_depth, model, batcher).set(depth)

    def batcher_rejected(self, batcher: str, reason: str, model: str = "") -> None:
        self.batcher_rejected_total.labels(model=model, batcher=batcher, reason=reason).inc()

    def batch_failed(self, batcher: str, model: str = "") -> None:
        self.batch_failures_total.labels(model=model, batcher=batcher).inc()

    def for_model(self, model: str) -> ModelMetrics:
        """The batch recorders with ``model`` (a served-set entry) filled in, for its batchers."""
        return ModelMetrics(self, model)

    def cache_event(self, layer: str, result: str, count: int = 1) -> None:
        """``layer`` is "lru" or "redis"; ``result`` is "hit", "miss" or "error"."""
        if count > 0:
            self._child(self.cache_requests_total, layer, result).inc(count)

    def observe_cache_lookup(self, layer: str, seconds: float) -> None:
        """``layer`` is "lru" or "redis", as in ``clip_cache_requests_total``."""
        self._child(self.cache_lookup_seconds, layer).observe(seconds)


class ModelMetrics:
    """What a batcher records, labelled with the served-set entry its runtime belongs to."""

    def __init__(self, metrics: BatchMetrics, model: str) -> None:
        self.metrics = metrics
        self.model = model

    def observe_batch(self, batcher: str, size: int, wait_s: float, run_s: float) -> None:
        self.metrics.observe_batch(batcher, size, wait_s, run_s, model=self.model)

    def set_queue_depth(self, batcher: str, depth: int) -> None:
        self.metrics.set_queue_depth(batcher, depth, model=self.model)

    def batcher_rejected(self, batcher: str, reason: str) -> None:
        self.metrics.batcher_rejected(batcher, reason, model=self.model)

    def batch_failed(self, batcher: str) -> None:
        self.metrics.batch_failed(batcher, model=self.model)
