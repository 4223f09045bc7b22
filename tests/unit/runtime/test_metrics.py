"""ServiceMetrics: every contract metric is exported under Prometheus naming, registries are per instance."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from service.runtime import ServiceMetrics

REPO = Path(__file__).resolve().parents[3]

# Every metric the service exports (the operations contract: dashboards, alerts, the HPA).
NAMES = [
    "clip_http_requests_total",
    "clip_http_request_duration_seconds",
    "clip_inflight_requests",
    "clip_batch_size",
    "clip_batch_wait_seconds",
    "clip_encode_seconds",
    "clip_queue_depth",
    "clip_batcher_rejected_total",
    "clip_batch_failures_total",
    "clip_cache_requests_total",
    "clip_cache_lookup_seconds",
    "clip_model_info",
    "clip_model_swaps_total",
    "clip_backend_auto_decisions_total",
    "clip_backend_auto_margin_ratio",
    "clip_backend_auto_spread_ratio",
    "clip_backend_auto_retimes_total",
    "clip_store_watch_ok",
    "clip_model_loads_total",
    "clip_model_unloads_total",
    "clip_model_load_failures_total",
    "clip_model_quarantined",
    "clip_model_loads_skipped_total",
    "clip_images_decoded_total",
    "clip_predecoded_images_total",
    "clip_texts_truncated_total",
    "clip_version_requests_total",
    "clip_version_request_duration_seconds",
    "clip_canary_weight_ratio",
    "clip_shadow_sample_ratio",
    "clip_side_loads_total",
    "clip_shadow_requests_total",
    "clip_shadow_agreement_total",
    "clip_shadow_cosine",
    "clip_shadow_score_correlation",
    "clip_collection_job_images_total",
    "clip_collection_jobs_total",
]

# Prometheus naming (https://prometheus.io/docs/practices/naming/): one application prefix, base
# units spelt out at the end of the name, `_total` on counters (after the unit), `_info` on
# gauges that are always 1 and carry their information in labels.
PREFIX = "clip_"
NAME_RE = re.compile(r"^clip_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
BASE_UNIT_SUFFIXES = ("_seconds", "_bytes", "_ratio", "_info")
# Units that are not base units: durations go in seconds, sizes in bytes, shares and percentages
# as a 0-1 ratio.
NOT_BASE_UNITS = {
    "ms", "millis", "milliseconds", "us", "micros", "microseconds", "ns", "nanoseconds", "minutes",
    "hours", "days", "kb", "mb", "gb", "kib", "mib", "gib", "kilobytes", "megabytes", "gigabytes",
    "bits", "percent", "pct", "percentage",
}  # fmt: skip
# A word in the name that says it measures time: the name must end in `_seconds`.
TIME_WORDS = {"duration", "latency", "time", "wait", "elapsed", "delay", "age", "timeout", "lookup", "uptime"}
# A word that says it measures a size in memory or on the wire: the name must end in `_bytes`.
BYTE_WORDS = {"memory", "payload", "rss", "bytes"}
# Gauges and histograms without a base unit, each with what it measures; a new one must be added
# here on purpose (counters count events and need no entry).
DIMENSIONLESS = {
    "clip_inflight_requests": "a count of requests",
    "clip_batch_size": "items per batch",
    "clip_queue_depth": "a count of queued items",
    "clip_store_watch_ok": "a 0/1 state",
    "clip_model_quarantined": "a 0/1 state",
    "clip_shadow_cosine": "a cosine similarity",
    "clip_shadow_score_correlation": "a Pearson correlation",
}
RESERVED_SUFFIXES = ("_count", "_sum", "_bucket", "_created", "_gcount", "_gsum")


def exported() -> dict[str, str]:
    """Name -> type of every metric family a fresh ServiceMetrics exports, as a scrape sees it."""
    names = {}
    for family in ServiceMetrics().registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        names[name] = family.type
    return names


def naming_problems(name: str, kind: str) -> list[str]:
    """What is wrong with ``name`` (a metric of type ``kind``) under the rule above; empty when nothing."""
    problems = []
    if not name.startswith(PREFIX) or not NAME_RE.match(name):
        problems.append(f"not snake_case under the {PREFIX!r} prefix")
    if kind == "counter" and not name.endswith("_total"):
        problems.append("a counter without `_total`")
    if kind != "counter" and name.endswith("_total"):
        problems.append(f"`_total` on a {kind}")
    if name.endswith(RESERVED_SUFFIXES):
        problems.append("ends in a suffix Prometheus reserves for histogram and summary series")
    base = name.removesuffix("_total")
    words = set(base.removeprefix(PREFIX).split("_"))
    if bad := sorted(words & NOT_BASE_UNITS):
        problems.append(f"not in base units ({', '.join(bad)})")
    if words & TIME_WORDS and not base.endswith("_seconds"):
        problems.append("measures time but does not end in `_seconds`")
    if words & BYTE_WORDS and not base.endswith("_bytes"):
        problems.append("measures a size but does not end in `_bytes`")
    if base.endswith("_info") and kind not in ("gauge", "info"):
        problems.append(f"`_info` on a {kind}")
    has_unit = base.endswith(BASE_UNIT_SUFFIXES) or name in DIMENSIONLESS
    if kind in ("gauge", "histogram", "summary") and not has_unit:
        problems.append("no unit suffix (`_seconds`, `_bytes`, `_ratio`, `_info`) and not listed as dimensionless")
    return problems


def test_every_contract_metric_is_exported_and_nothing_else() -> None:
    assert sorted(exported()) == sorted(NAMES)


@pytest.mark.parametrize(("name", "kind"), sorted(exported().items()))
def test_every_exported_metric_follows_prometheus_naming(name: str, kind: str) -> None:
    assert naming_problems(name, kind) == []


@pytest.mark.parametrize(
    ("name", "kind", "problem"),
    [
        ("batch_size", "histogram", "prefix"),
        ("clip_requests", "counter", "without `_total`"),
        ("clip_queue_total", "gauge", "`_total` on a gauge"),
        ("clip_encode_ms", "histogram", "base units"),
        ("clip_request_latency", "histogram", "`_seconds`"),
        ("clip_canary_weight_percent", "gauge", "base units"),
        ("clip_payload_size", "histogram", "`_bytes`"),
        ("clip_new_thing", "gauge", "dimensionless"),
        ("clip_build_info", "counter", "`_info` on a counter"),
    ],
)
def test_the_naming_rule_catches_what_it_is_for(name: str, kind: str, problem: str) -> None:
    assert any(problem in p for p in naming_problems(name, kind)), naming_problems(name, kind)


def test_operations_doc_and_changelog_list_every_metric() -> None:
    operations = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    changelog = (REPO / "docs" / "changelog.md").read_text(encoding="utf-8")
    for name in NAMES:
        assert f"| `{name}` |" in operations, f"{name} has no row in docs/operations.md's metrics table"
        assert f"`{name}`" in changelog, f"{name} is not in docs/changelog.md's list of renamed metrics"


def test_render_names_every_metric() -> None:
    body, content_type = ServiceMetrics().render()
    assert content_type == CONTENT_TYPE_LATEST
    text = body.decode()
    for name in NAMES:
        assert f"# TYPE {name} " in text, name


def test_recorders_show_up_with_labels() -> None:
    m = ServiceMetrics()
    m.observe_request("/classify", "POST", 200, 0.012)
    m.observe_batch("image", 3, 0.001, 0.02, model="default@production")
    m.for_model("other@v3").set_queue_depth("image", 7)
    m.cache_event("lru", "hit", 5)
    m.model_swap("ok", model="default@production")
    m.image_decoded(2)
    m.texts_truncated(1)
    m.inflight_requests.inc()
    m.set_split("default@production", "v7", weight=10, fraction=0.25)
    m.observe_answer("default@production", "default@v7", "canary", 200, 0.01)
    text = m.render()[0].decode()
    assert 'clip_http_requests_total{method="POST",route="/classify",status="200"} 1.0' in text
    assert 'clip_batch_size_bucket{batcher="image",le="4.0",model="default@production"} 1.0' in text
    assert 'clip_batch_size_bucket{batcher="image",le="256.0",model="default@production"} 1.0' in text
    assert 'clip_queue_depth{batcher="image",model="other@v3"} 7.0' in text
    assert 'clip_cache_requests_total{layer="lru",result="hit"} 5.0' in text
    assert 'clip_model_swaps_total{model="default@production",result="ok"} 1.0' in text
    assert "clip_images_decoded_total 2.0" in text
    assert "clip_texts_truncated_total 1.0" in text
    assert "clip_inflight_requests 1.0" in text
    # The canary's weight is a percentage in the alias; the gauge is its 0-1 ratio.
    assert 'clip_canary_weight_ratio{model="default@production",version="v7"} 0.1' in text
    assert 'clip_shadow_sample_ratio{model="default@production",version="v7"} 0.25' in text
    # `model` is the served-set entry on every series, the version its own label.
    series = 'clip_version_requests_total{model="default@production",role="canary",status="200",version="v7"} 1.0'
    assert series in text


def test_model_info_swap_removes_the_old_version() -> None:
    m = ServiceMetrics()
    m.set_serving_model("default", "v1", ["base", "pcclip"], model="default@production")
    m.set_serving_model("other", "v9", ["base"], model="other@production")
    m.set_serving_model("default", "v5", ["base"], model="default@v5")  # a second entry of the same name
    m.set_serving_model("default", "v2", ["base"], model="default@production")
    get = m.registry.get_sample_value
    prod = {"model": "default@production", "name": "default"}
    assert get("clip_model_info", {**prod, "version": "v2", "encoder": "base"}) == 1
    assert get("clip_model_info", {**prod, "version": "v1", "encoder": "base"}) is None
    assert get("clip_model_info", {**prod, "version": "v1", "encoder": "pcclip"}) is None
    info = {"model": "other@production", "name": "other", "version": "v9", "encoder": "base"}
    assert get("clip_model_info", info) == 1
    assert get("clip_model_info", {"model": "default@v5", "name": "default", "version": "v5", "encoder": "base"}) == 1


def test_two_instances_do_not_share_state() -> None:
    a, b = ServiceMetrics(), ServiceMetrics()
    a.image_decoded(3)
    assert a.registry.get_sample_value("clip_images_decoded_total") == 3
    assert b.registry.get_sample_value("clip_images_decoded_total") == 0


def test_recorders_count_into_the_same_series_and_a_forgotten_version_comes_back() -> None:
    """The request path's recorders keep the series they looked up; a series removed with its
    version (``forget_version``, ``clear_split``) must be exported again when recorded again, not
    counted into a removed object."""
    m = ServiceMetrics()
    get = m.registry.get_sample_value
    for _ in range(3):
        m.observe_request("/embed", "POST", 200, 0.01)
        m.observe_answer("default@production", "default@v1", "primary", 200, 0.01)
    assert get("clip_http_requests_total", {"route": "/embed", "method": "POST", "status": "200"}) == 3
    answered = {"model": "default@production", "version": "v1", "role": "primary", "status": "200"}
    assert get("clip_version_requests_total", answered) == 3
    m.forget_version("default@production", "v1")
    assert get("clip_version_requests_total", answered) is None
    m.observe_answer("default@production", "default@v1", "primary", 200, 0.01)
    assert get("clip_version_requests_total", answered) == 1
    m.set_split("default@production", "v2", weight=10)
    m.clear_split("default@production", "v2")
    m.set_split("default@production", "v2", weight=20)
    assert get("clip_canary_weight_ratio", {"model": "default@production", "version": "v2"}) == 0.2
