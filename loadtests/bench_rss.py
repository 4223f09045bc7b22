"""Resident memory of the service with 1, 2 and 4 served versions of one architecture, idle and after
load, per additional model, beside Infinity serving the same number of models of the same size.

Publishes ``max(--counts)`` random-weights versions of ``--arch`` (ViT-B-32 by default; memory does
not depend on weight values) and, for each count, starts ``python -m service`` serving that many
as a set (``CLIP_MODEL=bench@v1,...``; ``CLIP_BACKEND`` / ``CLIP_PRECISION`` from the environment,
ONNX exports made once per run and shared), then reads the resident set size of the server's
process tree (VmRSS of the process and its children, MiB):

- **idle**: every model ready, before any request;
- **after load**: after ``--requests`` image requests (one new 224 px JPEG each, ``--concurrency``
  at a time, so batches form) and as many text requests per model.

``--baseline-root DIR`` runs the same from another checkout (e.g. ``git archive main | tar -x -C
DIR``) in the same run, rows interleaved. ``--infinity`` starts Infinity (``loadtests.peer``: its
own virtualenv, a ``transformers.CLIPModel`` of the same dimensions per model, torch engine, fp32 on
the CPU, one process serving ``count`` models) and measures it the same way. The per-model
increment is ``(RSS(count) - RSS(1)) / (count - 1)``.

    .venv/bin/python -m loadtests.bench_rss --counts 1 2 4 --threads 2 --infinity
    CLIP_BACKEND=onnx .venv/bin/python -m loadtests.bench_rss --counts 1 2 4 --threads 2 --infinity
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from loadtests.bench_served_set import publish_versions
from loadtests.benchmark import wait_ready
from loadtests.local_stack import free_port, stop_process
from loadtests.peer.benchmark import JpegPool, build_peer_model, ensure_infinity, infinity_process

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return out


def _tree_sum(pid: int, read: Callable[[int], float]) -> float:
    """``read(p)`` summed over ``pid`` and every descendant; a process that has ended counts 0."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += read(p)
        except OSError:
            continue
        todo += _children(p)
    return total


def _rss_kib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _cpu_ticks(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def tree_rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and every descendant, MiB (0 for a process that has ended)."""
    return _tree_sum(pid, _rss_kib) / 1024


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants so far (what a server spent,
    whatever else shares the machine: a figure other work moves much less than req/s)."""
    return _tree_sum(pid, _cpu_ticks) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` alone (0 once it has ended)."""
    try:
        return _cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def tree_processes(pid: int) -> list[tuple[int, str, float]]:
    """(pid, command line, RSS MiB) of ``pid`` and every descendant that is still running."""
    out: list[tuple[int, str, float]] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            command = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            out.append((p, command, _rss_kib(p) / 1024))
        except OSError:
            continue
        todo += _children(p)
    return out


@contextmanager
def service_set(
    store: Path, refs: list[str], threads: int, cwd: Path, onnx_cache: Path, python: str = sys.executable
) -> Iterator[tuple[int, str]]:
    """``python -m service`` from ``cwd`` serving ``refs`` as a set; (pid, url) once every one is ready."""
    port = free_port()
    env = {**os.environ, "CLIP_LOG_LEVEL": "warning", "CLIP_STORE": str(store), "CLIP_MODEL": ",".join(refs),
           "CLIP_TORCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "CLIP_ONNX_CACHE_DIR": str(onnx_cache), "CLIP_BATCHING__MAX_QUEUE_DELAY_S": "600",
           "CLIP_BATCHING__REQUEST_TIMEOUT_S": "600"}  # fmt: skip
    env.pop("CLIP_REDIS_URL", None)
    env.pop("PYTHONPATH", None)  # the checkout in cwd is what runs
    proc = subprocess.Popen([python, "-m", "service", "--port", str(port)], cwd=cwd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=1800)
        deadline = time.monotonic() + 1800
        while sum(m["state"] == "ready" for m in httpx.get(f"{url}/models", timeout=5).json().get("served", [])) < len(
            refs
        ):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{url}: not every model loaded")
            time.sleep(0.5)
        yield proc.pid, url
    finally:
        stop_process(proc, grace_s=60)


Request = Callable[[int], tuple[str, dict[str, object]]]


def service_requests(ref: str, pool: JpegPool) -> tuple[Request, Request]:
    def image(_: int) -> tuple[str, dict[str, object]]:
        return "/embed", {"model": ref, "images": [pool.take()]}

    def text(i: int) -> tuple[str, dict[str, object]]:
        return "/embed", {"model": ref, "texts": [f"a photo of shape number {i}, drawn in colour {i % 97}"]}

    return image, text


def infinity_requests(name: str, pool: JpegPool) -> tuple[Request, Request]:
    def image(_: int) -> tuple[str, dict[str, object]]:
        data = pool.take()["data"]
        return "/embeddings", {"model": name, "input": [f"data:image/jpeg;base64,{data}"], "modality": "image"}

    def text(i: int) -> tuple[str, dict[str, object]]:
        return "/embeddings", {"model": name, "input": [f"a photo of shape number {i}, drawn in colour {i % 97}"]}

    return image, text


def load(url: str, makers: list[tuple[Request, Request]], requests: int, concurrency: int) -> None:
    """``requests`` image and ``requests`` text requests per model, ``concurrency`` at a time."""
    calls = [maker for image, text in makers for maker in (image, text) for _ in range(requests)]
    with httpx.Client(base_url=url, timeout=600) as client:

        def send(i: int) -> None:
            path, body = calls[i](i)
            r = client.post(path, json=body)
            r.raise_for_status()

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(send, range(len(calls))))


def rss_by_mapping(pid: int) -> dict[str, float]:
    """Resident MiB of ``pid`` by mapping (``/proc/<pid>/smaps``): ``anonymous`` (heap, malloc arenas,
    thread stacks, tensors), each shared library by name (``libtorch_cpu.so``), other file-backed
    mappings by suffix (``file: .safetensors``: weights a runtime maps from their file), and
    ``[stack]`` / ``[vvar]``-style kernel mappings by name. Empty for a process that has ended."""
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return {}
    kib: dict[str, int] = {}
    name = "anonymous"
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":"):  # a mapping's header: address range, perms, offset, dev, inode[, path]
            path = " ".join(fields[5:])
            if path in ("", "[heap]") or path.startswith("[anon"):
                name = "anonymous"
            elif path.startswith("["):
                name = path
            elif ".so" in Path(path).name:
                name = Path(path).name.split(".so")[0] + ".so"
            else:
                name = f"file: {Path(path).suffix or Path(path).name}"
        elif fields[0] == "Rss:":
            kib[name] = kib.get(name, 0) + int(fields[1])
    return {k: v / 1024 for k, v in kib.items()}


def describe_mappings(groups: dict[str, float], top: int = 8) -> str:
    """``anonymous 1063; file: .safetensors 483; shared libraries 360 (libtorch_cpu.so 73, ...)``:
    groups of 1 MiB or more, shared libraries summed with the ``top`` largest named."""
    libs = {k: v for k, v in groups.items() if k.endswith(".so")}
    rest = sorted(((k, v) for k, v in groups.items() if k not in libs and v >= 1), key=lambda kv: -kv[1])
    largest = sorted(libs.items(), key=lambda kv: -kv[1])[:top]
    named = ", ".join(f"{k} {v:.0f}" for k, v in largest)
    return "; ".join([*(f"{k} {v:.0f}" for k, v in rest), f"shared libraries {sum(libs.values()):.0f} ({named})"])


def settle_rss(pid: int, seconds: float = 3.0) -> float:
    """RSS after ``seconds`` of quiet (the median of a few samples)."""
    samples = []
    for _ in range(5):
        time.sleep(seconds / 5)
        samples.append(tree_rss_mib(pid))
    return sorted(samples)[len(samples) // 2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--arch", default="ViT-B-32", help="open_clip architecture (random weights)")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of each server")
    parser.add_argument("--requests", type=int, default=32, help="image (and text) requests per model")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--baseline-root", type=Path, default=None, help="another checkout measured beside this one")
    parser.add_argument("--service-python", type=Path, default=None,
                        help="another interpreter running this checkout, measured beside (e.g. a virtualenv "
                        "with PyTorch's CPU build: its torch libraries differ from the CUDA build's)")  # fmt: skip
    parser.add_argument("--infinity", action="store_true", help="measure Infinity with the same counts")
    parser.add_argument("--infinity-venv", type=Path, default=ROOT / ".bench" / "infinity-venv")
    parser.add_argument("--infinity-batch-size", type=int, default=32)
    parser.add_argument("--breakdown", action="store_true", help="print each server's idle RSS by mapping")
    parser.add_argument("--weights-dtype", choices=["float16", "float32"], default="float16",
                        help="the versions' weight files: float16 as training publishes, float32 as `clip-train "
                        "import` stores an open_clip model (Infinity reads fp32 files)")  # fmt: skip
    args = parser.parse_args(argv)
    servers = [("service", ROOT, sys.executable)]
    if args.service_python is not None:
        servers.append((f"service ({args.service_python})", ROOT, str(args.service_python)))
    if args.baseline_root is not None:
        servers.append(("service (baseline)", args.baseline_root.resolve(), sys.executable))
    exe = ensure_infinity(args.infinity_venv) if args.infinity else None
    backend = f"CLIP_BACKEND={os.environ.get('CLIP_BACKEND', 'torch')} " + (
        f"CLIP_PRECISION={os.environ.get('CLIP_PRECISION', 'fp32')}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as tmp:
        store, onnx_cache = Path(tmp) / "store", Path(tmp) / "onnx"
        t0 = time.perf_counter()
        refs = publish_versions(store, args.arch, max(args.counts), fp16=args.weights_dtype == "float16")
        peers: list[Path] = []
        if exe is not None:
            for i in range(max(args.counts)):
                peers.append(Path(tmp) / f"hf-clip-{i}")
                build_peer_model(args.infinity_venv, args.arch, peers[-1])
        print(f"published {len(refs)} random {args.arch} versions in {time.perf_counter() - t0:.0f} s; service "
              f"{backend}; {args.threads} threads per server; {args.requests} image and text requests per model "
              f"at concurrency {args.concurrency}", flush=True)  # fmt: skip
        figures: dict[tuple[str, int], tuple[float, float]] = {}
        for count in args.counts:
            pool = JpegPool(seed=count)
            for label, cwd, python in servers:
                with service_set(store, refs[:count], args.threads, cwd, onnx_cache, python) as (pid, url):
                    idle = settle_rss(pid)
                    if args.breakdown:
                        parts = describe_mappings(rss_by_mapping(pid))
                        print(f"{label}: {count} model(s), idle MiB by mapping: {parts}", flush=True)
                    load(url, [service_requests(r, pool) for r in refs[:count]], args.requests, args.concurrency)
                    figures[label, count] = idle, settle_rss(pid)
                print(f"{label}: {count} model(s): idle {idle:.0f} MiB, after load {figures[label, count][1]:.0f} MiB",
                      flush=True)  # fmt: skip
            if exe is not None:
                names = {f"clip{i}": peers[i] for i in range(count)}
                with infinity_process(exe, names, args.threads, args.infinity_batch_size) as (proc, url):
                    idle = settle_rss(proc.pid)
                    if args.breakdown:
                        parts = describe_mappings(rss_by_mapping(proc.pid))
                        print(f"Infinity: {count} model(s), idle MiB by mapping: {parts}", flush=True)
                    load(url, [infinity_requests(n, pool) for n in names], args.requests, args.concurrency)
                    figures["Infinity 0.0.78 (torch fp32)", count] = idle, settle_rss(proc.pid)
                print(f"Infinity: {count} model(s): idle {idle:.0f} MiB, after load "
                      f"{figures['Infinity 0.0.78 (torch fp32)', count][1]:.0f} MiB", flush=True)  # fmt: skip
        print("\n| server | models | idle RSS MiB | after-load RSS MiB | per added model, idle / after load MiB |")
        print("|---|---|---|---|---|")
        for label in dict.fromkeys(label for label, _ in figures):
            first = min(c for lab, c in figures if lab == label)
            for count in args.counts:
                idle, after = figures[label, count]
                if count == first:
                    step = "-"
                else:
                    base_idle, base_after = figures[label, first]
                    span = count - first
                    step = f"{(idle - base_idle) / span:.0f} / {(after - base_after) / span:.0f}"
                print(f"| {label} | {count} | {idle:.0f} | {after:.0f} | {step} |")


if __name__ == "__main__":
    main()
