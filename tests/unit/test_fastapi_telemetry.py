"""FastAPI's built-in telemetry: off after startup without an OpenTelemetry provider, untouched with one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.fastapi_telemetry import settle_telemetry

pytestmark = pytest.mark.skipif(not hasattr(FastAPI(), "_native_telemetry"), reason="a FastAPI without telemetry")


def test_without_a_provider_fastapi_stops_asking_on_every_request() -> None:
    app = FastAPI()
    app.get("/x")(lambda: {"ok": True})
    assert app._telemetry["tracing"] is True  # FastAPI's default: ask the providers on every request
    assert settle_telemetry(app) is True
    assert (app._telemetry["tracing"], app._telemetry["metrics"], app._telemetry["logs"]) == (False, False, False)
    assert app._native_telemetry.enabled() is False
    with TestClient(app) as client:
        assert client.get("/x").json() == {"ok": True}


def test_a_configured_provider_keeps_fastapis_telemetry() -> None:
    # A global provider is set once per process: in a process of its own.
    script = (
        "from fastapi import FastAPI\n"
        "from opentelemetry import trace\n"
        "from service.fastapi_telemetry import settle_telemetry\n"
        "trace.set_tracer_provider(trace.NoOpTracerProvider())\n"
        "app = FastAPI()\n"
        "print(settle_telemetry(app), app._native_telemetry.enabled(), app._telemetry['tracing'])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


def test_the_service_settles_it_at_startup(serve_app: Any, tiny_store: Path) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", ready=False) as running:
        assert running.app._telemetry["tracing"] is False
