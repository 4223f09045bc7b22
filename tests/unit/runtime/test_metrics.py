"""ServiceMetrics: every contract metric is exported, registries are per instance."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST

from service.runtime import ServiceMetrics

NAMES = [
    "http_requests_total",
    "http_request_duration_seconds",
    "batch_size",
    "batch_wait_seconds",
    "encode_seconds",
    "queue_depth",
    "cache_requests_total",
    "model_info",
    "model_swaps_total",
    "model_loads_total",
    "model_unloads_total",
    "inflight_requests",
    "images_decoded_total",
    "texts_truncated_total",
]


def test_render_names_every_metric() -> None:
    body, content_type = ServiceMetrics().render()
    assert content_type == CONTENT_TYPE_LATEST
    text = body.decode()
    for name in NAMES:
        assert f"# TYPE {name} " in text or f"# TYPE {name.removesuffix('_total')} " in text, name


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
    text = m.render()[0].decode()
    assert 'http_requests_total{method="POST",route="/classify",status="200"} 1.0' in text
    assert 'batch_size_bucket{batcher="image",le="4.0",model="default@production"} 1.0' in text
    assert 'batch_size_bucket{batcher="image",le="256.0",model="default@production"} 1.0' in text
    assert 'queue_depth{batcher="image",model="other@v3"} 7.0' in text
    assert 'cache_requests_total{layer="lru",result="hit"} 5.0' in text
    assert 'model_swaps_total{model="default@production",result="ok"} 1.0' in text
    assert "images_decoded_total 2.0" in text
    assert "texts_truncated_total 1.0" in text
    assert "inflight_requests 1.0" in text


def test_model_info_swap_removes_the_old_version() -> None:
    m = ServiceMetrics()
    m.set_serving_model("default", "v1", ["base", "pcclip"], model="default@production")
    m.set_serving_model("other", "v9", ["base"], model="other@production")
    m.set_serving_model("default", "v5", ["base"], model="default@v5")  # a second entry of the same name
    m.set_serving_model("default", "v2", ["base"], model="default@production")
    get = m.registry.get_sample_value
    prod = {"model": "default@production", "name": "default"}
    assert get("model_info", {**prod, "version": "v2", "encoder": "base"}) == 1
    assert get("model_info", {**prod, "version": "v1", "encoder": "base"}) is None
    assert get("model_info", {**prod, "version": "v1", "encoder": "pcclip"}) is None
    assert get("model_info", {"model": "other@production", "name": "other", "version": "v9", "encoder": "base"}) == 1
    assert get("model_info", {"model": "default@v5", "name": "default", "version": "v5", "encoder": "base"}) == 1


def test_two_instances_do_not_share_state() -> None:
    a, b = ServiceMetrics(), ServiceMetrics()
    a.image_decoded(3)
    assert a.registry.get_sample_value("images_decoded_total") == 3
    assert b.registry.get_sample_value("images_decoded_total") == 0
