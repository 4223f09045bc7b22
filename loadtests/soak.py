"""Soak benchmark: minutes of mixed traffic with never-repeated images and texts, server RSS per second.

What it looks for is growth that never stops: caches and pools that fill and then hold (the
embedding LRU, the tokenizer's word cache, the truncation memo) show as a rise that flattens; a
leak shows as a slope that stays. Every request carries new content, so nothing is answered from
a cache: each image has its own pixel, each text its own made-up words (new BPE words too).

It starts the service on the committed default model (no Redis: the in-process caches are what
can grow), runs ``loadtests.run``'s closed loop with the ``mix`` blend plus unique texts, and
samples the server's resident set size (``/proc/<pid>/status``) every second. It prints the RSS
at fixed times, the slope over the last half of the run and the requests by status, and writes
the samples (CSV) and a plot (PNG) to ``--out``.

    .venv/bin/python -m loadtests.soak --duration 600 --concurrency 8 --out docs/images
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import io
import itertools
import os
import random
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from loadtests.benchmark import wait_ready
from loadtests.local_stack import free_port, stop_process
from loadtests.run import SHAPES, RequestSpec, run_load
from training.world.render import draw_scene_pil
from training.world.scene import Scene, SceneObject

ROOT = Path(__file__).resolve().parents[1]


class UniqueImages:
    """Base64 PNGs that never repeat: a few rendered scenes, each copy with one pixel set to a
    counter, encoded on demand (so a long run needs no pre-rendered pool)."""

    def __init__(self, px: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.bases = [
            np.asarray(
                draw_scene_pil(
                    Scene(objects=(SceneObject(s, c, "medium", 0.2, rng.uniform(0.3, 0.7), 0.5),), relation=None),
                    size=px,
                ).convert("RGB")
            )
            for s, c in itertools.product(SHAPES, ("red", "green", "blue"))
        ]
        self.count = 0

    def take(self) -> dict[str, str]:
        i, self.count = self.count, self.count + 1
        arr = self.bases[i % len(self.bases)].copy()
        arr[0, 0] = (i & 255, (i >> 8) & 255, (i >> 16) & 255)  # 16M distinct images per base
        arr[0, 1] = ((i >> 24) & 255, 0, 0)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        return {"data": base64.b64encode(buf.getvalue()).decode()}


def unique_word(rng: random.Random) -> str:
    """A made-up word the tokenizer has never seen (its BPE result is cached per distinct word)."""
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(6, 14)))


class Freshener:
    """Rewrites each request of the ``mix`` blend to carry new texts (its images are already new:
    they come from ``UniqueImages``)."""

    def __init__(self, dense: bool, seed: int = 0) -> None:
        self.dense, self.rng = dense, random.Random(seed)

    def __call__(self, spec: RequestSpec) -> RequestSpec:
        name, path, body = spec
        if path == "/score/dense" and not self.dense:  # a version without DCSM: embed the image instead
            name, path, body = "/embed", "/embed", {"images": [body["image"]]}
        body = dict(body)
        word = unique_word(self.rng)
        if "labels" in body:  # one new label among the fixed ones: its prompts are new texts
            body["labels"] = [*body["labels"][:-1], f"{word} shape"]
        if "texts" in body:
            body["texts"] = [*body["texts"][:-1], f"a red {word} to the left of a blue square"]
        if path == "/embed" and self.rng.random() < 0.5:  # /embed takes images or texts, not both
            body = {"texts": [f"a {word} circle", f"{unique_word(self.rng)} {unique_word(self.rng)}"]}
        if "difference" in body:
            body["difference"] = f"The first image is more {word}, while the second is less {word}."
        return name, path, body


def has_dcsm(url: str) -> bool:
    """Whether the serving version has a DCSM scorer (``/score/dense`` answers 404 otherwise)."""
    listing = httpx.get(f"{url}/models", timeout=30).json()
    serving = [v for m in listing["models"] for v in m["versions"] if v["serving"]]
    return bool(serving) and "dcsm" in serving[0]["components"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RssSampler(threading.Thread):
    """Samples a process's RSS once a second until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.samples = pid, []  # type: ignore[var-annotated]
        self._stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.wait(1.0):
            self.samples.append((time.monotonic() - self.t0, rss_mb(self.pid)))

    def stop(self) -> list[tuple[float, float]]:
        self._stop_event.set()
        self.join()
        return self.samples


def slope_mb_per_min(samples: list[tuple[float, float]], from_s: float) -> float:
    tail = [(t, r) for t, r in samples if t >= from_s]
    if len(tail) < 2:
        return float("nan")
    t, r = np.asarray(tail).T
    return float(np.polyfit(t / 60.0, r, 1)[0])


def plot(samples: list[tuple[float, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, r = np.asarray(samples).T
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=110)
    ax.plot(t / 60.0, r, lw=1.2)
    ax.set_xlabel("minutes of mixed traffic")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, max(r) * 1.1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--px", type=int, default=64, help="side of the sent images")
    parser.add_argument("--store", default=str(ROOT / "models"))
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--threads", type=int, default=None, help="the server's model threads")
    parser.add_argument("--out", type=Path, default=None, help="folder for soak_rss.csv and soak_rss.png")
    args = parser.parse_args(argv)

    port = free_port()
    env = {**os.environ, "CLIP_LOG_LEVEL": "warning"}
    env.pop("CLIP_REDIS_URL", None)
    if args.threads is not None:
        env["CLIP_TORCH_THREADS"] = str(args.threads)
    cmd = [sys.executable, "-m", "service", "--store", args.store, "--model", args.model, "--port", str(port)]
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        env["CLIP_ONNX_CACHE_DIR"] = tmp
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            start_rss = rss_mb(proc.pid)
            sampler = RssSampler(proc.pid)
            sampler.start()
            images = UniqueImages(args.px)
            result = asyncio.run(
                run_load(
                    url,
                    "mix",
                    concurrency=args.concurrency,
                    duration_s=args.duration,
                    pool=images,
                    on_request=Freshener(dense=has_dcsm(url)),
                    timeout_s=120,
                )
            )
            samples = sampler.stop()
        finally:
            stop_process(proc, grace_s=60)
    report(args, result, samples, start_rss, images.count)


def report(args: argparse.Namespace, result: Any, samples: list[tuple[float, float]], start: float, n: int) -> None:
    def at(seconds: float) -> str:
        near = [r for t, r in samples if t <= seconds]
        return f"{near[-1]:.0f}" if near else "n/a"

    marks = sorted({m for m in (60, 120, 300, args.duration / 2, args.duration) if m <= args.duration})
    half = args.duration / 2
    statuses: dict[int, int] = {}
    for st in result.endpoints.values():
        for code, count in st.statuses.items():
            statuses[code] = statuses.get(code, 0) + count
    print(f"soak: {args.duration:.0f} s, concurrency {args.concurrency}, {n} unique images, statuses {statuses}")
    print("| RSS MiB at | ready | " + " | ".join(f"{m / 60:.1f} min" for m in marks) + " | peak |")
    print("|---" * (len(marks) + 3) + "|")
    print(f"| | {start:.0f} | " + " | ".join(at(m) for m in marks) + f" | {max(r for _, r in samples):.0f} |")
    print(f"slope over the second half: {slope_mb_per_min(samples, half):+.2f} MiB/min")
    print(result.table())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "soak_rss.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["seconds", "rss_mib"])
            writer.writerows((f"{t:.1f}", f"{r:.1f}") for t, r in samples)
        title = f"{args.model}, mix + unique texts, concurrency {args.concurrency}"
        plot(samples, args.out / "soak_rss.png", title)
        print(f"wrote {args.out / 'soak_rss.csv'} and {args.out / 'soak_rss.png'}")


if __name__ == "__main__":
    main()
