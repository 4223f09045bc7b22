"""Cold start: time from a fresh process to ``/readyz`` with ``CLIP_PRECISION=auto``, with and
without a decision shared through the store by ``clip-train tune``, against Infinity on the same
architecture; and where the time of a first start goes.

One random-weights open_clip ``--arch`` (ViT-B-32 by default) is published into two copies of one
store: one never tuned, one where ``clip-train tune`` (run once here, timed) wrote the decision
and the winner's graphs for this CPU kind. Each round starts, in turn, fresh processes (each with
an empty ONNX cache, as a new pod has) of:

- ``first``: the service on the untuned store: every candidate is exported, gated and timed;
- ``restart``: the service again with the cache ``first`` left (a restarted container: the local
  decision and exports are reused);
- ``shared``: the service on the tuned store with an empty cache (a new pod of a tuned CPU kind:
  the graphs are copied from the store, the winner gated, nothing exported or timed);
- ``infinity``: Infinity 0.0.78 (torch engine) on the same architecture (``loadtests.peer``), when
  its virtualenv exists (``--infinity-venv``; ``python -m loadtests.peer.benchmark`` creates it).

Rounds alternate the order, so drift of a shared machine reaches every kind alike. The seconds of
each start and the ratios of the medians are printed; then a breakdown of a first start measured
in a separate process, step by step as the server loads (model load, each candidate's export and
gate, the timing rounds), and of a shared start (copy of the graphs, gate of the winner).

    .venv/bin/python -m loadtests.bench_cold_start --arch ViT-B-32 --threads 2 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import httpx

from loadtests.benchmark import publish_random_arch, store_service
from loadtests.peer.benchmark import build_peer_model, infinity_server

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("first", "restart", "shared", "infinity")
LOADED = re.compile(r"loaded \S+ on \S+ in ([0-9.]+)s")


def service(store: Path, ref: str, threads: int, cache: Path, log: Path) -> contextlib.AbstractContextManager[str]:
    """A fresh ``python -m service`` with ``precision=auto``, its log (info) in ``log``."""
    settings = {"CLIP_LOG_LEVEL": "info", "CLIP_PRECISION": "auto"}
    return store_service(store, ref, threads, cache, settings, log=log, timeout_s=900)


def start_service(store: Path, ref: str, threads: int, cache: Path, log: Path) -> dict[str, object]:
    started = time.perf_counter()
    with service(store, ref, threads, cache, log) as url:
        ready = time.perf_counter() - started
        (model,) = httpx.get(f"{url}/models", timeout=30).json()["models"]
        auto = next(v for v in model["versions"] if v["serving"])["auto"] or {}
    found = LOADED.search(log.read_text(errors="replace"))
    return {
        "ready_s": ready,
        "load_s": float(found.group(1)) if found else None,
        "outcome": auto.get("outcome"),
        "serving": f"{auto.get('backend')} {auto.get('precision')}",
        "timing_s": auto.get("seconds") if auto.get("outcome") in ("chosen", "deferred") else 0.0,
        "decision": auto.get("decision"),
    }


def start_infinity(exe: Path, model_dir: Path, threads: int) -> dict[str, object]:
    started = time.perf_counter()
    with infinity_server(exe, model_dir, threads, 32):
        return {"ready_s": time.perf_counter() - started}


def phases(store: str, ref: str, threads: int) -> dict[str, float]:
    """A first start's steps, in this process, as the server takes them (seconds)."""
    import torch

    from clipcore.backends import auto
    from clipcore.backends.select import select_towers
    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore
    from service.runtime.assembly import warm_up

    torch.set_num_threads(threads)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    bundle = ModelBundle.load(ModelStore(store), ref)
    out["model load (read, verify, build)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm_up(bundle)
    out["warm-up"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="cold-phases-") as cache:
        built = []
        for backend, precision in auto.candidates("cpu"):
            t0 = time.perf_counter()
            towers, _ = select_towers(bundle, backend=backend, precision=precision, device="cpu",
                                      onnx_cache_root=Path(cache), threads=threads)  # fmt: skip
            out[f"build {backend} {precision} (export, load, gate)"] = time.perf_counter() - t0
            built.append(towers)
        t0 = time.perf_counter()
        auto.time_rounds([t.encode_images for t in built], bundle.image_size, 1.0)
        out["timing rounds"] = time.perf_counter() - t0
    return out


def shared_phases(store: str, ref: str, threads: int) -> dict[str, float]:
    """A shared start's steps: the graphs copied from the store, the winner built and gated."""
    import torch

    from clipcore.backends import shared
    from clipcore.backends.select import select_towers
    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore

    torch.set_num_threads(threads)
    model_store = ModelStore(store)
    bundle = ModelBundle.load(model_store, ref)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cold-shared-") as cache:
        key, _ = shared.shared_key("cpu", threads, "auto")
        found = model_store.artifacts(bundle.name, bundle.version, key)
        assert found is not None, f"no shared decision for {key}"
        t0 = time.perf_counter()
        pair = (str(found.meta["backend"]), str(found.meta["precision"]))
        if found.files:
            from clipcore.backends.onnx_export import export_dir_for

            target = export_dir_for(Path(cache), bundle, "int8" if pair[1] == "int8" else "fp32")
            shared._fetch_export(model_store, found, target)
        out["copy the shared graphs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        select_towers(bundle, backend=pair[0], precision=pair[1], device="cpu", onnx_cache_root=Path(cache),
                      threads=threads)  # fmt: skip
        out[f"build {pair[0]} {pair[1]} (load, gate)"] = time.perf_counter() - t0
    return out


def in_child(kind: str, store: Path, ref: str, threads: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "loadtests.bench_cold_start", "--child", kind, str(store), ref, str(threads)]
    done = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="ViT-B-32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--infinity-venv", type=Path, default=ROOT / ".bench" / "infinity-venv")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, store, ref, threads = args.child
        print(json.dumps((phases if kind == "phases" else shared_phases)(store, ref, int(threads))))
        return
    exe = args.infinity_venv / "bin" / "infinity_emb"
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp_name:
        tmp = Path(tmp_name)
        untuned, tuned = tmp / "store", tmp / "store-tuned"
        ref = publish_random_arch(untuned, args.arch)
        shutil.copytree(untuned, tuned)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "training.cli", "tune", ref, "--store", str(tuned),
                        "--threads", str(args.threads)], cwd=ROOT, check=True)  # fmt: skip
        tune_s = time.perf_counter() - started
        peer_dir = None
        if exe.exists():
            peer_dir = tmp / "peer-model"
            build_peer_model(args.infinity_venv, args.arch, peer_dir)
        results: dict[str, list[dict[str, object]]] = {kind: [] for kind in KINDS}
        for r in range(args.rounds):
            order = ["first", "restart", "shared", "infinity"]
            if r % 2:
                order = ["infinity", "shared", "first", "restart"]  # restart follows its first start
            cache = tmp / f"cache-first-{r}"
            for kind in order:
                if kind == "infinity":
                    if peer_dir is not None:
                        results[kind].append(start_infinity(exe, peer_dir, args.threads))
                    continue
                store, kind_cache = (tuned, tmp / f"cache-shared-{r}") if kind == "shared" else (untuned, cache)
                log = tmp / f"{kind}-{r}.log"
                results[kind].append(start_service(store, ref, args.threads, kind_cache, log))
                print(kind, r + 1, json.dumps(results[kind][-1]), flush=True)
        first_steps = in_child("phases", untuned, ref, args.threads)
        shared_steps = in_child("shared", tuned, ref, args.threads)
    print_report(args, ref, results, tune_s, first_steps, shared_steps, exe.exists())


def print_report(
    args: argparse.Namespace,
    ref: str,
    results: dict[str, list[dict[str, object]]],
    tune_s: float,
    first_steps: dict[str, float],
    shared_steps: dict[str, float],
    with_infinity: bool,
) -> None:
    def ready(kind: str) -> list[float]:
        return [float(str(r["ready_s"])) for r in results[kind]]

    print(f"\n{args.arch} random weights ({ref}), {args.threads} threads, {args.rounds} rounds; "
          f"clip-train tune took {tune_s:.1f} s (once per CPU kind)\n")  # fmt: skip
    print("| fresh process to ready | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " | median |")
    print("|---|" + "---|" * (args.rounds + 1))
    labels = {
        "first": "first start, `auto`, no shared decision",
        "restart": "restart with its local cache",
        "shared": "new pod, shared decision",
        "infinity": "Infinity 0.0.78 (torch)",
    }
    for kind in KINDS:
        if not results[kind]:
            continue
        extra = ""
        if kind != "infinity":
            last = results[kind][-1]
            extra = f" ({last['outcome']}: {last['serving']})"
        cells = " | ".join(f"{s:.1f} s" for s in ready(kind))
        print(f"| {labels[kind]}{extra} | {cells} | {median(ready(kind)):.1f} s |")
    if with_infinity and results["infinity"]:
        inf = median(ready("infinity"))
        for kind in ("first", "restart", "shared"):
            print(f"{kind} / Infinity: {median(ready(kind)) / inf:.2f}x")
    print(f"shared / first: {median(ready('shared')) / median(ready('first')):.2f}x")
    for kind in ("first", "shared"):
        loads = [float(str(r["load_s"])) for r in results[kind] if r["load_s"] is not None]
        timing = [float(str(r["timing_s"] or 0.0)) for r in results[kind]]
        if loads:
            print(f"{kind}: version load {median(loads):.1f} s of {median(ready(kind)):.1f} s to ready "
                  f"(the rest: interpreter, imports, app start); timing rounds {median(timing):.1f} s")  # fmt: skip
    print("\nwhere a first start's load goes (one process, steps in the server's order):")
    for step, seconds in first_steps.items():
        print(f"  {step}: {seconds:.1f} s")
    print("a shared start's steps after the model load:")
    for step, seconds in shared_steps.items():
        print(f"  {step}: {seconds:.1f} s")


if __name__ == "__main__":
    main()
