"""What a shadow costs the answers: primary latency with the shadow off and on, one server, one run.

The source version (``--store``/``--model``, by default the committed default model) is
published twice into a temporary store: v1 is ``production``, v2 its copy, the shadow (so every
shadow run does the primary's work again, and the comparison says agreement 1.0). One
``python -m service`` serves ``production``; each round has a block with the shadow off and one
with it on at ``--fraction`` (set and removed through ``ModelStore.shadow``, applied at the next
poll), in alternating order, so both conditions see the same minutes of a possibly shared
machine; a first round is not counted. Each request is ``POST /embed`` of one new image (images
never repeat: no cache hit hides the model's work), from ``--concurrency`` closed-loop clients
that each pause ``--think-ms`` after an answer (0: back to back, the server never idle); the
latency is the client's, start of request to end of answer.

Prints p50 / p99 / mean per condition over all rounds, the on / off ratios, each round's p50s,
and what the shadow did (sampled, compared, dropped, failed) with the cosine it measured.
``--quiet-ms 0,5`` starts one server per value of ``CLIP_SHADOW_QUIET_MS`` on the same store and
measures each in every round, one after the other: the shadow starting as soon as no request is
in flight against it waiting for a 5 ms gap, under the same minutes of the machine.

    .venv/bin/python -m loadtests.bench_shadow --requests 200 --rounds 8 --threads 1
    .venv/bin/python -m loadtests.bench_shadow --requests 200 --rounds 8 --threads 1 --think-ms 20
    .venv/bin/python -m loadtests.bench_shadow --requests 100 --rounds 8 --threads 1 --quiet-ms 0,5
    .venv/bin/python -m loadtests.bench_shadow --store models --model default@production --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests.benchmark import server
from loadtests.run import ImagePool
from model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]


def copy_twice(source: ModelStore, ref: str, target: ModelStore) -> str:
    """Publish ``ref``'s files twice into ``target`` (v1 as production, v2 a copy); its name."""
    name, version = source.resolve(ref)
    manifest = source.manifest(name, version)
    fields = {k: v for k, v in json.loads(manifest.to_json()).items() if k not in ("files", "version")}
    files = {f: source.file_path(name, version, f) for f in manifest.files}
    target.publish(name, files, fields, aliases=["production"])
    target.publish(name, files, fields)
    return name


def shadow_totals(url: str, name: str) -> dict[str, Any]:
    """The server's shadow summary of /embed (compared, dropped, failed, mean_cosine) so far."""
    shadow = httpx.get(f"{url}/models/{name}", timeout=10).json()["shadow"]
    return dict(shadow["endpoints"].get("/embed", {}))


def wait_for(url: str, name: str, shadow_on: bool, timeout_s: float = 300) -> None:
    """Until the server has the shadow loaded (or has none)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shadow = httpx.get(f"{url}/models/{name}", timeout=10).json().get("shadow")
        if (shadow is not None and shadow["loaded"]) if shadow_on else shadow is None:
            return
        time.sleep(0.1)
    raise SystemExit(f"the server did not {'load' if shadow_on else 'drop'} the shadow in {timeout_s:.0f}s")


async def block(url: str, images: list[str], concurrency: int, think_s: float = 0.0) -> list[float]:
    """Latency (ms) of one /embed per image, from ``concurrency`` closed-loop clients that pause
    ``think_s`` after each answer."""
    todo = iter(images)
    latencies: list[float] = []

    async def client(c: httpx.AsyncClient) -> None:
        for image in todo:
            started = time.perf_counter()
            r = await c.post("/embed", json={"images": [{"data": image}]})
            latencies.append((time.perf_counter() - started) * 1000)
            r.raise_for_status()
            if think_s:
                await asyncio.sleep(think_s)

    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
    return latencies


def figures(latencies: list[float]) -> tuple[float, float, float]:
    a = np.asarray(latencies)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=str(ROOT / "models"))
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--fraction", type=float, default=0.2, help="shadow fraction while on (default 0.2)")
    parser.add_argument("--requests", type=int, default=300, help="requests per condition per round")
    parser.add_argument("--rounds", type=int, default=3, help="off/on pairs, alternating")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--think-ms", type=float, default=0.0, help="each client's pause after an answer")
    parser.add_argument(
        "--quiet-ms",
        default=None,
        help="comma-separated CLIP_SHADOW_QUIET_MS values: one server each, on the same store, measured in the "
        "same rounds (default: one server with the default setting)",
    )
    parser.add_argument("--warmup", type=int, default=20, help="requests before each block, not counted")
    parser.add_argument("--threads", type=int, default=None, help="torch / OMP threads of the server")
    parser.add_argument("--px", type=int, default=224, help="side of the request images")
    args = parser.parse_args()

    quiets: list[str | None] = [q.strip() for q in args.quiet_ms.split(",")] if args.quiet_ms else [None]
    per_block = args.warmup + args.requests
    pool = ImagePool(2 * len(quiets) * (args.rounds + 1) * per_block, px=args.px).items
    shadowed = {q: {"compared": 0, "dropped": 0, "failed": 0} for q in quiets}
    cosines: list[float] = []
    think_s = args.think_ms / 1000
    with tempfile.TemporaryDirectory(prefix="bench-shadow-") as tmp, contextlib.ExitStack() as servers:
        store = ModelStore(tmp)
        name = copy_twice(ModelStore(args.store), args.model, store)
        cmd = [sys.executable, "-m", "service", "--store", tmp, "--model", f"{name}@production"]
        os.environ["CLIP_WATCH_INTERVAL_S"] = "0.5"  # the server's poll: shadow on / off apply within it
        urls: dict[str | None, str] = {}
        for quiet in quiets:  # each server reads its setting at start
            if quiet is not None:
                os.environ["CLIP_SHADOW_QUIET_MS"] = quiet
            urls[quiet] = servers.enter_context(server(cmd, threads=args.threads))
        results: dict[tuple[str | None, str], list[float]] = {(q, c): [] for q in quiets for c in ("off", "on")}
        per_round: list[dict[tuple[str | None, str], float]] = []  # p50 of each block: the spread between rounds
        images = iter(pool)
        # Round -1 is not counted: the first blocks after a start run slower (first calls,
        # the cache and the allocator growing), whichever condition they measure.
        for r in range(-1, args.rounds):
            per_round.append({})
            # Alternate which goes first, so a drift of the machine's speed weighs on both alike.
            for condition in ("off", "on") if r % 2 == 0 else ("on", "off"):
                if condition == "on":
                    store.shadow(name, "production", "v2", fraction=args.fraction)
                else:
                    store.shadow(name, "production", None)
                for url in urls.values():
                    wait_for(url, name, condition == "on")
                for quiet in quiets if r % 2 == 0 else quiets[::-1]:
                    url = urls[quiet]
                    # Two "on" blocks in a row share one shadow period: count what each block adds.
                    before = shadow_totals(url, name) if condition == "on" else {}
                    batch = [next(images) for _ in range(per_block)]
                    asyncio.run(block(url, batch[: args.warmup], args.concurrency, think_s))
                    latencies = asyncio.run(block(url, batch[args.warmup :], args.concurrency, think_s))
                    if r < 0:
                        continue
                    results[quiet, condition] += latencies
                    per_round[-1][quiet, condition] = figures(latencies)[0]
                    if condition == "on":  # what the shadow did, read before it is removed (with its totals)
                        time.sleep(1.0)  # the last sampled requests finish
                        after = shadow_totals(url, name)
                        for key in shadowed[quiet]:
                            shadowed[quiet][key] += after.get(key, 0) - before.get(key, 0)
                        if after.get("mean_cosine") is not None:
                            cosines.append(after["mean_cosine"])
    print(f"model {args.model} from {args.store}, shadow {name}@v2 (a copy) at fraction {args.fraction:g}")
    print(f"{args.rounds} rounds x {args.requests} requests per condition, concurrency {args.concurrency}, "
          f"think {args.think_ms:g} ms, server threads {args.threads or 'default'}")  # fmt: skip
    for quiet in quiets:
        off, on = figures(results[quiet, "off"]), figures(results[quiet, "on"])
        print()
        if quiet is not None:
            print(f"server with CLIP_SHADOW_QUIET_MS={quiet}:")
        print("| shadow | requests | p50 ms | p99 ms | mean ms |")
        print("|---|---|---|---|---|")
        for label in ("off", "on"):
            p50, p99, mean = off if label == "off" else on
            print(f"| {label} | {len(results[quiet, label])} | {p50:.2f} | {p99:.2f} | {mean:.2f} |")
        print()
        print(f"ratio on / off: p50 {on[0] / off[0]:.3f}, p99 {on[1] / off[1]:.3f}, mean {on[2] / off[2]:.3f}")
        rounds = ", ".join(f"{b[quiet, 'off']:.2f} / {b[quiet, 'on']:.2f}" for b in per_round[1:])
        print(f"p50 ms off / on per round: {rounds}")
        done = shadowed[quiet]
        print(
            f"shadow: {sum(done.values())} of {args.rounds * per_block} requests sampled ({done['compared']} "
            f"compared, {done['dropped']} dropped, {done['failed']} failed), mean cosine to the answers sent "
            f"{min(cosines, default=float('nan')):.6f} (lowest round)"
        )


if __name__ == "__main__":
    main()
