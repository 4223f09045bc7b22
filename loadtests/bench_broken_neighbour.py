"""A model that cannot load, requested every 0.5 s, beside a healthy model under a memory budget.

Publishes three random-weights versions of ``--arch`` (a small open_clip config by default:
``loadtests/tiny_vit.json``) into a temporary store and flips one byte of the third one's weights
(bit rot: its checksum fails). Starts ``python -m service`` serving ``bench@v1,bench@v2,bench@v3``
under ``CLIP_MAX_LOADED_MODELS=2``: the default model (v1, never unloaded) and the healthy one (v2)
fill the budget, and the broken one (v3) would load on request. Then:

1. ``--seconds`` of a closed-loop client on the healthy model alone (``/embed``, one image per
   request, never the same image twice, so the embedding cache never answers);
2. ``--seconds`` of the same client while a second one requests the broken model every
   ``--interval`` seconds.

Prints the healthy model's requests, p50 and p99 in both phases and their ratios, what the broken
model's requests got, and from /metrics how often the healthy model was unloaded and loaded again
and how many loads of the broken one were tried. ``--service-root`` starts the service from
another checkout (its ``python -m service``), to measure a version before a change with the same
client.

    .venv/bin/python -m loadtests.bench_broken_neighbour --seconds 15
    .venv/bin/python -m loadtests.bench_broken_neighbour --seconds 15 --service-root /tmp/before
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from loadtests.benchmark import publish_random_arch, wait_ready
from loadtests.local_stack import free_port, metric_value, stop_process
from loadtests.soak import UniqueImages
from model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]
DEFAULT, HEALTHY, BROKEN = "bench@v1", "bench@v2", "bench@v3"


@dataclass
class Phase:
    latencies_ms: list[float] = field(default_factory=list)
    failed: Counter[int] = field(default_factory=Counter)  # status -> count of the healthy model's non-200s
    broken: Counter[int] = field(default_factory=Counter)  # status -> count of the broken model's answers

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


def publish(root: Path, arch: str) -> None:
    """``bench@v1..v3`` (the same random weights); v3's largest weight file gets one byte flipped."""
    for i in range(3):  # only v1 takes production: the gate refuses a move between unevaluated versions
        publish_random_arch(root, arch, aliases=("production",) if i == 0 else ())
    folder = ModelStore(root).version_dir("bench", "v3")
    weights = max(folder.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    weights.write_bytes(bytes(raw))


@contextlib.contextmanager
def service(store: Path, threads: int, service_root: Path, log: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIP_")}
    env |= {
        "PYTHONPATH": str(service_root),  # that checkout's service, whatever PYTHONPATH this process has
        "CLIP_LOG_LEVEL": "info",
        "CLIP_STORE": str(store),
        "CLIP_MODEL": ",".join((DEFAULT, HEALTHY, BROKEN)),
        "CLIP_MAX_LOADED_MODELS": "2",
        "CLIP_TORCH_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    with log.open("wb") as out:
        cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.Popen(cmd, cwd=service_root, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            deadline = time.monotonic() + 300
            while not any(m["ref"] == HEALTHY and m["state"] == "ready" for m in _served(url)):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{HEALTHY} did not load within the budget at start")
                time.sleep(0.2)
            yield url
        finally:
            stop_process(proc)


def _served(url: str) -> list[dict[str, str]]:
    return list(httpx.get(f"{url}/models", timeout=10).json().get("served", []))  # /readyz lists none by default


def healthy_loop(url: str, seconds: float, phase: Phase, images: UniqueImages) -> None:
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < deadline:
            body = {"images": [images.take()], "model": HEALTHY}
            start = time.perf_counter()
            r = client.post("/embed", json=body)
            if r.status_code == 200:
                phase.latencies_ms.append((time.perf_counter() - start) * 1000)
            else:
                phase.failed[r.status_code] += 1


def broken_loop(url: str, seconds: float, interval_s: float, phase: Phase, stop: threading.Event) -> None:
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < deadline and not stop.is_set():
            sent = time.monotonic()
            r = client.post("/embed", json={"texts": ["a red circle"], "model": BROKEN})
            phase.broken[r.status_code] += 1
            stop.wait(max(0.0, interval_s - (time.monotonic() - sent)))


def metric(url: str, name: str, **labels: str) -> str:
    """A /metrics value as text; ``n/a`` when the server does not export that metric (an older one)."""
    try:
        return f"{metric_value(url, name, **labels):.0f}"
    except KeyError:
        return "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default=str(ROOT / "loadtests" / "tiny_vit.json"),
                        help="open_clip model name or config JSON (default: loadtests/tiny_vit.json)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between requests for the broken model")
    parser.add_argument("--threads", type=int, default=1, help="CLIP_TORCH_THREADS of the service")
    parser.add_argument("--service-root", type=Path, default=ROOT, help="checkout whose `python -m service` runs")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-broken-") as tmp:
        store = Path(tmp) / "store"
        publish(store, args.arch)
        log = Path(tmp) / "service.log"
        with service(store, args.threads, args.service_root.resolve(), log) as url:
            images = UniqueImages(px=96)
            # A few requests first: the model thread's first batches are slower.
            healthy_loop(url, 1.0, Phase(), images)
            alone = Phase()
            healthy_loop(url, args.seconds, alone, images)
            beside = Phase()
            stop = threading.Event()
            broken = threading.Thread(target=broken_loop, args=(url, args.seconds, args.interval, beside, stop))
            broken.start()
            try:
                healthy_loop(url, args.seconds, beside, images)
            finally:
                stop.set()
                broken.join(timeout=180)
            loads = metric(url, "clip_model_loads_total", model=HEALTHY)
            unloads = metric(url, "clip_model_unloads_total", model=HEALTHY)
            failures = metric(url, "clip_model_load_failures_total", model=BROKEN)
            skipped = metric(url, "clip_model_loads_skipped_total", model=BROKEN)
            states = {m["ref"]: m["state"] for m in _served(url)}

    print(f"service from {args.service_root.resolve()}; arch {Path(args.arch).name}; {args.seconds:g} s per phase; "
          f"{BROKEN} (corrupt) requested every {args.interval:g} s in the second phase")  # fmt: skip
    print()
    print(f"| phase | {HEALTHY} answered | non-200 | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for name, phase in (("alone", alone), ("broken neighbour", beside)):
        failed = ", ".join(f"{n}x {status}" for status, n in sorted(phase.failed.items())) or "0"
        print(f"| {name} | {len(phase.latencies_ms)} | {failed} | {phase.quantile(0.5):.1f} | "
              f"{phase.quantile(0.99):.1f} |")  # fmt: skip
    print()
    ratio = len(beside.latencies_ms) / len(alone.latencies_ms) if alone.latencies_ms else float("nan")
    p50, p99 = (beside.quantile(q) / alone.quantile(q) for q in (0.5, 0.99))
    print(f"requests with / without the broken neighbour: {ratio:.2f}; p50 {p50:.2f}x, p99 {p99:.2f}x")
    answers = ", ".join(f"{n}x {status}" for status, n in sorted(beside.broken.items()))
    print(f"{BROKEN} requests: {sum(beside.broken.values())} ({answers})")
    healthy_reloads = "n/a" if loads == "n/a" else str(int(loads) - 1)  # its load at start is the first
    print(f"{HEALTHY}: unloaded {unloads}x, loaded again {healthy_reloads}x; "
          f"{BROKEN}: loads tried and failed {failures}, 503s without a load {skipped}; states at the end: "
          f"{', '.join(f'{ref} {state}' for ref, state in states.items())}")  # fmt: skip


if __name__ == "__main__":
    main()
