"""Loads on request under a memory budget cannot be turned against the models already loaded.

A request naming a model whose version cannot load (corrupt weights) unloads nothing: only a load
that succeeded makes room. The failed entry is quarantined (503 with Retry-After, no load) until its
backoff ends, or, for a refused version, until its alias names another version; failed loads are
counted; and loads on request are bounded in rate (``max_loads_per_minute``).
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_until
from prometheus_samples import metric_value

from model_store import ModelStore

TEXTS = ["a red circle"]


def _corrupt(root: Path, name: str, version: str) -> Path:
    """Flip one byte of ``name@version``'s weights (bit rot after publishing: its checksum fails)."""
    weights = ModelStore(root).version_dir(name, version) / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    weights.write_bytes(bytes(raw))
    return weights


def _embed(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/embed", json={"texts": TEXTS, "model": model}, timeout=60)


def _served(url: str) -> dict[str, dict[str, Any]]:
    return {m["ref"]: m for m in httpx.get(f"{url}/models", timeout=30).json()["served"]}


def _assert_quarantined(r: httpx.Response, ref: str) -> None:
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "not_ready" and int(r.headers["retry-after"]) >= 1
    assert f"model {ref} is quarantined" in error["message"], error["message"]
    assert "/" not in error["message"].partition("quarantined")[2], error["message"]  # no path of the store


@pytest.fixture
def broken_neighbour(tmp_path: Path, publish_model: Any) -> Path:
    """alpha (the default), healthy, and broken whose only version (production) has corrupt weights."""
    root = tmp_path / "store"
    publish_model(root, "alpha", seed=81)
    publish_model(root, "healthy", seed=82)
    version = publish_model(root, "broken", seed=83)
    _corrupt(root, "broken", version)
    return root


@pytest.mark.slow
def test_a_version_that_cannot_load_unloads_no_healthy_model_and_is_quarantined(
    broken_neighbour: Path, serve_app: Any
) -> None:
    # Room for alpha and healthy; broken loads on request, and its load fails (checksum).
    settings = {"max_loaded_models": 2, "watch_interval_s": 30.0}
    with serve_app(store=str(broken_neighbour), model="alpha,healthy,broken", **settings) as running:
        url = running.url
        healthy = running.services.models.entries[1]
        wait_until(lambda: healthy.current is not None, what="healthy, within the budget, to load at start")
        runtime = healthy.current
        # A caller of the healthy model and one naming the broken model, in turn.
        for _ in range(5):
            _assert_quarantined(_embed(url, "broken"), "broken")
            r = _embed(url, "healthy")
            assert r.status_code == 200 and r.json()["model"] == "healthy@v1", r.text
        # The healthy model was never unloaded, nor loaded again: the same runtime served throughout.
        assert healthy.current is runtime
        assert metric_value(url, "clip_model_unloads_total") == 0
        assert metric_value(url, "clip_model_loads_total", model="healthy") == 1
        # One load was tried (the first request's); the four after it were refused without one.
        assert metric_value(url, "clip_model_load_failures_total", model="broken", reason="checksum") == 1
        assert metric_value(url, "clip_model_loads_total", model="broken") == 0
        assert metric_value(url, "clip_model_loads_skipped_total", model="broken", reason="quarantined") == 4
        assert metric_value(url, "clip_model_quarantined", model="broken") == 1
        assert metric_value(url, "clip_model_quarantined", model="healthy") == 0
        served = _served(url)
    assert [(ref, m["state"]) for ref, m in served.items()] == [
        ("alpha", "ready"),
        ("healthy", "ready"),
        ("broken", "quarantined"),
    ]
    quarantine = served["broken"]["quarantine"]
    assert quarantine["version"] == "v1" and quarantine["refused"] is True and quarantine["failures"] == 1
    assert quarantine["reason"] == "loading failed (ChecksumMismatch)"
    assert datetime.fromisoformat(quarantine["until"]).tzinfo is not None
    assert served["healthy"]["quarantine"] is None


@pytest.mark.slow
def test_a_refused_version_stays_refused_until_its_alias_moves_to_one_that_loads(
    broken_neighbour: Path, serve_app: Any, publish_model: Any
) -> None:
    settings = {"max_loaded_models": 2, "watch_interval_s": 0.2}
    with serve_app(store=str(broken_neighbour), model="alpha,healthy,broken@production", **settings) as running:
        url = running.url
        wait_until(lambda: _served(url)["healthy"]["state"] == "ready", what="healthy to load at start")
        _assert_quarantined(_embed(url, "broken"), "broken@production")
        broken = running.services.models.entries[2]
        first = broken.quarantine

        def alias_read_again() -> bool:  # past the quarantine: the alias is read, the version not loaded
            _assert_quarantined(_embed(url, "broken"), "broken@production")
            return broken.quarantine is not first

        wait_until(alias_read_again, what="a request past the first quarantine")
        assert broken.quarantine is not None and broken.quarantine.version == "v1" and broken.quarantine.refused
        assert metric_value(url, "clip_model_load_failures_total", model="broken@production") == 1
        # v2 loads: the first request after the alias moved (and was read again) is answered by it.
        publish_model(broken_neighbour, "broken", seed=84)  # v2 becomes production

        def answered_by_v2() -> bool:
            r = _embed(url, "broken")
            return r.status_code == 200 and r.json()["model"] == "broken@v2"

        wait_until(answered_by_v2, what="broken@v2 to load once its alias moved")
        assert metric_value(url, "clip_model_load_failures_total", model="broken@production") == 1
        assert metric_value(url, "clip_model_loads_total", model="broken@production") == 1
        assert metric_value(url, "clip_model_quarantined", model="broken@production") == 0
        served = _served(url)
        # The successful load made room: the idle healthy model was unloaded, after it.
        assert metric_value(url, "clip_model_unloads_total", model="healthy") == 1
    assert served["broken@production"]["state"] == "ready" and served["broken@production"]["quarantine"] is None
    assert served["healthy"]["state"] == "unloaded"


@pytest.mark.slow
def test_a_version_that_may_pass_is_tried_again_after_its_backoff(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    root = tmp_path / "store"
    publish_model(root, "alpha", seed=85)
    publish_model(root, "beta", seed=89)
    version = publish_model(root, "flaky", seed=86)
    weights = ModelStore(root).version_dir("flaky", version) / "model.safetensors"
    kept = tmp_path / "weights"
    shutil.move(weights, kept)
    weights.mkdir()  # unreadable: the version may load once the file is back
    settings = {"max_loaded_models": 2, "watch_interval_s": 0.2}
    with serve_app(store=str(root), model="alpha,beta,flaky", **settings) as running:
        url = running.url
        wait_until(lambda: _served(url)["beta"]["state"] == "ready", what="beta to load at start")
        _assert_quarantined(_embed(url, "flaky"), "flaky")
        quarantine = _served(url)["flaky"]["quarantine"]
        assert quarantine["refused"] is False and quarantine["failures"] == 1

        # Requests after the backoff try again (each failure doubles it); those before get 503 at once.
        def failed_twice() -> bool:
            _embed(url, "flaky")
            return metric_value(url, "clip_model_load_failures_total", model="flaky", reason="unreadable") >= 2

        wait_until(failed_twice, what="a second load of flaky after its backoff")
        assert _served(url)["flaky"]["quarantine"]["failures"] == 2
        weights.rmdir()
        shutil.move(kept, weights)

        def loaded() -> bool:
            r = _embed(url, "flaky")
            return r.status_code == 200 and r.json()["model"] == "flaky@v1"

        wait_until(loaded, what="flaky to load once its file is back")
        assert _served(url)["flaky"]["state"] == "ready"
        assert metric_value(url, "clip_model_quarantined", model="flaky") == 0
        # Its successful load made room: beta, idle, was unloaded then, and only then.
        assert metric_value(url, "clip_model_unloads_total") == 1


@pytest.mark.slow
def test_loads_on_request_past_max_loads_per_minute_answer_503_with_retry_after(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    root = tmp_path / "store"
    for seed, name in enumerate(("alpha", "beta", "gamma"), start=87):
        publish_model(root, name, seed=seed)
    settings = {"max_loaded_models": 2, "max_loads_per_minute": 1}
    with serve_app(store=str(root), model="alpha,beta,gamma", **settings) as running:
        url = running.url
        wait_until(lambda: _served(url)["beta"]["state"] == "ready", what="beta to load at start (not counted)")
        r = _embed(url, "gamma")  # the one load on request this minute: beta makes room
        assert r.status_code == 200 and r.json()["model"] == "gamma@v1", r.text
        r = _embed(url, "beta")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "not_ready" and 1 <= int(r.headers["retry-after"]) <= 60
        assert "max_loads_per_minute=1" in r.json()["error"]["message"]
        assert metric_value(url, "clip_model_loads_skipped_total", model="beta", reason="rate_limited") == 1
        assert {ref: m["state"] for ref, m in _served(url).items()} == {
            "alpha": "ready",
            "beta": "unloaded",
            "gamma": "ready",
        }
