"""Offline checks of deploy/compose.yaml that `docker compose config` does not make.

`compose config` (when a compose binary exists) validates the schema; this checks the
deployment invariants the operations guide relies on, and runs everywhere:

- every long-running service has a healthcheck, and every dependency waits on a condition;
- the API mounts the model store read-only and is built from deploy/Dockerfile;
- the API's stop grace period exceeds the service's graceful-shutdown timeout.

    python deploy/check_compose.py [deploy/compose.yaml ...]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

API = "clip-service"
ONE_SHOT = {"model-seed", "train"}  # run to completion; a healthcheck makes no sense there
GRACEFUL_SHUTDOWN_S = 20  # service default for CLIP_GRACEFUL_SHUTDOWN_S


def _seconds(value: str) -> float:
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value):
        total += float(amount) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def problems(compose: dict[str, Any]) -> list[str]:
    out: list[str] = []
    services: dict[str, Any] = compose.get("services") or {}
    volumes = set((compose.get("volumes") or {}).keys())
    for required in (API, "redis", "model-seed"):
        if required not in services:
            out.append(f"missing service {required!r}")
    for name, svc in services.items():
        if name not in ONE_SHOT and "healthcheck" not in svc:
            out.append(f"{name}: no healthcheck")
        depends = svc.get("depends_on") or {}
        if isinstance(depends, list):
            out.append(f"{name}: depends_on must name a condition for each dependency")
        else:
            for dep, spec in depends.items():
                if dep not in services:
                    out.append(f"{name}: depends on unknown service {dep!r}")
                elif not (spec or {}).get("condition"):
                    out.append(f"{name}: dependency {dep!r} has no condition")
        for mount in svc.get("volumes") or []:
            source = str(mount).split(":", 1)[0]
            if not source.startswith((".", "/")) and source not in volumes:
                out.append(f"{name}: volume {source!r} is not declared")
    api = services.get(API) or {}
    if not any(str(m).startswith("model-store:/models") and str(m).endswith(":ro") for m in api.get("volumes") or []):
        out.append(f"{API}: the model store must be mounted read-only at /models")
    if (api.get("build") or {}).get("dockerfile") != "deploy/Dockerfile":
        out.append(f"{API}: must build deploy/Dockerfile")
    if (api.get("depends_on") or {}).get("redis", {}).get("condition") != "service_healthy":
        out.append(f"{API}: must wait for a healthy redis")
    if _seconds(str(api.get("stop_grace_period", "10s"))) <= GRACEFUL_SHUTDOWN_S:
        out.append(f"{API}: stop_grace_period must exceed the {GRACEFUL_SHUTDOWN_S}s graceful-shutdown timeout")
    return out


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or [Path(__file__).with_name("compose.yaml")]
    failed = False
    for path in paths:
        compose = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        # An override file (compose.gpu.yaml) is only checked in combination with the main one.
        if "redis" not in (compose.get("services") or {}):
            continue
        for line in problems(compose):
            print(f"{path}: {line}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
