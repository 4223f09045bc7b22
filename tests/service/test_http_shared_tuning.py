"""A real server with ``CLIP_PRECISION=auto`` on a store where ``clip-train tune`` shared a
decision: it serves the tuned winner with the shared graphs and times nothing (``/models`` says
``shared (tuned on ... at ...)``, ``/metrics`` counts a shared decision and no measured one); a
server of another CPU kind decides locally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_samples import metric_value
from scripted_timings import onnx_scripted_to_win

from clipcore.backends import auto, shared
from clipcore.backends.tune import tune
from model_store import ModelStore

pytestmark = pytest.mark.slow


def _serving_auto(url: str) -> dict[str, Any]:
    (model,) = httpx.get(f"{url}/models").json()["models"]
    (serving,) = [v for v in model["versions"] if v["serving"]]
    return dict(serving["auto"])


def _measured(url: str) -> float:
    return sum(metric_value(url, "clip_backend_auto_decisions_total", outcome=o) for o in ("chosen", "deferred"))


def test_a_server_reads_the_shared_decision_and_another_cpu_kind_decides_locally(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = tmp_path / "store"
    publish_model(store_dir, "tiny", seed=4)
    torch.set_num_threads(1)
    with monkeypatch.context() as patch:
        patch.setattr(auto, "time_rounds", onnx_scripted_to_win)
        done = tune(ModelStore(store_dir), "tiny@production", threads=1, seconds=0.2)
    settings = {"store": str(store_dir), "model": "tiny@production", "precision": "auto", "torch_threads": 1}

    with serve_app(**settings, onnx_cache_dir=str(tmp_path / "pod-a")) as running:
        decision = _serving_auto(running.url)
        assert decision["outcome"] == "shared" and decision["backend"] == "onnx", decision
        assert decision["decision"].startswith(f"shared (tuned on {done.written.meta['tuned_on']} at "), decision
        assert decision["tuned_on"] == done.written.meta["tuned_on"]
        assert metric_value(running.url, "clip_backend_auto_decisions_total", outcome="shared") == 1
        assert _measured(running.url) == 0  # no local timing happened
        assert "decision: shared (tuned on" in running.services.manager.current.backend
        answer = httpx.post(f"{running.url}/embed", json={"images": [make_image("circle", "red")]}, timeout=60)
        assert answer.status_code == 200, answer.text

    monkeypatch.setattr(shared, "cpu_kind", lambda: "x86_64-avx2-fma-torch.avx2")  # a node of another kind
    with serve_app(**settings, onnx_cache_dir=str(tmp_path / "pod-b")) as running:
        decision = _serving_auto(running.url)
        assert decision["outcome"] in ("chosen", "deferred") and decision["decision"] == "local", decision
        assert decision["tuned_on"] is None and _measured(running.url) == 1
        assert metric_value(running.url, "clip_backend_auto_decisions_total", outcome="shared") == 0
