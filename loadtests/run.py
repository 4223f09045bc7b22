"""Closed-loop asyncio load runner: N concurrent clients, per-endpoint throughput and latency.

Each of ``--concurrency`` workers sends one request, waits for the answer, sends the next, until
``--duration`` seconds have passed or ``--requests`` requests were sent in all. At the end it
prints a markdown table per endpoint: requests, errors, error rate, throughput (successful
requests per second of wall time), p50 / p95 / p99 latency in ms.

Scenarios (``--scenario``):

- ``classify``: one image, the same 20 labels every time (their text embeddings are cacheable),
- ``classify-comparative``: the same with ``?comparative=true`` (the model's library),
- ``rank-pair``: two images and a difference text,
- ``dense``: ``/score/dense``, one image and 4 texts,
- ``embed``: ``/embed`` of one image,
- ``mix``: a weighted blend of the above (classify 40 %, rank-pair 25 %, embed 20 %,
  classify-comparative 10 %, dense 5 %).

Images come from a pool rendered before the run (shapes-world scenes, each with one pixel
changed so every picture has its own digest). With ``--pool`` at least the number of images the
run sends, no image repeats, so the service's embedding cache never hits: the figures are for
fresh images. Targets must be 127.0.0.1 / localhost.

    .venv/bin/python -m loadtests.run --url http://127.0.0.1:8000 --scenario mix --concurrency 8 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import numpy as np
from PIL import Image

from training.world.render import draw_scene_pil
from training.world.scene import Scene, SceneObject

ROOT = Path(__file__).resolve().parents[1]

SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple")
# 20 labels, identical in every request: the realistic "fixed label set" classification load.
LABELS_20 = [f"{c} {s}" for c in ("red", "green", "blue", "yellow") for s in SHAPES]
DIFFERENCE = "The first image contains a larger shape, while the second contains a smaller shape."
DENSE_TEXTS = [
    "a red circle to the left of a blue square",
    "a blue circle to the left of a red square",
    "a red circle to the right of a blue square",
    "a square without a triangle",
]
MIX_WEIGHTS = {"classify": 40, "rank-pair": 25, "embed": 20, "classify-comparative": 10, "dense": 5}
SCENARIOS = ("classify", "classify-comparative", "rank-pair", "dense", "embed", "mix")


class ImagePool:
    """Pre-rendered base64 PNGs handed out in order; distinct digests until the pool wraps."""

    def __init__(self, size: int, px: int = 224, seed: int = 0) -> None:
        rng = random.Random(seed)
        bases = []
        for shape, colour in itertools.product(SHAPES, COLOURS):
            obj = SceneObject(shape, colour, "medium", 0.16, rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7))
            bases.append(np.asarray(draw_scene_pil(Scene(objects=(obj,), relation=None), size=px).convert("RGB")))
        self.items: list[str] = []
        for i in range(size):
            arr = bases[i % len(bases)].copy()
            # One pixel encodes the index: every picture differs, the content stays the scene's.
            k = i // len(bases)
            arr[k // px % px, k % px] = (i * 37 % 256, i * 91 % 256, i % 256)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="PNG")
            self.items.append(base64.b64encode(buf.getvalue()).decode())
        self._next: Iterator[str] = itertools.cycle(self.items)
        self.handed_out = 0

    def take(self) -> dict[str, str]:
        self.handed_out += 1
        return {"data": next(self._next)}


class ImageSource(Protocol):
    """Where requests get their images: ``ImagePool``, or ``loadtests.soak.UniqueImages``."""

    def take(self) -> dict[str, str]: ...


RequestSpec = tuple[str, str, dict[str, Any]]  # (endpoint name, path, JSON body)
# Called with each request's endpoint name, its start (time.perf_counter()) and its response, or
# the transport error it ended with (refused, reset, timed out).
ResultHook = Callable[[str, float, httpx.Response | httpx.HTTPError], None]


def make_request(scenario: str, pool: ImageSource, rng: random.Random) -> RequestSpec:
    if scenario == "mix":
        names, weights = zip(*MIX_WEIGHTS.items(), strict=True)
        scenario = rng.choices(names, weights)[0]
    if scenario == "classify":
        return "/classify", "/classify", {"images": [pool.take()], "labels": LABELS_20}
    if scenario == "classify-comparative":
        return (
            "/classify?comparative=true",
            "/classify?comparative=true",
            {"images": [pool.take()], "labels": LABELS_20},
        )
    if scenario == "rank-pair":
        return "/rank-pair", "/rank-pair", {"image_a": pool.take(), "image_b": pool.take(), "difference": DIFFERENCE}
    if scenario == "dense":
        return "/score/dense", "/score/dense", {"image": pool.take(), "texts": DENSE_TEXTS}
    if scenario == "embed":
        return "/embed", "/embed", {"images": [pool.take()]}
    raise ValueError(f"unknown scenario {scenario!r}; known: {SCENARIOS}")


@dataclass
class EndpointStats:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.latencies_ms) + self.errors


@dataclass
class RunResult:
    scenario: str
    concurrency: int
    wall_s: float
    endpoints: dict[str, EndpointStats]

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for name, st in sorted(self.endpoints.items()):
            lat = np.asarray(st.latencies_ms) if st.latencies_ms else np.asarray([np.nan])
            out[name] = {
                "requests": st.requests,
                "errors": st.errors,
                "error_rate": st.errors / st.requests if st.requests else 0.0,
                "throughput": len(st.latencies_ms) / self.wall_s if self.wall_s > 0 else 0.0,
                "p50": float(np.percentile(lat, 50)),
                "p95": float(np.percentile(lat, 95)),
                "p99": float(np.percentile(lat, 99)),
            }
        return out

    def table(self) -> str:
        rows = [
            "| endpoint | requests | errors | error rate | throughput req/s | p50 ms | p95 ms | p99 ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, s in self.summary().items():
            lat = " | ".join("n/a" if np.isnan(s[q]) else f"{s[q]:.1f}" for q in ("p50", "p95", "p99"))
            rows.append(
                f"| {name} | {s['requests']:.0f} | {s['errors']:.0f} | {s['error_rate']:.2%} | "
                f"{s['throughput']:.2f} | {lat} |"
            )
        return "\n".join(rows)


def check_local(url: str) -> None:
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"load tests only target 127.0.0.1 (got {host!r})")


async def run_load(
    url: str,
    scenario: str,
    *,
    concurrency: int,
    duration_s: float | None = None,
    requests: int | None = None,
    pool: ImageSource,
    warmup: int = 0,
    seed: int = 0,
    timeout_s: float = 120.0,
    on_request: Callable[[RequestSpec], RequestSpec] | None = None,
    on_result: ResultHook | None = None,
    stop: threading.Event | None = None,
    think_s: float = 0.0,
) -> RunResult:
    """Run one closed-loop load; ``warmup`` requests (sequential, not counted) go first. It ends
    after ``duration_s``, ``requests`` or once ``stop`` is set, whichever comes first. Each client
    waits ``think_s`` between an answer and its next request (0: the load saturates the server)."""
    check_local(url)
    if duration_s is None and requests is None:
        raise ValueError("give a duration or a request count")
    rng = random.Random(seed)
    stats: dict[str, EndpointStats] = {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        for _ in range(warmup):
            _, path, body = make_request(scenario, pool, rng)
            await client.post(path, json=body)
        sent = 0
        start = time.perf_counter()
        deadline = start + duration_s if duration_s is not None else float("inf")

        async def worker() -> None:
            nonlocal sent
            while (
                time.perf_counter() < deadline
                and (requests is None or sent < requests)
                and (stop is None or not stop.is_set())
            ):
                sent += 1
                spec = make_request(scenario, pool, rng)
                if on_request is not None:
                    spec = on_request(spec)
                name, path, body = spec
                st = stats.setdefault(name, EndpointStats())
                t0 = time.perf_counter()
                outcome: httpx.Response | httpx.HTTPError
                try:
                    outcome = await client.post(path, json=body)
                    status = outcome.status_code
                except httpx.HTTPError as exc:
                    outcome, status = exc, 0  # connection-level failure
                elapsed = (time.perf_counter() - t0) * 1000
                if on_result is not None:
                    on_result(name, t0, outcome)
                st.statuses[status] = st.statuses.get(status, 0) + 1
                if status == 200:
                    st.latencies_ms.append(elapsed)
                else:
                    st.errors += 1
                if think_s > 0:
                    await asyncio.sleep(think_s)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return RunResult(scenario, concurrency, wall, stats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--scenario", choices=SCENARIOS, default="mix")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=None, help="seconds (default 10 unless --requests)")
    parser.add_argument("--requests", type=int, default=None, help="stop after this many requests in all")
    parser.add_argument("--warmup", type=int, default=5, help="sequential requests before timing")
    parser.add_argument("--pool", type=int, default=2000, help="distinct images rendered before the run")
    parser.add_argument("--px", type=int, default=224, help="side of the rendered test images")
    args = parser.parse_args(argv)
    check_local(args.url)
    duration = args.duration if args.duration is not None or args.requests is not None else 10.0
    pool = ImagePool(args.pool, args.px)
    result = asyncio.run(
        run_load(
            args.url,
            args.scenario,
            concurrency=args.concurrency,
            duration_s=duration,
            requests=args.requests,
            pool=pool,
            warmup=args.warmup,
        )
    )
    wrapped = " (the image pool wrapped: some images repeat)" if pool.handed_out > len(pool.items) else ""
    print(
        f"scenario {args.scenario}, concurrency {args.concurrency}, wall {result.wall_s:.1f} s, "
        f"{pool.handed_out} images sent{wrapped}\n"
    )
    print(result.table())
    codes = {n: s.statuses for n, s in result.endpoints.items() if s.errors}
    if codes:
        print(f"\nstatus codes of endpoints with errors: {codes}")


if __name__ == "__main__":
    main()
