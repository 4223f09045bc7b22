"""SIGTERM drains in-flight requests: what Kubernetes relies on during rollouts and scale-downs.

``python -m service`` runs as a real subprocess on a tiny random model. Several /embed requests
are put in flight (their bodies are held half-sent, so they are provably still running when
the signal arrives), then SIGTERM: the listener must close at once (new connections are
refused), every in-flight request must still complete with 200, and the process must exit
with code 0 well within the grace period the Deployment gives it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from polling import wait_until

REPO = Path(__file__).resolve().parents[2]
IN_FLIGHT = 6
IMAGES_PER_REQUEST = 16
GRACEFUL_SHUTDOWN_S = 30


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _noise_png(rng: np.random.Generator, px: int = 128) -> str:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (px, px, 3), dtype=np.uint8)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _inflight(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^clip_inflight_requests (\S+)$", text, re.MULTILINE)
    assert match is not None, "the service exports no clip_inflight_requests gauge"
    return float(match.group(1))


def _refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


@pytest.fixture
def service_process(
    tmp_path: Path, publish_model: Callable[..., str]
) -> Iterator[tuple[subprocess.Popen[bytes], str, int]]:
    store = tmp_path / "store"
    publish_model(store, "tiny")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIP_")}
    env.update(
        {
            "CLIP_GRACEFUL_SHUTDOWN_S": str(GRACEFUL_SHUTDOWN_S),
            # Small batches and one decode worker keep every request busy for a while.
            "CLIP_BATCHING__MAX_BATCH_IMAGES": "4",
            "CLIP_BATCHING__DECODE_WORKERS": "1",
            "CLIP_LOG_LEVEL": "warning",
        }
    )
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--store",
        str(store),
        "--model",
        "tiny@production",
    ]
    log = (tmp_path / "service.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "service.log").read_text()
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 120, "/readyz")
        yield proc, url, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(
    service_process: tuple[subprocess.Popen[bytes], str, int],
) -> None:
    proc, url, port = service_process
    rng = np.random.default_rng(0)
    bodies = [
        json.dumps({"images": [{"data": _noise_png(rng)} for _ in range(IMAGES_PER_REQUEST)]}).encode()
        for _ in range(IN_FLIGHT)
    ]
    release = threading.Event()

    def held_body(body: bytes) -> Iterator[bytes]:
        # Headers and half the body now; the rest only once SIGTERM has been delivered.
        half = len(body) // 2
        yield body[:half]
        assert release.wait(60), "the test never released the request bodies"
        yield body[half:]

    def post(body: bytes) -> httpx.Response:
        return httpx.post(
            f"{url}/embed", content=held_body(body), timeout=120, headers={"Content-Type": "application/json"}
        )

    baseline = _inflight(url)  # 1 if /metrics counts itself, else 0
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        futures: list[Future[httpx.Response]] = [pool.submit(post, b) for b in bodies]
        try:
            wait_until(lambda: _inflight(url) >= baseline + IN_FLIGHT, 60, "all requests in flight")
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            wait_until(lambda: _refuses_connections(port), 10, "the listener to close after SIGTERM")
            assert proc.poll() is None, "the process exited with requests still in flight"
            assert not any(f.done() for f in futures), "a held request finished before its body was sent"
        finally:
            release.set()
        responses = [f.result(timeout=120) for f in futures]

    for response in responses:
        assert response.status_code == 200, response.text
        payload = response.json()
        assert len(payload["embeddings"]) == IMAGES_PER_REQUEST
        assert payload["model"] == "tiny@v1"
    code = proc.wait(timeout=GRACEFUL_SHUTDOWN_S + 10)
    took = time.monotonic() - signalled
    assert code == 0, f"exit code {code} after SIGTERM (a graceful stop must exit 0)"
    assert took < GRACEFUL_SHUTDOWN_S, f"shutdown took {took:.1f}s"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=2)
