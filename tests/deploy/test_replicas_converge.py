"""Two replicas on one model store follow every alias move of ``model-store`` under steady load.

Two ``python -m service`` processes (the replicas of a Deployment) serve ``split@production``
from one local store in tmp and poll it every ``WATCH_S``. Four clients send ``/embed`` with a
new caller key each time, alternating between the replicas, while the real ``model-store`` CLI
starts a canary, promotes it and rolls the promotion back. No
request fails, and after each move both replicas serve the same primary and canary (read from
``GET /models``) and route one caller key to the same version. How long each replica took is
printed; it is asserted only against a generous bound (the machine may be shared).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.local_stack import free_port, stop_process

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WATCH_S = 0.5
BOUND_S = 120.0  # generous: only a replica that never converges fails the test


def _state(url: str) -> tuple[str | None, str | None]:
    """(primary, canary) of the replica's only entry, as ``name@version``."""
    served = httpx.get(f"{url}/models", timeout=10).json()["served"][0]
    return served["serving"], served.get("canary")


@pytest.fixture
def replicas(tmp_path: Path, publish_model: Any) -> Iterator[tuple[Path, list[str]]]:
    store = tmp_path / "store"
    publish_model(store, "split", seed=81)  # v1, production
    publish_model(store, "split", seed=82, aliases=())  # v2
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIP_")}
    env.update({"CLIP_WATCH_INTERVAL_S": str(WATCH_S), "CLIP_LOG_LEVEL": "warning"})
    procs, urls, logs = [], [], []
    try:
        for i in range(2):
            port = free_port()
            log = (tmp_path / f"replica-{i}.log").open("wb")
            logs.append(log)
            cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)]
            cmd += ["--store", str(store), "--model", "split@production"]
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        for proc, url, i in zip(procs, urls, range(2), strict=True):
            while True:
                assert proc.poll() is None, (tmp_path / f"replica-{i}.log").read_text()
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"replica {i} not ready"
                time.sleep(0.1)
        yield store, urls
    finally:
        for proc in procs:
            proc.terminate()  # both drain at once
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()


def _model_store(store: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "model_store.cli", *args, "--store", str(store)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_replicas_follow_canary_promote_and_rollback_under_load(replicas: tuple[Path, list[str]]) -> None:
    store, urls = replicas
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=60) as c:
            i = seed
            while not stop.is_set():
                i += 1
                url = urls[i % 2]
                headers = {"X-Canary-Key": f"caller-{rng.getrandbits(64):x}"}
                try:
                    r = c.post(f"{url}/embed", json={"texts": ["a red circle"]}, headers=headers)
                    answers.append((r.status_code, r.json().get("model", r.text)))
                except httpx.HTTPError as exc:  # a dropped connection is a failed request too
                    answers.append((0, f"{type(exc).__name__}: {exc}"))

    def converge(want: tuple[str, str | None], move: str) -> None:
        moved = time.monotonic()
        took = []
        for url in urls:
            while _state(url) != want:
                assert time.monotonic() - moved < BOUND_S, f"{url} did not converge to {want} after {move}"
                time.sleep(0.05)
            took.append(time.monotonic() - moved)
        print(f"{move}: both replicas at {want} after {', '.join(f'{t:.2f}s' for t in took)} (watch {WATCH_S}s)")
        # The same caller key gets the same version from either replica.
        with httpx.Client(timeout=60) as c:
            for key in (f"probe-{i}" for i in range(12)):
                got = {
                    c.post(f"{url}/embed", json={"texts": ["a"]}, headers={"X-Canary-Key": key}).json()["model"]
                    for url in urls
                }
                assert len(got) == 1, (key, got)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        forced = ("--force", "--reason", "random weights, never evaluated")  # the gate has nothing to compare
        _model_store(store, "canary", "split", "v2", "--alias", "production", "--weight", "30", *forced)
        converge(("split@v1", "split@v2"), "canary v2 at 30 %")
        _model_store(store, "promote", "split", "v2", "--alias", "production", *forced)
        converge(("split@v2", None), "promote v2")
        _model_store(store, "rollback", "split", "--alias", "production")
        converge(("split@v1", None), "rollback of the promotion")
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    failed = [a for a in answers if a[0] != 200]
    assert len(answers) > 100 and not failed, (len(answers), failed[:5])
    assert {model for _, model in answers} == {"split@v1", "split@v2"}
