"""Service vs naive server vs model-only ceiling, on one model version, in one run.

1. Loads the model version in-process and measures the image tower's best throughput over a few
   batch sizes (the model-only ceiling: no HTTP, no decoding, no text work).
2. Starts ``python -m service`` (no Redis: the in-process LRU only) and ``loadtests/naive_server.py``
   on free 127.0.0.1 ports, both on the same ``name@version``.
3. Runs ``/classify`` (one image, the same 20 labels every time) and ``/rank-pair`` against each at
   concurrency 1, 8 and 32, with a fresh image in every request (images never repeat, so the
   service's embedding cache does not help; the repeated labels do hit its text cache, which is
   the point of the scenario), and prints throughput, latency and the ratios service / naive and
   service images/s over the ceiling.

The service runs the backend and precision of ``CLIP_BACKEND`` / ``CLIP_PRECISION`` (the naive
server always runs torch fp32, as a first server would); the ceiling is measured on the same
backend, with torch fp32's beside it.

``--arch ViT-B-32`` publishes a random-weights open_clip ViT-B-32 into a temporary store first
(speed does not depend on weight values) and benchmarks that instead of ``--model``.

    .venv/bin/python -m loadtests.benchmark --store models --model default@production
    .venv/bin/python -m loadtests.benchmark --arch ViT-B-32 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from clipcore.backends.base import ServingTowers
from clipcore.models.bundle import ModelBundle
from loadtests.bench_cuda import cuda_or_exit
from loadtests.local_stack import free_port, stop_process
from loadtests.run import ImagePool, RunResult, run_load
from model_store import ModelStore
from service.config import Settings
from service.runtime.assembly import resolve_device, serving_towers

ROOT = Path(__file__).resolve().parents[1]

ENDPOINTS = {"classify": ("/classify", 1), "rank-pair": ("/rank-pair", 2)}  # scenario -> (name, images/request)


def publish_random_arch(root: Path, arch: str | Path, aliases: tuple[str, ...] = ("production",)) -> str:
    """Publish a random-weights (seed 0) ``arch`` as ``bench`` under ``aliases``; returns its ref. ``arch``:
    an open_clip model name, or the path of an open_clip model config JSON (what ``--arch`` of the
    import command takes: ``clipcore.models.importing.resolve_architecture``)."""
    import torch

    from clipcore.models.clip_model import build_model
    from clipcore.models.importing import resolve_architecture
    from clipcore.models.preprocess import PreprocessConfig
    from clipcore.models.publish import TrainedModel, publish_bundle

    architecture, preprocess = resolve_architecture(str(arch))
    torch.manual_seed(0)
    if "open_clip_name" in architecture:
        import open_clip

        model: Any = open_clip.create_model(str(arch), pretrained=None)
    else:
        model = build_model(architecture)
    label = Path(arch).stem if str(arch).endswith(".json") else str(arch)
    trained = TrainedModel(model, architecture, fp16=True, notes=f"random {label} for benchmarks",
                           preprocess=PreprocessConfig.from_manifest(preprocess))  # fmt: skip
    manifest = publish_bundle(ModelStore(root), "bench", trained, aliases=list(aliases))
    return f"bench@{manifest.version}"


def model_ceiling(
    encode: Callable[[np.ndarray], np.ndarray], image_size: int, batch_sizes: list[int], min_s: float
) -> dict[int, tuple[float, float]]:
    """Image-tower images/s per batch size of ``encode`` on preprocessed uint8 input, in this process.

    From the median time of one call (at least 3 calls, ``min_s`` seconds in all): on a shared
    machine other processes steal whole time slices, and the median keeps those out of the ceiling.
    Returns ``{batch size: (images/s at the median call, images/s at the fastest call)}``.
    """
    rng = np.random.default_rng(0)
    out = {}
    for bs in batch_sizes:
        batch = rng.integers(0, 256, (bs, image_size, image_size, 3), dtype=np.uint8)
        encode(batch)  # warm-up
        times: list[float] = []
        t_start = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - t_start < min_s:
            t0 = time.perf_counter()
            encode(batch)
            times.append(time.perf_counter() - t0)
        out[bs] = (bs / float(np.median(times)), bs / min(times))
    return out


def served_towers(bundle: ModelBundle, device: str, onnx_cache: Path, threads: int | None) -> tuple[ServingTowers, str]:
    """The towers the service builds for ``bundle`` (CLIP_BACKEND, CLIP_PRECISION from the
    environment, behind the parity gate) and their description, with this run's export cache and
    threads: what a ceiling is measured on. Exports and auto decisions made here are the service's.
    The bundle's torch towers are kept (the service frees those it does not serve): the benchmark
    times torch fp32 beside them."""
    settings = Settings().model_copy(update={"onnx_cache_dir": onnx_cache, "torch_threads": threads or 0})
    return serving_towers(bundle, settings, device, keep_torch=True)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300, probe: str = "/readyz") -> None:
    """Wait until ``probe`` answers 200; exit when the server process ends or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server at {url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}{probe}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"{url} did not become ready")


@contextmanager
def logged_server(
    cmd: list[str], env: dict[str, str], log: Path, url: str, probe: str = "/readyz", cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` started with its output appended to ``log``, once ``probe`` answers (a failed start
    exits with the log's end); stopped when the block ends."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=out)
        try:
            try:
                wait_ready(url, proc, timeout_s=600, probe=probe)
            except SystemExit as exc:
                tail = log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"{exc}; its log ({log}) ends:\n{tail}") from None
            yield proc
        finally:
            stop_process(proc)


@contextmanager
def store_service(
    store: Path,
    ref: str,
    threads: int,
    cache: Path,
    settings: dict[str, str],
    log: Path | None = None,
    timeout_s: float = 1800,
) -> Iterator[str]:
    """A fresh ``python -m service`` serving ``ref`` from ``store`` with ``settings`` (``CLIP_*``
    variables) and the ONNX cache ``cache``, its output in ``log`` (default: inherited); its URL once
    ready, stopped (terminate, then kill) when the block ends."""
    port = free_port()
    env = {**os.environ, "CLIP_TORCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "CLIP_ONNX_CACHE_DIR": str(cache), **settings}  # fmt: skip
    env.pop("CLIP_REDIS_URL", None)
    cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--store", str(store),
           "--model", ref]  # fmt: skip
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("wb")) if log is not None else None
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, timeout_s=timeout_s)
            yield url
        finally:
            stop_process(proc)


@contextmanager
def server(
    cmd: list[str], threads: int | None = None, cwd: Path = ROOT, onnx_cache: Path | None = None
) -> Iterator[str]:
    """A server started from ``cwd`` (``python -m service`` there imports that checkout's code);
    ``onnx_cache``: its ONNX exports and ``precision=auto`` decisions (default: a new folder)."""
    port = free_port()
    env = {**os.environ, "CLIP_LOG_LEVEL": "warning"}
    if threads is not None:  # torch reads these at start: both servers get the same setting
        # CLIP_TORCH_THREADS: the service sets it on its model thread (and onnxruntime's sessions).
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CLIP_TORCH_THREADS=str(threads))
    env.pop("CLIP_REDIS_URL", None)
    # Throughput runs measure capacity: a closed loop of 32 clients on a large model queues more
    # than the default 2 s, which the service would answer with 429 by design.
    env.setdefault("CLIP_BATCHING__MAX_QUEUE_DELAY_S", "600")
    exports = tempfile.TemporaryDirectory(prefix="bench-service-onnx-")  # a backend=onnx export per run
    env["CLIP_ONNX_CACHE_DIR"] = str(onnx_cache or exports.name)
    proc = subprocess.Popen([*cmd, "--port", str(port)], cwd=cwd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        stop_process(proc)
        exports.cleanup()


def measure(url: str, scenario: str, concurrency: int, duration_s: float, pool: ImagePool, warmup: int) -> RunResult:
    return asyncio.run(
        run_load(url, scenario, concurrency=concurrency, duration_s=duration_s, pool=pool, warmup=warmup, timeout_s=600)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--arch", default=None, help="benchmark a random-weights open_clip architecture instead")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--scenarios", nargs="+", default=list(ENDPOINTS), choices=list(ENDPOINTS))
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per (server, scenario, concurrency)")
    parser.add_argument("--naive-duration", type=float, default=None, help="default: --duration")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pool", type=int, default=None, help="distinct images (default from the ceiling)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument(
        "--ceiling-seconds",
        type=float,
        default=None,
        help="seconds of in-process calls per batch size for the ceiling (default 2, 4 with --arch)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="intra-op threads for the ceiling and both servers (default: torch's own)",
    )
    args = parser.parse_args()
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)

    tmp = tempfile.TemporaryDirectory(prefix="bench-store-") if args.arch else None
    onnx_dir = tempfile.TemporaryDirectory(prefix="bench-onnx-")
    try:
        if tmp is not None:
            store_root = Path(tmp.name)
            t0 = time.perf_counter()
            ref = publish_random_arch(store_root, args.arch)
            print(f"published random {args.arch} as {ref} in {time.perf_counter() - t0:.0f} s")
        else:
            store_root = Path(args.store) if Path(args.store).is_absolute() else ROOT / args.store
            name, version = ModelStore(store_root).resolve(args.model)
            ref = f"{name}@{version}"  # pin the version: both servers must serve the same one

        # The ceiling is the service's own image tower (its device, backend and precision, behind the
        # same parity gate), so "% of ceiling" says what the serving path costs on top of the model.
        device = resolve_device(Settings().device)  # CLIP_DEVICE from the environment, as the service reads it
        if device.startswith("cuda"):  # both servers inherit CLIP_DEVICE (the naive server reads it too)
            cuda_or_exit(device, "benchmark")
        bundle = ModelBundle.load(ModelStore(store_root), ref, device)
        # Kept for the run: the service reuses the exports and the precision=auto decision made here.
        towers, backend = served_towers(bundle, device, Path(onnx_dir.name), args.torch_threads)
        min_s = args.ceiling_seconds or (2.0 if args.arch is None else 4.0)
        ceiling = model_ceiling(towers.encode_images, bundle.image_size, args.batch_sizes, min_s)
        reference = (
            model_ceiling(bundle.encode_images, bundle.image_size, args.batch_sizes, min_s)
            if backend != "torch fp32"
            else ceiling
        )
        best_bs = max(ceiling, key=lambda bs: ceiling[bs][0])
        best = ceiling[best_bs][0]
        image_size = bundle.image_size
        del bundle, towers  # free their memory before two servers load the same weights
        print(
            f"\nmodel {ref}, image size {image_size}, device {device}, service backend {backend.split(' (')[0]}, "
            f"torch intra-op threads per process: {args.torch_threads or f'default ({torch.get_num_threads()})'}\n"
        )
        print(
            "| batch size | service's image tower images/s (median call) | (fastest call) | torch fp32 (median) |\n"
            "|---|---|---|---|"
        )
        for bs, (ips, fastest) in ceiling.items():
            print(f"| {bs} | {ips:.1f} | {fastest:.1f} | {reference[bs][0]:.1f} |")
        print(f"\nceiling: {best:.1f} images/s at batch {best_bs}\n")

        per_run_images = best * args.duration * 2 * 1.5  # rank-pair sends 2 per request; headroom
        pool_size = args.pool or int(min(40_000, max(2_000, per_run_images * len(args.concurrency))))
        pool = ImagePool(pool_size, px=image_size, seed=1)
        store_arg = str(store_root)
        svc_cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--store", store_arg, "--model", ref]
        naive_cmd = [sys.executable, "-m", "loadtests.naive_server", "--store", store_arg, "--model", ref]
        results: dict[tuple[str, str, int], RunResult] = {}
        for label, cmd, duration in (
            ("service", svc_cmd, args.duration),
            ("naive", naive_cmd, args.naive_duration or args.duration),
        ):
            with server(cmd, args.torch_threads, onnx_cache=Path(onnx_dir.name)) as url:
                for scenario in args.scenarios:
                    for c in args.concurrency:
                        res = measure(url, scenario, c, duration, pool, args.warmup)
                        results[(label, scenario, c)] = res
                        s = res.summary()[ENDPOINTS[scenario][0]]
                        print(
                            f"{label:8s} {scenario:10s} c={c:<3d} {s['throughput']:.2f} req/s "
                            f"p50 {s['p50']:.0f} ms p99 {s['p99']:.0f} ms errors {s['errors']:.0f}",
                            flush=True,
                        )
        wrapped = pool.handed_out > len(pool.items)
        print(
            f"\n{pool.handed_out} images sent from a pool of {len(pool.items)}"
            f"{' (wrapped: some repeated)' if wrapped else ' (none repeated)'}\n"
        )
        print(
            "| endpoint | conc. | naive req/s | service req/s | service / naive | service images/s | "
            "% of ceiling | service p50 ms | service p99 ms | p99 / p50 | naive p50 ms | errors (svc/naive) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for scenario in args.scenarios:
            name, per_req = ENDPOINTS[scenario]
            for c in args.concurrency:
                sv = results[("service", scenario, c)].summary()[name]
                nv = results[("naive", scenario, c)].summary()[name]
                ratio = sv["throughput"] / nv["throughput"] if nv["throughput"] else float("inf")
                ips = sv["throughput"] * per_req
                print(
                    f"| {name} | {c} | {nv['throughput']:.2f} | {sv['throughput']:.2f} | {ratio:.1f}x | "
                    f"{ips:.1f} | {100 * ips / best:.0f}% | {sv['p50']:.1f} | {sv['p99']:.1f} | "
                    f"{sv['p99'] / sv['p50']:.2f} | {nv['p50']:.1f} | {sv['errors']:.0f}/{nv['errors']:.0f} |"
                )
    finally:
        onnx_dir.cleanup()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
