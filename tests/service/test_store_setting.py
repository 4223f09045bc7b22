"""The service and a store that is not there: the log names the path and the setting, the 503
names the setting only (bodies reach unauthenticated callers and never carry internal paths)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_until


def test_a_missing_store_is_named_in_the_log_and_the_setting_in_the_503(
    tmp_path: Path, serve_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "secret-mount" / "nonexistent"
    caplog.set_level(logging.ERROR, logger="service.lifecycle")
    with serve_app(store=str(missing), model="default@production", watch_interval_s=0.1, ready=False) as running:
        wait_until(lambda: running.services.manager.not_ready_reason is not None)
        for response in (httpx.get(f"{running.url}/readyz"), httpx.post(f"{running.url}/embed", json={"texts": ["a"]})):
            assert response.status_code == 503
            message = response.json()["error"]["message"]
            assert "default@production" in message and "CLIP_STORE" in message and "does not exist" in message
            assert "secret-mount" not in response.text
    logged = [r.getMessage() for r in caplog.records if str(missing) in r.getMessage()]
    assert logged and "CLIP_STORE" in logged[0] and "does not exist" in logged[0]


def test_a_store_without_the_model_says_which_model(tmp_path: Path, serve_app: Any) -> None:
    root = tmp_path / "store"
    root.mkdir()
    with serve_app(store=str(root), model="default@production", watch_interval_s=0.1, ready=False) as running:
        wait_until(lambda: running.services.manager.not_ready_reason is not None)
        message = httpx.get(f"{running.url}/readyz").json()["error"]["message"]
        assert "model 'default' not found in the model store set by CLIP_STORE" in message
        assert str(tmp_path) not in message


def test_a_misspelt_model_logs_what_the_store_holds(
    tiny_store: Path, serve_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """`--model nosuch@production` retried with nothing to go on; the log now lists the store's models
    and their aliases (the 503 body keeps naming the setting only)."""
    caplog.set_level(logging.ERROR, logger="service.lifecycle")
    with serve_app(store=str(tiny_store), model="tinyy@production", watch_interval_s=0.1, ready=False) as running:
        wait_until(lambda: running.services.manager.not_ready_reason is not None)
    logged = [r.getMessage() for r in caplog.records if "tinyy@production" in r.getMessage()]
    assert logged, [r.getMessage() for r in caplog.records]
    assert "models in the store: " in logged[0] and "tiny (" in logged[0] and "production -> v" in logged[0], logged[0]


@pytest.mark.slow
def test_an_unreachable_s3_store_is_a_503_on_every_models_route(
    tmp_path: Path, serve_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as probe:  # a 127.0.0.1 port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
        "AWS_ACCESS_KEY_ID": "unused",
        "AWS_SECRET_ACCESS_KEY": "unused",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_MAX_ATTEMPTS": "1",
        "CLIP_STORE_CACHE_DIR": str(tmp_path / "store-cache"),
    }.items():
        monkeypatch.setenv(key, value)
    with serve_app(store="s3://down/models", model="default@production", watch_interval_s=0.1, ready=False) as running:
        wait_until(lambda: running.services.manager.not_ready_reason is not None)
        for path in ("/models", "/models/default"):
            response = httpx.get(f"{running.url}{path}", timeout=60)
            assert response.status_code == 503, (path, response.text)
            assert response.json()["error"]["code"] == "not_ready"
            assert str(closed) not in response.text  # the endpoint stays in the log


def test_models_show_each_versions_evaluation_and_survive_an_unreadable_one(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    from model_store import ModelStore

    root = tmp_path / "store"
    publish_model(root, "annexed", seed=1)
    publish_model(root, "annexed", seed=2, aliases=())
    store = ModelStore(root)
    store.write_annex("annexed", "v1", "eval.json", b'{"metrics": {"zeroshot.acc": 0.75}}')
    store.write_annex("annexed", "v2", "eval.json", b"{truncated")
    with serve_app(store=str(root), model="annexed@production") as running:
        response = httpx.get(f"{running.url}/models/annexed")
    assert response.status_code == 200, response.text
    v1, v2 = response.json()["versions"]
    assert v1["eval"] == {"metrics": {"zeroshot.acc": 0.75}}
    assert v2["version"] == "v2" and v2["eval"] is None and v2["error"] is None
