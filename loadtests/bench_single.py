"""Single-request overhead: concurrency-1 image embeddings against the model-only batch-1 ceiling.

One client sends ``POST /embed`` with one new 224 px JPEG at a time (rendered before timing, so
the client's own encoding is not in the loop). Its throughput is divided by the image tower's
batch-1 throughput in-process, on the same backend, measured in blocks that alternate with the
requests (a few requests, then as many model calls, and so on): the ratio of the median call to
the median request is what a lone request keeps of the
model's speed, and 1 - ratio is what it pays outside the model (HTTP, JSON, base64, JPEG decode,
preprocessing, queue and thread hand-offs). From the service's ``X-Inference-Time`` header the
table also splits each request's latency into model time and the rest.

With ``--baseline-root`` (another checkout of the project, e.g. ``git archive <commit> | tar -x
-C DIR``) the service from that tree runs beside this one's, rounds alternating which goes first,
so before / after are measured in the same run on the same (possibly shared) machine.

    .venv/bin/python -m loadtests.bench_single --arch ViT-B-32 --duration 20 --rounds 3 --threads 2 \
        --baseline-root /tmp/baseline
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

from clipcore.models.bundle import ModelBundle
from loadtests.benchmark import model_ceiling, publish_random_arch, server
from loadtests.soak import UniqueImages
from model_store import ModelStore
from service.config import Settings
from service.runtime.assembly import serving_towers

ROOT = Path(__file__).resolve().parents[1]


def jpegs(n: int, px: int = 224) -> list[str]:
    """``n`` distinct base64 JPEGs (an 8x8 corner block carries the index; JPEG smooths single pixels)."""
    scenes = UniqueImages(px, seed=0)
    out = []
    for i in range(n):
        arr = scenes.bases[i % len(scenes.bases)].copy()
        arr[:8, :8] = (i & 255, (i >> 8) & 255, (i >> 16) & 255)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


def sequential(
    url: str, images: list[str], duration_s: float, model_call: Callable[[], object], block: int = 3, warmup: int = 5
) -> dict[str, float]:
    """Closed loop, one request at a time, for ``duration_s``, in blocks of ``block`` requests that
    alternate with ``block`` in-process model calls (batch 1): on a shared machine the two see the
    same minute, so their ratio holds where absolute figures drift. Returns req/s, latency, model
    time in the service (``X-Inference-Time``) and the in-process call, ms."""
    latency, model, direct = [], [], []
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(warmup):
            client.post("/embed", json={"images": [{"data": images[-1 - i]}]}).raise_for_status()
        model_call()
        busy, i, start = 0.0, 0, time.perf_counter()
        while time.perf_counter() - start < duration_s:
            t_block = time.perf_counter()
            for _ in range(block):
                t0 = time.perf_counter()
                r = client.post("/embed", json={"images": [{"data": images[i % (len(images) - warmup)]}]})
                latency.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
                model.append(float(r.headers.get("x-inference-time", "nan")))
                i += 1
            busy += time.perf_counter() - t_block
            for _ in range(block):
                t0 = time.perf_counter()
                model_call()
                direct.append((time.perf_counter() - t0) * 1000)
    return {
        "req_s": len(latency) / busy,
        "ceiling": 1000 / statistics.median(direct),
        "p50": statistics.median(latency),
        "model_p50": statistics.median(model),
        "outside_p50": statistics.median(a - b for a, b in zip(latency, model, strict=True)),
        "direct_p50": statistics.median(direct),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="ViT-B-32", help="random-weights open_clip architecture")
    parser.add_argument("--store", default=None, help="benchmark a stored version instead (with --model)")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per server run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ceiling-seconds", type=float, default=3.0, help="seconds of batch-1 calls for the ceiling")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads of the ceiling and the servers")
    parser.add_argument("--baseline-root", type=Path, default=None, help="another checkout to run beside this one")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="bench-single-") as tmp:
        if args.store is None:
            store = Path(tmp) / "store"
            ref = publish_random_arch(store, args.arch)
        else:
            store = Path(args.store).resolve()
            name, version = ModelStore(store).resolve(args.model)
            ref = f"{name}@{version}"
        bundle = ModelBundle.load(ModelStore(store), ref)
        served = Settings().model_copy(
            update={"onnx_cache_dir": Path(tmp) / "onnx", "torch_threads": args.threads or 0}
        )  # CLIP_BACKEND / CLIP_PRECISION from the environment, as the service reads them
        towers, backend = serving_towers(bundle, served, "cpu")

        one = np.random.default_rng(0).integers(0, 256, (1, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)

        def model_call() -> object:
            return towers.encode_images(one)

        ceiling = model_ceiling(towers.encode_images, bundle.image_size, [1], args.ceiling_seconds)[1][0]
        # Enough new images for a run at three times the ceiling, and never more than a closed loop
        # of HTTP requests can send (well under one per millisecond): a tiny model's ceiling is
        # thousands of images/s, and encoding that many JPEGs would take longer than the run.
        per_run = int(min(max(ceiling, 1.0) * 3, 1000) * args.duration) + 20
        images = jpegs(per_run * 2 * args.rounds + 20, px=224)
        print(f"\nmodel {ref}, backend {backend.split(' (')[0]}, threads {args.threads or 'default'}, "
              f"{os.cpu_count()} CPUs; one new JPEG per request\n")  # fmt: skip
        trees = {"this tree": ROOT}
        if args.baseline_root is not None:
            trees = {"baseline": args.baseline_root.resolve(), **trees}
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
        offset = 0
        for r in range(args.rounds):
            for label in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--store", str(store), "--model", ref]
                # The servers reuse the exports and the precision=auto decision made for the ceiling.
                with server(cmd, args.threads, cwd=trees[label], onnx_cache=Path(tmp) / "onnx") as url:
                    res = sequential(url, images[offset : offset + per_run], args.duration, model_call)
                offset += per_run
                res["ratio"] = res["direct_p50"] / res["p50"]  # medians: robust to stolen time slices
                rows[label].append(res)
                print(
                    f"round {r + 1} {label:10s} c=1 {res['req_s']:.2f} req/s, ceiling {res['ceiling']:.2f} "
                    f"images/s: {100 * res['ratio']:.0f}%; p50 {res['p50']:.1f} ms = model "
                    f"{res['model_p50']:.1f} + outside {res['outside_p50']:.1f}; "
                    f"in-process call {res['direct_p50']:.1f}",
                    flush=True,
                )
        print(
            "\n| server | c=1 req/s (per round) | batch-1 ceiling images/s | c=1 / ceiling (median) | p50 ms "
            "| model in the service ms (p50) | outside the model ms (p50) | in-process call ms (p50) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for label, runs in rows.items():
            med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            per_round = " / ".join(f"{run['req_s']:.2f}" for run in runs)
            print(f"| {label} | {per_round} | {med['ceiling']:.2f} "
                  f"| **{100 * med['ratio']:.0f}%** | {med['p50']:.1f} | {med['model_p50']:.1f} "
                  f"| {med['outside_p50']:.1f} | {med['direct_p50']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
