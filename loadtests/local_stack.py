"""What a load script or a test runs beside the service on 127.0.0.1, shared by ``tests/conftest.py``
and ``loadtests.faults``: a redis-server that may be killed and started again on its port, a tiny
random model published into a store, one value read off a server's ``/metrics``.

The tiny model is ``training/configs/shapes-smoke.json`` with random weights: fast to build, load
and run, and it answers every endpoint but ``/score/dense`` (it has no DCSM scorer).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = REPO / "training" / "configs" / "shapes-smoke.json"
UNEVALUATED = "random weights for tests and load runs: never evaluated"  # why their alias moves are forced
TINY_COMPARATIVES = [
    {"a": "red circle", "b": "blue circle", "text": "the first is red, while the second is blue."},
    {"a": "green square", "b": "green circle", "text": "the first has corners, while the second is round."},
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM ``proc`` and wait ``grace_s`` for it to exit (a server drains), then SIGKILL it."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def redis_server_command(port: int, workdir: Path) -> list[str]:
    """``redis-server`` on 127.0.0.1:``port`` that keeps nothing on disk (a cache for a test or a run)."""
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir)]  # fmt: skip


class RedisProcess:
    """A redis-server on a free 127.0.0.1 port, persisting nothing, that tests and fault runs may kill."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        cmd = redis_server_command(self.port, self.workdir)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def publish_tiny(
    root: Path | str,
    name: str = "tiny",
    *,
    seed: int = 0,
    aliases: tuple[str, ...] = ("production",),
    comparatives: list[dict[str, str]] | None = None,
    resize_mode: str | None = None,
) -> str:
    """Publish a random shapes-smoke model (plus a ``pcclip`` text variant) and return its version;
    ``resize_mode`` gives it preprocessing other than the default (``squash``, ``longest``).

    Its ``aliases`` move to it past the evaluation gate (forced, with the reason in the alias
    history): random weights have no evaluation, and neither has the version they replace."""
    import torch

    from clipcore.models.clip_model import build_model
    from clipcore.models.preprocess import PreprocessConfig
    from clipcore.models.publish import TrainedModel, publish_bundle
    from model_store import ModelStore

    config = json.loads(SMOKE_CONFIG.read_text())
    torch.manual_seed(seed)
    model = build_model(config)
    generator = torch.Generator().manual_seed(seed + 1)
    variant = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) if k.startswith("transformer.") else v
        for k, v in model.state_dict().items()
    }
    manifest = publish_bundle(
        ModelStore(root),
        name,
        TrainedModel(
            model,
            config,
            text_variants={"pcclip": variant},
            default_text_encoder="base",
            comparatives=TINY_COMPARATIVES if comparatives is None else comparatives,
            fp16=False,
            training={"seed": seed},
            metrics={"smoke.random": 0.5},
            **({"preprocess": PreprocessConfig(resize_mode=resize_mode)} if resize_mode else {}),
        ),
        aliases=list(aliases),
        force=bool(aliases),
        reason=UNEVALUATED if aliases else None,
    )
    return manifest.version


def metric_value(url: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` (``clip_model_swaps_total``, ``clip_batch_size_count``)
    whose labels include ``labels``; 0 when the metric has no such sample yet. A name the server
    does not export at all (a typo, a renamed metric) raises KeyError rather than reading as 0."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    known = False
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        known = known or name in {fam.name, *(fam.name + s for s in _SAMPLE_SUFFIXES)}
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    if not known:
        raise KeyError(f"{url}/metrics exports no metric called {name!r} (see docs/operations.md, Metrics)")
    return total


# The series a metric family exposes beside its own name (counters, histograms, summaries).
_SAMPLE_SUFFIXES = ("_total", "_created", "_count", "_sum", "_bucket")
