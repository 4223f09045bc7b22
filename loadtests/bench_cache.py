"""Latency of cached embedding lookups: ``EmbeddingCache.get_many`` through the real cache.

Two layers, each with 1-key and 20-key lookups of stored embeddings (every lookup hits):

- ``lru``: the in-process LRU (what a repeated label or image costs on one replica);
- ``redis``: the LRU disabled, so every key goes to Redis in one MGET (what a replica that has
  not seen the key yet pays when another replica has). Without ``--redis-url`` a redis-server is
  started on a free 127.0.0.1 port in a temporary folder, persisting nothing.

The cache gets a ``ServiceMetrics`` as in the service, so the figures include observing
``clip_cache_lookup_seconds``; the event loop is uvloop when installed (uvicorn's default choice).

    .venv/bin/python -m loadtests.bench_cache
    .venv/bin/python -m loadtests.bench_cache --redis-url redis://127.0.0.1:6379/0 --n 5000 --dim 768
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from loadtests.local_stack import stop_process
from service.runtime.cache import EmbeddingCache, embedding_key
from service.runtime.metrics import ServiceMetrics

ROOT = Path(__file__).resolve().parents[1]

POOL = 2000  # distinct stored keys; lookups draw from them at random


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_redis() -> Iterator[str]:
    """A throwaway redis-server on 127.0.0.1; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed; pass --redis-url")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as workdir:
        cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", workdir]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop_process(proc, grace_s=10)


def stored_items(dim: int) -> dict[str, np.ndarray]:
    """``POOL`` normalised embeddings under real cache keys."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((POOL, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = [embedding_key("bench@v1", "text", "base", hashlib.sha256(str(i).encode()).hexdigest()) for i in range(POOL)]
    return dict(zip(keys, vectors, strict=True))


async def measure(
    cache: EmbeddingCache, keys: list[str], per_lookup: int, n: int, warmup: int
) -> tuple[np.ndarray, int]:
    """Seconds of ``n`` timed ``get_many`` calls of ``per_lookup`` random stored keys, and the misses."""
    rng = np.random.default_rng(per_lookup)
    samples = np.empty(n)
    misses = 0
    for i in range(-warmup, n):
        batch = [keys[j] for j in rng.choice(len(keys), per_lookup, replace=False)]
        t0 = time.perf_counter()
        values = await cache.get_many(batch)
        elapsed = time.perf_counter() - t0
        if i >= 0:
            samples[i] = elapsed
            misses += sum(v is None for v in values)
    return samples, misses


async def run(redis_url: str, sizes: Sequence[int], n: int, warmup: int, dim: int, timeout_s: float) -> list[str]:
    items = stored_items(dim)
    keys = list(items)
    rows = []
    # Filled by a cache with a generous timeout: storing the whole pool is one large pipeline.
    filler = EmbeddingCache(redis_url, lru_items=0, timeout_s=30.0)
    await filler.put_many(items)
    await filler.close()
    layers = {
        "lru": EmbeddingCache(None, lru_items=POOL, metrics=ServiceMetrics()),
        # lru_items=0: nothing is kept in process, so every lookup is one MGET round trip.
        "redis": EmbeddingCache(redis_url, lru_items=0, timeout_s=timeout_s, metrics=ServiceMetrics()),
    }
    await layers["lru"].put_many(items)
    for layer, cache in layers.items():
        for size in sizes:
            samples, misses = await measure(cache, keys, size, n, warmup)
            us = np.percentile(samples, [50, 95, 99]) * 1e6
            rows.append(
                f"| {layer} | {size} | {n} | {us[0]:.0f} | {us[1]:.0f} | {us[2]:.0f} | {samples.max() * 1e6:.0f} "
                f"| {misses} |"
            )
        await cache.close()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=None, help="an existing Redis (default: start one on 127.0.0.1)")
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 20], help="keys per get_many call")
    parser.add_argument("--n", type=int, default=3000, help="timed lookups per row")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--dim", type=int, default=512, help="embedding width (512: ViT-B-32)")
    parser.add_argument("--timeout", type=float, default=0.05, help="Redis call timeout (the service default)")
    parser.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    args = parser.parse_args(argv)

    loop_factory = None
    if args.loop != "asyncio":
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            if args.loop == "uvloop":
                raise SystemExit("uvloop is not installed") from None
    with local_redis() if args.redis_url is None else _given(args.redis_url) as url:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            rows = runner.run(run(url, args.keys, args.n, args.warmup, args.dim, args.timeout))
    loop = "uvloop" if loop_factory is not None else "asyncio"
    where = "started locally" if args.redis_url is None else args.redis_url
    print(f"EmbeddingCache.get_many, {args.dim}-d float16 values, {loop} loop, Redis {where}")
    print("misses: lookups answered None (a Redis error or timeout counts as a miss in the service too)\n")
    print("| layer | keys per lookup | lookups | p50 us | p95 us | p99 us | max us | misses |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    main()
