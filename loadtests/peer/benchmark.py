"""This service against Infinity (a maintained open-source embedding server), same architecture, same load.

Both serve a random-weights CLIP of one architecture (open_clip's ``--arch``, ViT-B-32 by default):
this service through open_clip, Infinity through a ``transformers.CLIPModel`` of the same dimensions
built by ``hf_clip_folder.py`` (the same tokenizer ids; speed does not depend on weight values).
Infinity runs in its own virtualenv (``--infinity-venv``; created on first use with
``infinity-emb[server,torch]==0.0.78``, ``aiohttp`` and ``numpy<2``: its ``vision`` extra would
downgrade torch), offline (``HF_HUB_OFFLINE=1``, ``DO_NOT_TRACK=1``) on 127.0.0.1, torch engine,
CPU (``--device cuda`` or ``cuda:N``: both servers on that GPU), no vector disk cache.

Load: one closed loop per (server, kind, concurrency), ``loadtests.run``'s runner; every image
request carries one new 224 px JPEG (never repeated, so no cache helps), every text request one
new sentence. This service answers images at ``POST /embed`` (``{"images": [{"data": ...}]}``),
Infinity at ``POST /embeddings`` (``{"input": ["data:image/jpeg;base64,..."], "modality":
"image"}``). Servers run one at a time with the same thread count, rounds alternate the order
(A B, then B A) so drift of a shared machine hits both, and the table prints each round's req/s
and the ratio of the medians. The model-only batch-1 ceiling of the image tower this service
serves (its backend and precision, from the environment) is measured in-process first, so
"% of ceiling" says what a single request pays outside the model.

    .venv/bin/python -m loadtests.peer.benchmark --arch ViT-B-32 --concurrency 1 8 32 --duration 15 --rounds 2 \
        --threads 2

``--models 2``: two versions of the architecture (each its own random weights) served by one
process of each server (this service's served set, ``CLIP_MODEL=bench@v1,bench@v2``; Infinity's
``v2 --model-id A --model-id B``), traffic split between them request by request (round robin: the
model named in the request's ``model`` field), the same load otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median

from PIL import Image

from loadtests.benchmark import model_ceiling, publish_random_arch, served_towers, server, wait_ready
from loadtests.local_stack import free_port, stop_process
from loadtests.run import RequestSpec, RunResult, run_load
from loadtests.soak import UniqueImages

ROOT = Path(__file__).resolve().parents[2]
INFINITY_PACKAGES = ["infinity-emb[server,torch]==0.0.78", "aiohttp", "numpy<2"]
SERVED_NAME = "clip"
KINDS = ("image", "text")


class JpegPool(UniqueImages):
    """New 224 px JPEGs on demand: the soak's scenes with an 8x8 corner block set to a counter
    (JPEG would smooth a single pixel away), so no two requests send the same bytes."""

    def __init__(self, px: int = 224, seed: int = 0) -> None:
        super().__init__(px, seed)

    def take(self) -> dict[str, str]:
        i, self.count = self.count, self.count + 1
        arr = self.bases[i % len(self.bases)].copy()
        arr[:8, :8] = (i & 255, (i >> 8) & 255, (i >> 16) & 255)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        return {"data": base64.b64encode(buf.getvalue()).decode()}


class Requests:
    """Turns each request of the runner into this kind's request for this server; with several
    ``models`` (the served names), requests take turns naming each (an even traffic split)."""

    def __init__(self, server_kind: str, kind: str, pool: JpegPool, models: list[str] | None = None) -> None:
        self.server_kind, self.kind, self.pool, self.n = server_kind, kind, pool, 0
        self.models = models or ([SERVED_NAME] if server_kind == "infinity" else [])

    def __call__(self, spec: RequestSpec) -> RequestSpec:
        self.n += 1
        pick = {"model": self.models[self.n % len(self.models)]} if self.models else {}
        if self.kind == "image":
            image = self.pool.take()["data"]
            if self.server_kind == "infinity":
                body = {**pick, "input": [f"data:image/jpeg;base64,{image}"], "modality": "image"}
                return "image", "/embeddings", body
            return "image", "/embed", {**pick, "images": [{"data": image}]}
        text = f"a photo of shape number {self.n} {random.random():.6f}, drawn in colour {self.n % 97}"
        if self.server_kind == "infinity":
            return "text", "/embeddings", {**pick, "input": [text]}
        return "text", "/embed", {**pick, "texts": [text]}


def ensure_infinity(venv: Path) -> Path:
    """The virtualenv's ``infinity_emb`` executable, installing the pinned packages on first use."""
    exe = venv / "bin" / "infinity_emb"
    if not exe.exists():
        print(f"installing {' '.join(INFINITY_PACKAGES)} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *INFINITY_PACKAGES], check=True)
    return exe


def build_peer_model(venv: Path, arch: str | Path, out: Path) -> None:
    """A Hugging Face CLIP folder (random weights) in ``out`` with the dimensions of ``arch``: an
    open_clip model name, or the path of an open_clip model config JSON."""
    import open_clip

    package = Path(open_clip.__file__).parent
    named = package / "model_configs" / f"{arch}.json"
    config = Path(arch) if isinstance(arch, Path) or not named.is_file() else named
    bpe = package / "bpe_simple_vocab_16e6.txt.gz"
    script = Path(__file__).with_name("hf_clip_folder.py")
    cmd = [str(venv / "bin" / "python"), str(script), "--config", str(config), "--bpe", str(bpe), "--out", str(out)]
    subprocess.run(cmd, check=True)


@contextmanager
def infinity_process(
    exe: Path, models: dict[str, Path], threads: int | None, batch_size: int, device: str = "cpu"
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """One Infinity process serving every folder of ``models`` under its name; (process, url) once ready."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    kind, _, index = device.partition(":")
    if index:  # Infinity takes "cuda", not "cuda:N": show it only device N
        env["CUDA_VISIBLE_DEVICES"] = index
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [str(exe), "v2"]
    for name, folder in models.items():  # repeated options: one per model (Infinity's v2 command)
        cmd += ["--model-id", str(folder), "--served-model-name", name]
    cmd += ["--engine", "torch", "--device", kind, "--no-vector-disk-cache", "--no-bettertransformer",
            "--batch-size", str(batch_size), "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=600, probe="/health")
        yield proc, url
    finally:
        stop_process(proc)


@contextmanager
def infinity_server(
    exe: Path, models: dict[str, Path], threads: int | None, batch_size: int, device: str = "cpu"
) -> Iterator[str]:
    """Infinity serving every folder of ``models`` under its name, in one process; its url once ready."""
    with infinity_process(exe, models, threads, batch_size, device) as (_, url):
        yield url


def measure(
    url: str, server_kind: str, kind: str, c: int, duration: float, pool: JpegPool, models: list[str] | None = None
) -> RunResult:
    return asyncio.run(
        run_load(
            url,
            "embed",
            concurrency=c,
            duration_s=duration,
            pool=pool,
            warmup=3,  # type: ignore[arg-type]
            on_request=Requests(server_kind, kind, pool, models),
            timeout_s=600,
        )  # fmt: skip
    )


def service_ceiling(
    store: Path, ref: str, threads: int | None, device: str, onnx_cache: Path, min_s: float = 4.0
) -> tuple[float, str]:
    """Batch-1 images/s (median call, in-process) of the image tower this service serves, and its
    backend: backend and precision from the environment, behind the parity gate, as the service
    reads them. The exports and any auto decision made here are those the service then reuses.
    ``min_s``: seconds of calls the median is taken over."""
    import torch

    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore

    if threads is not None:
        torch.set_num_threads(threads)
    bundle = ModelBundle.load(ModelStore(store), ref, device)
    towers, backend = served_towers(bundle, device, onnx_cache, threads)
    return model_ceiling(towers.encode_images, bundle.image_size, [1], min_s)[1][0], backend.split(" (")[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="ViT-B-32", help="open_clip architecture (random weights in both)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per (server, kind, concurrency)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating which server goes first")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads of both servers")
    parser.add_argument("--infinity-batch-size", type=int, default=32)
    parser.add_argument("--infinity-venv", type=Path, default=ROOT / ".bench" / "infinity-venv")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N, for both servers")
    parser.add_argument("--models", type=int, default=1, help="versions served by one process of each server, "
                        "traffic split evenly between them")  # fmt: skip
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        from loadtests.bench_cuda import cuda_or_exit

        cuda_or_exit(args.device, "peer.benchmark")
    os.environ["CLIP_DEVICE"] = args.device  # the service reads it (CLIP_PRECISION too, e.g. auto)

    exe = ensure_infinity(args.infinity_venv)
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        store, peer_dir = Path(tmp) / "store", Path(tmp) / "hf-clip"
        if args.models == 1:
            refs = [publish_random_arch(store, args.arch)]
            peers = {SERVED_NAME: peer_dir}
        else:
            from loadtests.bench_served_set import publish_versions

            refs = publish_versions(store, args.arch, args.models)
            peers = {f"{SERVED_NAME}{i}": Path(tmp) / f"hf-clip-{i}" for i in range(args.models)}
        for folder in peers.values():
            build_peer_model(args.infinity_venv, args.arch, folder)
        ref = refs[0]
        # One export and precision=auto / backend=auto decision for every round, as a deployment keeps them.
        onnx_cache = Path(tmp) / "onnx"
        ceiling, backend = service_ceiling(store, ref, args.threads, args.device, onnx_cache)
        print(
            f"\n{args.arch} (random weights); this service's image tower ({backend}), batch 1, in-process: "
            f"{ceiling:.2f} images/s"
            + (f"; {args.models} models per server, requests split evenly" if args.models > 1 else "")
        )
        pool = JpegPool()
        svc_cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--store", str(store), "--model",
                   ",".join(refs)]  # fmt: skip
        names = {"service": refs if args.models > 1 else [], "infinity": list(peers)}
        results: dict[tuple[str, str, int], list[float]] = {}
        order = ["infinity", "service"]
        for r in range(args.rounds):
            for server_kind in order if r % 2 == 0 else order[::-1]:
                if server_kind == "service":
                    context = server(svc_cmd, args.threads, onnx_cache=onnx_cache)
                else:
                    context = infinity_server(exe, peers, args.threads, args.infinity_batch_size, args.device)
                with context as url:
                    if server_kind == "service":
                        wait_every_model(url, len(refs))
                        print_auto_decision(onnx_cache)
                    for kind in args.kinds:
                        for c in args.concurrency:
                            run = measure(url, server_kind, kind, c, args.duration, pool, names[server_kind])
                            s = run.summary()[kind]
                            results.setdefault((server_kind, kind, c), []).append(s["throughput"])
                            print(
                                f"round {r + 1} {server_kind:8s} {kind:5s} c={c:<3d} {s['throughput']:.2f} req/s "
                                f"p50 {s['p50']:.0f} ms p99 {s['p99']:.0f} ms errors {s['errors']:.0f}",
                                flush=True,
                            )
        print_table(args, results, ceiling)


def wait_every_model(url: str, count: int, timeout_s: float = 1800) -> None:
    """Wait until every model of the served set is ready (``/readyz`` is ready with the first; ``/models``
    lists them all)."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while sum(m["state"] == "ready" for m in httpx.get(f"{url}/models", timeout=5).json().get("served", [])) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: not every model of the set loaded")
        time.sleep(0.5)


def print_auto_decision(onnx_cache: Path) -> None:
    """What ``precision=auto`` / ``backend=auto`` chose for the service, and every candidate's figure."""
    for path in sorted(onnx_cache.glob("auto/*/*.json")):
        record = json.loads(path.read_text())
        trials = ", ".join(
            f"{t['backend']} {t['precision']} "
            + ("refused" if t["refused"] else " / ".join(f"{v:.1f}" for v in t["images_per_s"].values()))
            for t in record["trials"]
        )
        decision = record["decision"]
        verb = "deferred, serving" if decision["outcome"] == "deferred" else "chose"
        chosen = f"{verb} {decision['backend']} {decision['precision']}"
        measured: dict[str, float] = next((t["images_per_s"] for t in record["trials"] if t["images_per_s"]), {})
        print(f"service auto {chosen} (images/s at batch {' / '.join(measured)}: {trials})")


def print_table(args: argparse.Namespace, results: dict[tuple[str, str, int], list[float]], ceiling: float) -> None:
    if args.models > 1:
        print(f"\n{args.models} models in one process of each server, requests split evenly between them")
    print("\n| kind | conc. | Infinity req/s (per round) | this service req/s (per round) | service / Infinity "
          "(medians) | service images/s, % of batch-1 ceiling |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for kind in args.kinds:
        for c in args.concurrency:
            inf, svc = results[("infinity", kind, c)], results[("service", kind, c)]
            ratio = median(svc) / median(inf) if median(inf) else float("inf")
            share = f"{100 * median(svc) / ceiling:.0f}%" if kind == "image" else ""
            print(f"| {kind} | {c} | {' / '.join(f'{x:.2f}' for x in inf)} | {' / '.join(f'{x:.2f}' for x in svc)} "
                  f"| **{ratio:.2f}x** | {share} |")  # fmt: skip


if __name__ == "__main__":
    main()
