"""HTTP request metrics: requests by route and status, latency, requests in flight, and what the
request inputs needed (images decoded here or by a front-end, texts cut to the context length)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from service.runtime.metric_set import LATENCY_BUCKETS, MetricSet

__all__ = ["RequestMetrics"]


class RequestMetrics(MetricSet):
    """The HTTP layer's and the request inputs' metrics."""

    def _register_request_metrics(self) -> None:
        r = self.registry
        self.http_requests_total = Counter(
            "clip_http_requests_total",
            "HTTP requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_request_duration_seconds = Histogram(
            "clip_http_request_duration_seconds",
            "HTTP request latency by route template.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight_requests = Gauge(
            "clip_inflight_requests",
            "HTTP requests being handled right now.",
            registry=r,
        )
        self.images_decoded_total = Counter(
            "clip_images_decoded_total",
            "Images decoded from request payloads.",
            registry=r,
        )
        self.predecoded_images_total = Counter(
            "clip_predecoded_images_total",
            "Images a front-end process decoded (workers > 1) that reached an encode: used (its pixels were "
            "made under the serving version's preprocessing) or stale (decoded again from its bytes).",
            ["outcome"],
            registry=r,
        )
        self.texts_truncated_total = Counter(
            "clip_texts_truncated_total",
            "Texts cut to the model context length.",
            registry=r,
        )

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Record one finished HTTP request; ``route`` is the template, never the raw path."""
        self._child(self.http_requests_total, route, method, str(status)).inc()
        self._child(self.http_request_duration_seconds, route, method).observe(seconds)

    def image_decoded(self, count: int = 1) -> None:
        self.images_decoded_total.inc(count)

    def images_predecoded(self, used: int, stale: int) -> None:
        if used:
            self._child(self.predecoded_images_total, "used").inc(used)
        if stale:
            self._child(self.predecoded_images_total, "stale").inc(stale)

    def texts_truncated(self, count: int = 1) -> None:
        if count > 0:
            self.texts_truncated_total.inc(count)
