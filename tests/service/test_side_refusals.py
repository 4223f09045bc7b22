"""A canary or shadow that cannot serve is refused when its alias names it, not at serve time: one
over the memory budget (versions or bytes), a shadow whose embeddings are not as wide as the
primary's. Each is logged, counted in clip_side_loads_total and shown in /models with the reason,
and the primary answers every caller meanwhile. Real servers on tmp stores, tiny models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from polling import wait_until
from prometheus_samples import metric_value

from loadtests.local_stack import SMOKE_CONFIG
from model_store import ModelStore

UNEVALUATED = "random weights, never evaluated"


def _split(url: str, name: str) -> dict[str, Any]:
    info = httpx.get(f"{url}/models/{name}", timeout=30).json()
    return {role: info.get(role) or {} for role in ("canary", "shadow")}


def _answered(url: str, model: str, keys: list[str]) -> set[str]:
    with httpx.Client(base_url=url, timeout=60) as client:
        return {
            client.post("/embed", json={"texts": ["a red circle"], "model": model}, headers={"X-Canary-Key": k}).json()[
                "model"
            ]
            for k in keys
        }


def _publish_narrow(root: Path, name: str) -> str:
    """A version of ``name`` whose embeddings are 16 wide (the tiny models' are 32)."""
    from clipcore.models.clip_model import build_model
    from clipcore.models.publish import TrainedModel, publish_bundle

    config = {**json.loads(SMOKE_CONFIG.read_text()), "embed_dim": 16}
    torch.manual_seed(91)
    trained = TrainedModel(build_model(config), config, fp16=False)
    return publish_bundle(ModelStore(root), name, trained, aliases=[], force=True, reason=UNEVALUATED).version


@pytest.mark.parametrize(
    ("budget", "reason"),
    [({"max_loaded_models": 2}, "max_loaded_models=2"), ({"max_loaded_bytes": 20_000_000}, "max_loaded_bytes=19 MiB")],
)
def test_a_canary_over_the_memory_budget_is_refused_at_the_move(
    tmp_path: Path, serve_app: Any, publish_model: Any, budget: dict[str, int], reason: str
) -> None:
    root = tmp_path / "store"
    publish_model(root, "alpha", seed=91)
    publish_model(root, "beta", seed=92)
    publish_model(root, "beta", seed=93, aliases=())  # v2
    # Two versions (alpha's and beta's), or about 12.8 MB each of 20 MB: no room for a third.
    model = "alpha,beta@production" if "max_loaded_models" in budget else "beta@production"
    with serve_app(store=str(root), model=model, watch_interval_s=0.1, **budget) as running:
        url = running.url
        ModelStore(root).canary("beta", "production", "v2", 50, force=True, reason=UNEVALUATED)
        wait_until(lambda: metric_value(url, "clip_side_loads_total", role="canary", result="over_budget") == 1)
        canary = _split(url, "beta")["canary"]
        assert canary["loaded"] is False and canary["problem"].startswith("v2 refused: ")
        assert reason in canary["problem"]
        assert _answered(url, "beta", [f"caller-{i}" for i in range(30)]) == {"beta@v1"}
        wait_until(lambda: metric_value(url, "clip_side_loads_total", role="canary", result="over_budget") == 1)
        assert metric_value(url, "clip_side_loads_total", role="canary", result="ok") == 0


def test_a_shadow_of_another_width_is_refused_at_the_move(
    tmp_path: Path, serve_app: Any, publish_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    publish_model(root, "beta", seed=94)
    narrow = _publish_narrow(root, "beta")
    with serve_app(store=str(root), model="beta@production", watch_interval_s=0.1) as running:
        url = running.url
        ModelStore(root).shadow("beta", "production", narrow, fraction=1.0)
        wait_until(lambda: metric_value(url, "clip_side_loads_total", role="shadow", result="width") == 1)
        shadow = _split(url, "beta")["shadow"]
        assert shadow["loaded"] is False and "16 wide, the primary's 32" in shadow["problem"]
        assert _answered(url, "beta", ["k"]) == {"beta@v1"}
        assert metric_value(url, "clip_shadow_requests_total") == 0  # nothing re-run, nothing failed
    assert any(f"refusing shadow beta@{narrow}" in r.getMessage() for r in caplog.records)
