"""Model-operations metrics: the serving versions and their loads, swaps, unloads, failures and
quarantine, the auto backend decisions and re-timings, the store watch, and the canary and shadow
versions (their answers, split weights, side loads and agreement with the primary)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from service.runtime.metric_set import CORRELATION_BUCKETS, COSINE_BUCKETS, LATENCY_BUCKETS, M, MetricSet

__all__ = ["ModelOperationsMetrics"]


class ModelOperationsMetrics(MetricSet):
    """What model loading, hot swaps, auto backends, canaries and shadows record."""

    def _register_model_operations_metrics(self) -> None:
        r = self.registry
        self.model_info = Gauge(
            "clip_model_info",
            "1 for each serving model version and text encoder; `model` is the served-set entry (CLIP_MODEL).",
            ["model", "name", "version", "encoder"],
            registry=r,
        )
        self.model_swaps_total = Counter(
            "clip_model_swaps_total",
            "Model version swaps by result (ok, refused, retrying).",
            ["model", "result"],
            registry=r,
        )
        self.backend_auto_decisions_total = Counter(
            "clip_backend_auto_decisions_total",
            "precision=auto / backend=auto decisions by outcome: chosen (measured and kept), remembered (read back), "
            "deferred (the rounds' noise could not settle it: the reference serves, measured again while idle or at "
            "the next load), "
            "shared (read from the model store, where `clip-train tune` measured it for this CPU kind).",
            ["outcome"],
            registry=r,
        )
        self.backend_auto_margin = Gauge(
            "clip_backend_auto_margin_ratio",
            "The serving auto candidate's speed over the reference (median of per-round ratios; 1 for the reference).",
            registry=r,
        )
        self.backend_auto_spread = Gauge(
            "clip_backend_auto_spread_ratio",
            "The spread of the per-round ratios behind the last auto decision (the noise its margin had to beat).",
            registry=r,
        )
        self.backend_auto_retimes_total = Counter(
            "clip_backend_auto_retimes_total",
            "Background re-timings of an auto decision while the server was idle, by result: chosen / remembered / "
            "shared (a winner swapped in), deferred (still unclear), unshared (no shared decision in the store yet), "
            "interrupted (a request arrived: not counted as an attempt), failed, superseded (another version serves).",
            ["model", "result"],
            registry=r,
        )
        self.store_watch_ok = Gauge(
            "clip_store_watch_ok",
            "1 while the serving alias can be read from the model store (hot swaps work), 0 when not.",
            ["model"],
            registry=r,
        )
        self.model_loads_total = Counter(
            "clip_model_loads_total",
            "Models of the served set loaded (at start, or on a request while over the memory budget); hot swaps "
            "are counted by clip_model_swaps_total.",
            ["model"],
            registry=r,
        )
        self.model_unloads_total = Counter(
            "clip_model_unloads_total",
            "Idle models unloaded to make room under max_loaded_models.",
            ["model"],
            registry=r,
        )
        self.model_load_failures_total = Counter(
            "clip_model_load_failures_total",
            "Loads of a model of the served set (at start, or on a request under max_loaded_models) that failed, by "
            "reason (checksum, manifest, gate, not_found, unreadable, memory, other); failed hot swaps are counted by "
            "clip_model_swaps_total.",
            ["model", "reason"],
            registry=r,
        )
        self.model_quarantined = Gauge(
            "clip_model_quarantined",
            "1 while a model loaded on request is quarantined (its last load failed: requests for it get 503 without "
            "a load until its backoff ends, or, for a refused version, until its alias names another one), else 0.",
            ["model"],
            registry=r,
        )
        self.model_loads_skipped_total = Counter(
            "clip_model_loads_skipped_total",
            "Requests for a model that is not loaded answered 503 without a load, by reason: quarantined (its last "
            "load failed) or rate_limited (max_loads_per_minute loads were started on request in the last minute).",
            ["model", "reason"],
            registry=r,
        )
        # Canary and shadow: every series below is labelled by the served-set entry (`model`, as on
        # every other series: `default@production`) and the version, and removed when that version
        # is no longer loaded (forget_version), so series do not pile up over months of releases.
        self.version_requests_total = Counter(
            "clip_version_requests_total",
            "HTTP requests answered by a model version, by its role here (primary or canary) and status code; `model` "
            "is the served-set entry (CLIP_MODEL), `version` the version that answered.",
            ["model", "version", "role", "status"],
            registry=r,
        )
        self.version_request_duration_seconds = Histogram(
            "clip_version_request_duration_seconds",
            "Latency of the HTTP requests a model version answered, by its role here.",
            ["model", "version", "role"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.canary_weight = Gauge(
            "clip_canary_weight_ratio",
            "Share (0-1) of the callers this server routes to its loaded canary version (absent: no canary).",
            ["model", "version"],
            registry=r,
        )
        self.shadow_fraction = Gauge(
            "clip_shadow_sample_ratio",
            "Fraction of the requests this server samples for its loaded shadow version (absent: no shadow).",
            ["model", "version"],
            registry=r,
        )
        self.side_loads_total = Counter(
            "clip_side_loads_total",
            "Loads of a canary or shadow version beside the primary, by result (ok, refused, retrying; over_budget: "
            "refused by max_loaded_models or max_loaded_bytes; width: a shadow whose embeddings are not as wide as "
            "the primary's); `model` is the served-set entry (CLIP_MODEL).",
            ["model", "role", "result"],
            registry=r,
        )
        self.shadow_requests_total = Counter(
            "clip_shadow_requests_total",
            "Requests sampled for the shadow version, by outcome: compared, dropped (queue_full, busy, gone) or "
            "failed.",
            ["model", "version", "endpoint", "outcome"],
            registry=r,
        )
        self.shadow_agreement_total = Counter(
            "clip_shadow_agreement_total",
            "Decisions of the shadow compared with the primary's (/classify: top-1 label per image; /rank-pair: "
            "the decision per pair; /rank: the top image; /score/dense: the best caption), by result.",
            ["model", "version", "endpoint", "result"],
            registry=r,
        )
        self.shadow_cosine = Histogram(
            "clip_shadow_cosine",
            "Mean cosine between the primary's and the shadow's embeddings, one observation per compared request.",
            ["model", "version", "endpoint"],
            buckets=COSINE_BUCKETS,
            registry=r,
        )
        self.shadow_score_correlation = Histogram(
            "clip_shadow_score_correlation",
            "Pearson correlation of the primary's and the shadow's scores over the texts of one request.",
            ["model", "version", "endpoint"],
            buckets=CORRELATION_BUCKETS,
            registry=r,
        )
        self.collection_job_images_total = Counter(
            "clip_collection_job_images_total",
            "Images embedded by collection jobs, by kind (reembed: a collection moved to its model's new version; "
            "import: a server-side dataset added); the running job's done/total is in GET /collections/{name}.",
            ["kind"],
            registry=r,
        )
        self.collection_jobs_total = Counter(
            "clip_collection_jobs_total",
            "Collection jobs that ended, by kind and result (done, failed).",
            ["kind", "result"],
            registry=r,
        )
        # Label sets currently exported by clip_model_info, per served-set entry, so a swap can remove them.
        self._model_labels: dict[str, list[tuple[str, str, str, str]]] = {}
        # Series of the version-labelled metrics above, per (model, version), for forget_version.
        self._version_series: dict[tuple[str, str], set[tuple[MetricWrapperBase, tuple[str, ...]]]] = {}

    def collection_job_images(self, kind: str, n: int) -> None:
        self._child(self.collection_job_images_total, kind).inc(n)

    def collection_job_ended(self, kind: str, result: str) -> None:
        self._child(self.collection_jobs_total, kind, result).inc()

    def set_serving_model(self, name: str, version: str, encoders: Iterable[str], model: str | None = None) -> None:
        """Export ``name@version`` as what entry ``model`` (default: ``name``) serves; what that
        entry exported before is removed."""
        model = name if model is None else model
        self.clear_model(model)
        labels = [(model, name, version, enc) for enc in encoders]
        for lbl in labels:
            self.model_info.labels(*lbl).set(1)
        self._model_labels[model] = labels

    def clear_model(self, model: str) -> None:
        for lbl in self._model_labels.pop(model, []):
            try:
                self.model_info.remove(*lbl)
            except KeyError:  # already removed by a caller using the raw gauge
                pass

    def set_store_watch(self, ok: bool, model: str = "") -> None:
        self.store_watch_ok.labels(model=model).set(1 if ok else 0)

    def backend_auto(self, outcome: str, margin: float | None, spread: float | None) -> None:
        self.backend_auto_decisions_total.labels(outcome=outcome).inc()
        # A deferred decision serves the reference: its margin is 1, whatever the unclear candidate showed.
        self.backend_auto_margin.set(1.0 if outcome == "deferred" or margin is None else margin)
        if spread is not None:
            self.backend_auto_spread.set(spread)

    def auto_retime(self, result: str, model: str = "") -> None:
        self.backend_auto_retimes_total.labels(model=model, result=result).inc()

    def model_swap(self, result: str, model: str = "") -> None:
        self.model_swaps_total.labels(model=model, result=result).inc()

    def model_loaded(self, model: str) -> None:
        self.model_loads_total.labels(model=model).inc()

    def model_unloaded(self, model: str) -> None:
        self.model_unloads_total.labels(model=model).inc()

    def model_load_failed(self, model: str, reason: str) -> None:
        self.model_load_failures_total.labels(model=model, reason=reason).inc()

    def set_quarantined(self, quarantined: bool, model: str) -> None:
        self.model_quarantined.labels(model=model).set(1 if quarantined else 0)

    def model_load_skipped(self, model: str, reason: str) -> None:
        self.model_loads_skipped_total.labels(model=model, reason=reason).inc()

    def _versioned(self, metric: M, model: str, version: str, *rest: str) -> M:
        labels = (model, version, *rest)
        child = self._children.get((metric, labels))
        if child is None:  # a new series: remembered for forget_version
            self._version_series.setdefault((model, version), set()).add((metric, labels))
            child = self._child(metric, *labels)
        return child  # type: ignore[return-value]

    def observe_answer(self, model: str, ref: str, role: str, status: int, seconds: float) -> None:
        """One HTTP request answered for the served-set entry ``model`` by the version ``ref``
        (``name@version``) in ``role``."""
        version = ref.rpartition("@")[2]
        self._versioned(self.version_requests_total, model, version, role, str(status)).inc()
        self._versioned(self.version_request_duration_seconds, model, version, role).observe(seconds)

    def set_split(
        self, model: str, version: str, *, weight: float | None = None, fraction: float | None = None
    ) -> None:
        """Export the canary ``weight`` (percent, exported as a 0-1 ratio) or shadow ``fraction`` this
        server applies to ``version``."""
        if weight is not None:
            self._versioned(self.canary_weight, model, version).set(weight / 100)
        if fraction is not None:
            self._versioned(self.shadow_fraction, model, version).set(fraction)

    def clear_split(self, model: str, version: str) -> None:
        """``version`` is no longer a canary or shadow here (it may still be loaded, e.g. promoted)."""
        series = self._version_series.get((model, version), set())
        for gauge in (self.canary_weight, self.shadow_fraction):
            if (gauge, (model, version)) in series:
                series.discard((gauge, (model, version)))
                self._forget_child(gauge, (model, version))
                gauge.remove(model, version)

    def side_load(self, role: str, result: str, model: str = "") -> None:
        self.side_loads_total.labels(model=model, role=role, result=result).inc()

    def shadow_request(self, model: str, version: str, endpoint: str, outcome: str) -> None:
        self._versioned(self.shadow_requests_total, model, version, endpoint, outcome).inc()

    def shadow_compared(
        self,
        model: str,
        version: str,
        endpoint: str,
        *,
        agree: int,
        disagree: int,
        cosine: float | None,
        correlation: float | None,
    ) -> None:
        """What one compared request showed: decisions that agreed and did not, and the mean cosine
        of its embeddings or the correlation of its scores (when the endpoint has them)."""
        self.shadow_request(model, version, endpoint, "compared")
        for result, count in (("agree", agree), ("disagree", disagree)):
            if count:
                self._versioned(self.shadow_agreement_total, model, version, endpoint, result).inc(count)
        if cosine is not None:
            self._versioned(self.shadow_cosine, model, version, endpoint).observe(cosine)
        if correlation is not None:
            self._versioned(self.shadow_score_correlation, model, version, endpoint).observe(correlation)

    def forget_version(self, model: str, version: str) -> None:
        """Remove every version-labelled series of ``model@version`` (it is no longer loaded)."""
        for metric, labels in self._version_series.pop((model, version), set()):
            self._forget_child(metric, labels)
            try:
                metric.remove(*labels)
            except KeyError:
                pass
