"""Serving a set of models: the memory each loaded model holds, and whether one model's batches delay another's.

``rss``: publishes ``--versions`` random-weights open_clip versions (ViT-B-32 by default; speed and
size do not depend on weight values) into a temporary store, then for each count in ``--counts``
starts ``python -m service`` serving that many of them as a set (``CLIP_MODEL=bench@v1,bench@v2,...``),
waits until every one is ready, sends one text and one image request to each and prints the
server's resident set size (VmRSS, and its peak VmHWM). ``--budget N`` adds a run of the largest
set under ``CLIP_MAX_LOADED_MODELS=N``, every model requested in turn twice (so models load on
request and unload), RSS read after each request.

``threads``: two of those versions loaded in this process as the service loads them, each a
``ModelRuntime``. Model B's image batcher is kept busy with batches of ``--busy-batch`` images while
model A's text batcher answers one text at a time; A's latency with B idle and with B busy, for
runtimes on their own model threads (what the service does) and on one shared model thread (the
alternative).

    .venv/bin/python -m loadtests.bench_served_set rss --counts 1 2 4 --budget 2
    .venv/bin/python -m loadtests.bench_served_set threads --busy-batch 16 --samples 20
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import numpy as np

from loadtests.benchmark import wait_ready
from loadtests.local_stack import free_port, stop_process
from model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]
NAME = "bench"


def publish_versions(root: Path, arch: str, count: int, fp16: bool = True) -> list[str]:
    """``count`` random-weights versions of ``arch`` as ``bench@v1..vN`` (each its own seed), with
    fp16 weight files (as training publishes) or fp32 ones (``fp16=False``: as ``clip-train import``
    stores an open_clip model)."""
    import open_clip
    import torch

    from clipcore.models.publish import TrainedModel, publish_bundle

    refs = []
    for seed in range(count):
        torch.manual_seed(seed)
        model = open_clip.create_model(arch, pretrained=None)
        manifest = publish_bundle(
            ModelStore(root),
            NAME,
            TrainedModel(model, {"open_clip_name": arch}, fp16=fp16, notes=f"random {arch} for benchmarks"),
            aliases=["production"] if seed == 0 else [],
        )
        refs.append(f"{NAME}@{manifest.version}")
        del model
    return refs


def rss_mib(pid: int) -> tuple[float, float]:
    """The process's resident set size and its peak (VmRSS, VmHWM), MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _image() -> dict[str, str]:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(buf, "PNG")
    return {"data": base64.b64encode(buf.getvalue()).decode()}


def serve_set(store: Path, refs: list[str], threads: int, budget: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "CLIP_LOG_LEVEL": "warning",
        "CLIP_STORE": str(store),
        "CLIP_MODEL": ",".join(refs),
        "CLIP_TORCH_THREADS": str(threads),
        "CLIP_MAX_LOADED_MODELS": str(budget),
        "CLIP_BATCHING__REQUEST_TIMEOUT_S": "600",  # a model loaded on request takes seconds
    }
    env.pop("CLIP_REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "service", "--port", str(port)], cwd=ROOT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def _all_ready(url: str, count: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = httpx.get(f"{url}/models", timeout=5).json().get("served", [])  # /readyz lists none by default
        if sum(m["state"] == "ready" for m in models) >= count:
            return
        time.sleep(0.5)
    raise SystemExit(f"{url}: not every model loaded")


def _use(client: httpx.Client, ref: str, image: dict[str, str]) -> None:
    for body in ({"texts": ["a photo of a red circle"]}, {"images": [image]}):
        r = client.post("/embed", json={**body, "model": ref})
        r.raise_for_status()


def _span(seconds: list[float], digits: int) -> str:
    """``min-max s`` of the calls, or ``none`` when there were none (every call found its model loaded, or none did)."""
    return f"{min(seconds):.{digits}f}-{max(seconds):.{digits}f} s" if seconds else "none"


def rss(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        store = Path(tmp)
        t0 = time.perf_counter()
        refs = publish_versions(store, args.arch, max(args.counts))
        print(f"published {len(refs)} random {args.arch} versions in {time.perf_counter() - t0:.0f} s")
        image = _image()
        print("| models served | loaded | RSS MiB | peak RSS MiB |")
        print("| --- | --- | --- | --- |")
        for count in args.counts:
            proc, url = serve_set(store, refs[:count], args.threads)
            try:
                wait_ready(url, proc, timeout_s=900)
                _all_ready(url, count)
                with httpx.Client(base_url=url, timeout=600) as client:
                    for ref in refs[:count]:
                        _use(client, ref, image)
                now, peak = rss_mib(proc.pid)
                print(f"| {count} | {count} | {now:.0f} | {peak:.0f} |")
            finally:
                stop_process(proc, grace_s=60)
        if args.budget:
            count = max(args.counts)
            proc, url = serve_set(store, refs[:count], args.threads, budget=args.budget)
            try:
                wait_ready(url, proc, timeout_s=900)
                samples, loads, hits = [], [], []
                with httpx.Client(base_url=url, timeout=600) as client:
                    for ref in [*refs[:count], *refs[:count]]:
                        states = {m["ref"]: m["state"] for m in client.get("/models").json()["served"]}
                        t0 = time.perf_counter()
                        _use(client, ref, image)
                        (hits if states[ref] == "ready" else loads).append(time.perf_counter() - t0)
                        samples.append(rss_mib(proc.pid)[0])
                now, peak = rss_mib(proc.pid)
                loaded = sum(m["state"] == "ready" for m in httpx.get(f"{url}/models").json()["served"])
                print(f"| {count}, max_loaded_models={args.budget} | {loaded} | {now:.0f} (max over requests "
                      f"{max(samples):.0f}) | {peak:.0f} |")  # fmt: skip
                print(f"\n{len(loads)} of {len(loads) + len(hits)} calls (a text, then an image) found their "
                      f"model unloaded and loaded it: {_span(loads, 1)}; "
                      f"with the model loaded: {_span(hits, 2)}")  # fmt: skip
            finally:
                stop_process(proc, grace_s=60)


async def _latencies(runtime: Any, samples: int) -> list[float]:
    batcher = runtime.text_batchers["base"]
    out = []
    for i in range(samples):
        t0 = time.perf_counter()
        await batcher.submit([f"a red circle number {i}"], timeout_s=600)
        out.append(time.perf_counter() - t0)
    return out


async def _isolation(bundles: list[Any], shared: bool, args: argparse.Namespace) -> dict[str, list[float]]:
    from service.config import Settings
    from service.runtime import assembly
    from service.runtime.metrics import ServiceMetrics

    settings = Settings(torch_threads=args.threads, batching={"max_queue_delay_s": None})
    metrics = ServiceMetrics()
    if shared:
        one = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, initializer=assembly._model_thread_init, initargs=(args.threads,)
        )
        with mock.patch.object(concurrent.futures, "ThreadPoolExecutor", lambda **_: one):
            runtimes = [assembly.build_runtime(b, settings, metrics) for b in bundles]
    else:
        runtimes = [assembly.build_runtime(b, settings, metrics) for b in bundles]
    a, b = runtimes
    for runtime in runtimes:
        await runtime.start()
    size = bundles[1].image_size
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)  # model input, as decoded
    await _latencies(a, 3)  # warm
    idle = await _latencies(a, args.samples)
    stop = asyncio.Event()

    async def keep_b_busy() -> None:
        while not stop.is_set():
            await b.image_batcher.submit([pixels] * args.busy_batch, timeout_s=600)

    busy_task = asyncio.create_task(keep_b_busy())
    await asyncio.sleep(0.5)
    busy = await _latencies(a, args.samples)
    stop.set()
    await busy_task
    t0 = time.perf_counter()
    await b.image_batcher.submit([pixels] * args.busy_batch, timeout_s=600)
    batch_s = time.perf_counter() - t0
    for runtime in runtimes:
        await runtime.stop()
    return {"idle": idle, "busy": busy, "batch": [batch_s]}


def threads(args: argparse.Namespace) -> None:
    import torch

    from clipcore.models.bundle import ModelBundle

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        store = Path(tmp)
        refs = publish_versions(store, args.arch, 2)
        bundles = [ModelBundle.load(ModelStore(store), ref, "cpu") for ref in refs]
        print(f"{args.arch}: model A answers one text at a time; model B runs batches of {args.busy_batch} images")
        print("| model threads | B | A's text latency p50 ms | p95 ms | max ms | one B batch s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for shared in (False, True):
            result = asyncio.run(_isolation(bundles, shared, args))
            for state in ("idle", "busy"):
                ms = np.asarray(result[state]) * 1000
                label = "one shared" if shared else "one per model"
                print(f"| {label} | {state} | {np.percentile(ms, 50):.0f} | {np.percentile(ms, 95):.0f} | "
                      f"{ms.max():.0f} | {result['batch'][0]:.2f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("rss", "threads"):
        p = sub.add_parser(name)
        p.add_argument("--arch", default="ViT-B-32")
        p.add_argument("--threads", type=int, default=1, help="intra-op threads per model thread")
        if name == "rss":
            p.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4])
            p.add_argument("--budget", type=int, default=0, help="also the largest set under this many loaded")
        else:
            p.add_argument("--busy-batch", type=int, default=16)
            p.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    rss(args) if args.command == "rss" else threads(args)


if __name__ == "__main__":
    main()
