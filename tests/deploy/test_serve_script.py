"""README's serve command, `bash scripts/serve.sh`: it installs only when the environment is missing
or stale, serves the committed default model with a Redis it starts, and stops that Redis when the
service stops."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.slow
def test_install_is_skipped_when_the_environment_is_current() -> None:
    """`PYTHON=false` fails any path that would create or install: only the stamp's fast path passes."""
    subprocess.run(["bash", "scripts/install.sh", "cpu"], cwd=REPO, check=True, timeout=600)
    fast = subprocess.run(["bash", "scripts/install.sh", "cpu"], cwd=REPO, env={**os.environ, "PYTHON": "false"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert fast.returncode == 0, fast.stderr
    stale = subprocess.run(["bash", "scripts/install.sh", "no-such-extra"], cwd=REPO,
                           env={**os.environ, "PYTHON": "false"}, capture_output=True, timeout=60)  # fmt: skip
    assert stale.returncode != 0  # another dependency set is not taken for this one


@pytest.mark.slow
def test_serve_script_starts_redis_and_stops_it_with_the_service() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (scripts/test.sh installs it)")
    port, redis_port = free_port(), free_port()
    env = {**os.environ, "CLIP_PORT": str(port), "REDIS_PORT": str(redis_port), "CLIP_LOG_LEVEL": "warning"}
    env.pop("CLIP_REDIS_URL", None)
    proc = subprocess.Popen(["bash", "scripts/serve.sh"], cwd=REPO, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        ready = False
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.5)
        assert ready, f"the service did not become ready (script exit {proc.poll()})"
        assert answers(redis_port), "serve.sh did not start redis-server on REDIS_PORT"
        health = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()
        assert "redis" in str(health).lower(), health
        proc.send_signal(signal.SIGTERM)  # what a supervisor sends to the script
        assert proc.wait(timeout=60) == 0
        assert not answers(redis_port), "the redis-server started by serve.sh outlived the service"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
