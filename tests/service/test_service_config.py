"""Settings from the environment, secret redaction, and ``python -m service`` as a process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from service.__main__ import parse_args
from service.config import Settings

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_defaults() -> None:
    s = Settings()
    assert (s.host, s.port, s.store, s.model, s.device) == ("127.0.0.1", 8000, "models", "default@production", "cpu")
    assert s.limits.max_body_bytes == 20 * 1024 * 1024 and s.limits.max_pixels == 40_000_000
    assert s.batching.max_queue == 4096 and not s.allow_url_images and s.api_keys == []


def test_a_served_set_of_refs_and_its_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIP_MODEL", "default@production, default@v5 ,other")
    monkeypatch.setenv("CLIP_MAX_LOADED_MODELS", "2")
    s = Settings()
    assert s.served_refs() == ["default@production", "default@v5", "other"] and s.max_loaded_models == 2
    for refs, why in (
        ("default,default@production", "name the same entry"),  # a bare name is name@production
        ("default,,other", "empty model ref"),
        ("default,bad name", "model name"),
    ):
        with pytest.raises(ValidationError, match=why):
            Settings(model=refs)
    with pytest.raises(ValidationError, match="max_loaded_models=1 holds only the first model"):
        Settings(model="default,other", max_loaded_models=1)
    assert Settings(model="default", max_loaded_models=1).max_loaded_models == 1


def test_environment_with_nested_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIP_PORT", "9001")
    monkeypatch.setenv("CLIP_DEVICE", "auto")
    monkeypatch.setenv("CLIP_LIMITS__MAX_IMAGES", "7")
    monkeypatch.setenv("CLIP_BATCHING__MAX_WAIT_MS", "2.5")
    monkeypatch.setenv("CLIP_API_KEYS", '["k1", "k2"]')
    monkeypatch.setenv("CLIP_LOG_LEVEL", "DEBUG")
    s = Settings()
    assert s.port == 9001 and s.device == "auto" and s.limits.max_images == 7
    assert s.batching.max_wait_ms == 2.5 and [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"]
    assert s.log_level == "debug"
    assert Settings(port=9002).port == 9002  # explicit values (flags) win over the environment


def test_invalid_settings_are_rejected() -> None:
    for bad in (
        {"device": "tpu"},
        {"port": -1},
        {"limits": {"max_images": 0}},
        {"api_keys": [""]},
        {"limits": {"nope": 1}},
        {"model": "../etc@x"},
        {"model": "a@b@c"},
    ):
        with pytest.raises(ValidationError):
            Settings(**bad)


def test_secrets_are_redacted() -> None:
    s = Settings(api_keys=["super-secret"], redis_url="redis://:hunter2@cache:6379/0")
    text = repr(s.redacted()) + repr(s) + str(s)
    assert "super-secret" not in text and "hunter2" not in text
    assert s.redis_url_value() == "redis://:hunter2@cache:6379/0"
    assert s.redacted()["redis_url"] == "redis://:***@cache:6379/0"


def test_cli_flags_mirror_settings() -> None:
    args = parse_args(
        [
            "--host",
            "0.0.0.0",
            "--port",
            "8080",
            "--store",
            "/m",
            "--model",
            "x@staging",
            "--redis-url",
            "redis://r:6379/0",
            "--device",
            "cuda",
            "--log-level",
            "warning",
        ]
    )
    s = Settings(**args)
    assert (s.host, s.port, s.store, s.model, s.device, s.log_level) == (
        "0.0.0.0",
        8080,
        "/m",
        "x@staging",
        "cuda",
        "warning",
    )
    assert s.redis_url_value() == "redis://r:6379/0"
    assert parse_args([]) == {}


def test_python_m_service_serves_and_shuts_down(tmp_path: Path, publish_model: Any) -> None:
    publish_model(tmp_path / "store", "cli", seed=14)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLIP_WATCH_INTERVAL_S": "0.5"}
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--store",
        str(tmp_path / "store"),
        "--model",
        "cli@production",
        "--port",
        str(port),
        "--redis-url",
        "redis://127.0.0.1:1/0",
        "--log-level",
        "info",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/embed", json={"texts": ["hello"]})
        assert r.status_code == 200 and r.json()["model"] == "cli@v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    # uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is the clean exit here.
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out
    assert "unreachable" in out  # Redis down at start: a warning, not a failure
    assert '"route": "/embed"' in out and '"status": 200' in out  # one structured access line
    assert "hunter2" not in out


def test_invalid_flag_value_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service", "--port", "99999"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "invalid settings" in proc.stderr
