"""FastAPI's built-in OpenTelemetry, asked once at startup whether it has anywhere to report.

FastAPI (0.16x) asks the global OpenTelemetry providers on every request whether one is configured:
three provider look-ups, each reading the environment, 15-30 us of the event loop per request on a
2-core EPYC (about 5 % of the engine's loop, docs/benchmarks.md "Front-end cost"). This service
configures no provider itself; a deployment that does (``opentelemetry-instrument``, or FastAPI's own
``FASTAPI_OTEL_AUTO_CONFIGURE=true``, which FastAPI applies as the startup begins) has them in place
before the application's startup ends. So ``settle_telemetry`` asks once, at startup: with no
provider then, FastAPI's telemetry stays off for the life of the process (a provider set later is
not seen); with one, nothing changes.
"""

from __future__ import annotations

from typing import Any

_OFF = {"tracing": False, "metrics": False, "logs": False}


def settle_telemetry(app: Any) -> bool:
    """Turn FastAPI's telemetry off when no OpenTelemetry provider is configured now; whether it is
    off. A FastAPI without built-in telemetry (before 0.16x) is left as it is."""
    native, config = getattr(app, "_native_telemetry", None), getattr(app, "_telemetry", None)
    if native is None or not isinstance(config, dict) or not all(key in config for key in _OFF):
        return False
    if native.enabled():
        return False
    config.update(_OFF)  # NativeTelemetry reads this same dict on every request
    return True
