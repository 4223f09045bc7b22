"""The service and a store that is not there: the log names the path and the setting, the 503
names the setting only (bodies reach unauthenticated callers and never carry internal paths)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest


def _wait(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_missing_store_is_named_in_the_log_and_the_setting_in_the_503(
    tmp_path: Path, serve_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "secret-mount" / "nonexistent"
    caplog.set_level(logging.ERROR, logger="service.lifecycle")
    with serve_app(store=str(missing), model="default@production", watch_interval_s=0.1, ready=False) as running:
        _wait(lambda: running.services.manager.not_ready_reason is not None)
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
        _wait(lambda: running.services.manager.not_ready_reason is not None)
        message = httpx.get(f"{running.url}/readyz").json()["error"]["message"]
        assert "model 'default' not found in the model store set by CLIP_STORE" in message
        assert str(tmp_path) not in message
