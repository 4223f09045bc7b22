"""``precision=auto`` decided beside a CPU-burning neighbour: what the node then serves on a quiet
machine, against every candidate pinned.

The acceptance of a noise-proof ``auto``: a first start that shares the CPU with other work must
not leave the node serving a slow backend for the life of the version. This script makes that
start happen and measures its outcome as a user sees it, served requests per second:

1. one random-weights open_clip ``--arch`` (ViT-B-32 by default) is published into a new store;
2. ``--burners`` busy-loop processes start, then the service with ``CLIP_PRECISION=auto`` and an
   empty ONNX cache (a new node: it exports, gates and times every candidate while they burn);
   the burners stop once it is ready, and its first decision (``GET /models``) is printed;
3. the script waits (at most ``--settle-s``) until the decision is final: chosen, or deferred with
   its background re-timing (which runs once the server is idle) used up or decided;
4. one server per candidate with ``CLIP_BACKEND`` / ``CLIP_PRECISION`` pinned starts (reusing the
   exports of step 2), and every server's image throughput is measured at each ``--concurrency``,
   one server at a time, in ``--rounds`` rounds that alternate the order; each request carries a
   new 224 px JPEG, so no cache helps.

Printed: each server's req/s per round, the medians, and the auto server's median over the fastest
pinned one's (the aim: within 10 %, i.e. 0.90 or more).

    .venv/bin/python -m loadtests.bench_auto_noise --arch ViT-B-32 --threads 2 --burners 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from loadtests.benchmark import publish_random_arch, store_service
from loadtests.local_stack import stop_process
from loadtests.peer.benchmark import JpegPool, measure

ROOT = Path(__file__).resolve().parents[1]
BURN = "while True: pass"


@contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` processes that each keep one core busy until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            stop_process(proc, grace_s=2)


def service(store: Path, ref: str, threads: int, cache: Path, settings: dict[str, str]) -> AbstractContextManager[str]:
    """``python -m service`` with ``settings`` (``CLIP_*``): a closed loop of 8 clients on a large
    model may queue longer than the default 2 s, which the service would answer with 429 by design."""
    quiet = {"CLIP_LOG_LEVEL": "warning", "CLIP_BATCHING__MAX_QUEUE_DELAY_S": "600"}
    return store_service(store, ref, threads, cache, {**quiet, **settings})


def auto_entry(url: str) -> dict[str, Any]:
    """The serving version's ``auto`` entry of ``GET /models`` (empty when the backend was pinned)."""
    (model,) = httpx.get(f"{url}/models", timeout=30).json()["models"]
    (serving,) = [v for v in model["versions"] if v["serving"]]
    return dict(serving.get("auto") or {})


def final(entry: dict[str, Any]) -> bool:
    """Whether nothing will change the decision any more without a new load."""
    if entry.get("outcome") != "deferred":
        return True
    retime = entry.get("retime")
    return retime is None or retime["attempts"] >= retime["max_attempts"]


def describe(entry: dict[str, Any]) -> str:
    margin = f", margin {entry['margin']:.2f}x" if entry.get("margin") is not None else ""
    spread = f", spread {entry['spread']:.2f}" if entry.get("spread") is not None else ""
    retime = entry.get("retime") or {}
    tries = f", re-timed {retime['attempts']} of {retime['max_attempts']}" if retime else ""
    reason = f" ({entry['reason']})" if entry.get("reason") else ""
    return f"{entry['outcome']}: {entry['backend']} {entry['precision']}{margin}{spread}{tries}{reason}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="ViT-B-32", help="open_clip architecture (random weights)")
    parser.add_argument("--store", type=Path, help="serve --model from this store instead of a random --arch")
    parser.add_argument("--model", help="with --store: the version to serve (NAME@VERSION or NAME@ALIAS)")
    parser.add_argument("--candidates", nargs="+", help="pinned servers, as 'BACKEND PRECISION' (default: every "
                        "candidate auto times on this CPU)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2, help="torch / OMP threads of every server")
    parser.add_argument("--burners", type=int, default=2, help="busy-loop processes during the first start")
    parser.add_argument("--settle-s", type=float, default=900.0, help="longest wait for a final decision")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per (server, concurrency)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating the order of the servers")
    args = parser.parse_args(argv)
    if (args.store is None) != (args.model is None):
        parser.error("--store and --model go together")

    from clipcore.backends.auto import candidates

    with tempfile.TemporaryDirectory(prefix="bench-auto-noise-") as tmp, ExitStack() as stack:
        cache = Path(tmp) / "onnx"
        if args.store is not None:
            store, ref, what = args.store, args.model, args.model
        else:
            store = Path(tmp) / "store"
            ref, what = publish_random_arch(store, args.arch), f"{args.arch} (random weights)"
        started = time.monotonic()
        with burners(args.burners):
            auto_url = stack.enter_context(service(store, ref, args.threads, cache, {"CLIP_PRECISION": "auto"}))
        ready_s = time.monotonic() - started
        entry = auto_entry(auto_url)
        print(f"{what}, first start beside {args.burners} burner(s): ready in {ready_s:.0f} s, {describe(entry)}")
        deadline = time.monotonic() + args.settle_s
        while not final(entry) and time.monotonic() < deadline:
            time.sleep(5)
            entry = auto_entry(auto_url)
        print(f"after {time.monotonic() - started:.0f} s, burners gone: {describe(entry)}", flush=True)

        urls = {"auto": auto_url}
        pins = [tuple(c.split()) for c in args.candidates] if args.candidates else candidates("cpu")
        for backend, precision in pins:
            pinned = {"CLIP_BACKEND": backend, "CLIP_PRECISION": precision}
            urls[f"{backend} {precision}"] = stack.enter_context(service(store, ref, args.threads, cache, pinned))
        served = [k for k in urls if k != "auto"]
        pool = JpegPool()
        results: dict[tuple[str, int], list[float]] = {}
        order = list(urls)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                for c in args.concurrency:
                    s = measure(urls[name], "service", "image", c, args.duration, pool).summary()["image"]
                    results.setdefault((name, c), []).append(s["throughput"])
                    print(f"round {r + 1} {name:12s} c={c:<3d} {s['throughput']:.2f} req/s errors {s['errors']:.0f}",
                          flush=True)  # fmt: skip
        print(f"\nauto, decided beside {args.burners} burner(s), then: {describe(auto_entry(auto_url))}\n")
        print("| server | " + " | ".join(f"c={c} req/s (per round)" for c in args.concurrency) + " |")
        print("|---|" + "---|" * len(args.concurrency))
        for name in urls:
            cells = [" / ".join(f"{v:.2f}" for v in results[(name, c)]) for c in args.concurrency]
            print(f"| {name} | " + " | ".join(cells) + " |")
        for c in args.concurrency:
            fastest = max(served, key=lambda k: median(results[(k, c)]))
            ratio = median(results[("auto", c)]) / median(results[(fastest, c)])
            print(f"c={c}: auto / fastest pinned ({fastest}) = {ratio:.2f}")


if __name__ == "__main__":
    main()
