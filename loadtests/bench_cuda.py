"""Image-encode throughput on a CUDA GPU: torch fp32, fp16 and bf16 autocast, fp16 with CUDA graphs
(the service's per-bucket capture, ``clipcore.backends.cuda_graphs``, and
``torch.compile(mode="reduce-overhead")``), and ONNX Runtime fp32 on its CUDA execution provider.
With ``--auto``, first what ``precision=auto`` decides for the same model on this GPU (every
candidate's images/s per timed batch size, their weights and the outcome).

In-process, no HTTP, like ``bench_backends.py`` on a CPU: every candidate encodes the same uint8
batches (pixels are uploaded as uint8 and normalised on the GPU, as the service's towers do),
after its parity figure against torch fp32 on the same GPU (min cosine over the fixed probe
images; the service's gate is 0.999). Each cell is the best of ``--rounds`` rounds, candidates
taking turns. On a machine without a usable CUDA device it says so and exits with status 2.

    .venv/bin/python -m loadtests.bench_cuda --arch ViT-B-32 --batch-sizes 1 8 32 128
    .venv/bin/python -m loadtests.bench_cuda --arch ViT-L-14 --device cuda:1 --skip-compile
    .venv/bin/python -m loadtests.bench_cuda --arch ViT-B-32 --auto --max-batch 128 --skip-compile

The service end to end on the GPU, against the naive server and against Infinity:

    CLIP_DEVICE=cuda CLIP_PRECISION=auto .venv/bin/python -m loadtests.benchmark --arch ViT-B-32 \\
        --duration 15 --batch-sizes 1 8 32 128 --concurrency 1 8 32
    CLIP_DEVICE=cuda CLIP_PRECISION=auto .venv/bin/python -m loadtests.peer.benchmark --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from clipcore.backends.cuda_graphs import GraphedTorchTowers
from clipcore.backends.parity import PARITY_THRESHOLD, probe_images
from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import normalize
from loadtests.bench_onnx import image_throughput, random_bundle
from model_store import ModelStore
from service.config import Batching

Encode = Callable[[np.ndarray], np.ndarray]


def cuda_or_exit(device: str, command: str = "bench_cuda") -> torch.device:
    """The CUDA device, or a clear message and exit status 2 where there is none (``command``
    names the benchmark in the message)."""
    if not device.startswith("cuda"):
        sys.exit(f"{command} measures CUDA devices (cuda or cuda:N), not {device!r}; on a CPU use bench_backends")
    if not torch.cuda.is_available():
        built = torch.version.cuda
        why = f"torch {torch.__version__} is a CPU-only build" if built is None else "no CUDA device is visible"
        print(
            f"{command}: no CUDA GPU here ({why}); nothing measured. Run it on a machine with an NVIDIA GPU "
            "(and the project's `gpu` extra, onnxruntime-gpu, for the ONNX Runtime rows).",
            file=sys.stderr,
        )
        sys.exit(2)
    dev = torch.device(device)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        sys.exit(f"{command}: {device} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    return dev


def torch_encoder(bundle: ModelBundle, dev: torch.device, dtype: torch.dtype | None, compiled: bool) -> Encode:
    """uint8 pixels -> normalised embeddings on ``dev``, under autocast when ``dtype`` is set."""
    visual = bundle.model.visual
    if compiled:  # CUDA graphs: one capture per input shape, replayed without per-kernel launches
        visual = torch.compile(visual, mode="reduce-overhead", dynamic=False)
    mean = torch.tensor(bundle.mean, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(bundle.std, device=dev).view(1, 3, 1, 1)

    @torch.no_grad()
    def encode(images: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(images)).to(dev, non_blocking=True)
        x = (x.permute(0, 3, 1, 2).float().div_(255.0) - mean) / std
        if dtype is None:
            features = visual(x)
        else:
            with torch.autocast("cuda", dtype=dtype):
                features = visual(x)
        return normalize(features.float()).cpu().numpy()  # .cpu() waits for the GPU: timings are complete

    return encode


def onnx_encoder(bundle: ModelBundle, out_dir: Path, device: str) -> tuple[Encode | None, str]:
    """ONNX Runtime fp32 on the CUDA execution provider, or None and why not."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime not installed (install the `gpu` extra)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, f"onnxruntime {ort.__version__} has no CUDA provider (the CPU package; install the `gpu` extra)"
    from clipcore.backends.onnx import load_towers
    from clipcore.backends.onnx_export import export_bundle

    export_bundle(bundle, out_dir)
    towers = load_towers(out_dir, device=device)
    if towers.providers[0] != "CUDAExecutionProvider":
        return None, f"onnxruntime fell back to {towers.providers} (CUDA libraries missing?)"
    return towers.encode_images, f"onnxruntime {ort.__version__}, {towers.providers[0]}"


def print_auto(bundle: ModelBundle, device: str, max_batch: int, cache: Path) -> None:
    """Run ``precision=auto`` as the service does (batcher's largest image batch ``max_batch``) and
    print its decision: outcome, margin, spread, and every candidate's figures and weights."""
    from clipcore.backends.select import select_towers

    _, described = select_towers(bundle, backend="torch", precision="auto", device=device, onnx_cache_root=cache,
                                 threads=None, max_batch=max_batch)  # fmt: skip
    print(f"auto: {described}")
    for path in sorted(cache.glob("auto/*/*.json")):
        record = json.loads(path.read_text())
        d = record["decision"]
        why = f": {d['reason']}" if d["reason"] else ""
        print(f"auto decision: {d['outcome']} {d['backend']} {d['precision']} (margin {d['margin']}, spread "
              f"{d['spread']}, {d['rounds']} rounds, {d['seconds']:.1f} s){why}")  # fmt: skip
        for t in record["trials"]:
            if t["refused"]:
                print(f"  {t['backend']} {t['precision']}: refused ({t['refused']})")
                continue
            figures = ", ".join(f"batch {bs} {v:.1f}" for bs, v in t["images_per_s"].items())
            weights = ", ".join(f"{bs}: {w:g}" for bs, w in (t["weights"] or {}).items())
            print(f"  {t['backend']} {t['precision']}: {figures} images/s (weights {weights}; rounds {t['rounds']})")


def parity(reference: Encode, candidate: Encode, image_size: int) -> float:
    images = probe_images(image_size)
    a, b = reference(images), candidate(images)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return float(np.nan_to_num(cos, nan=-1.0).min())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--arch", default="ViT-B-32", help="a random-weights open_clip architecture")
    parser.add_argument("--store", default=None, help="a model store: benchmark --model from it instead")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--min-seconds", type=float, default=2.0, help="per candidate, batch size and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile (CUDA graphs) row")
    parser.add_argument("--auto", action="store_true", help="first print what precision=auto decides here")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=Batching().max_batch_images,
        help="with --auto: the batcher's largest image batch (auto's timed sizes go up to it)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="time only the rows whose label contains one of these words (and torch fp32)",
    )
    args = parser.parse_args(argv)
    dev = cuda_or_exit(args.device)

    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        if args.store is None:
            bundle = random_bundle(args.arch, Path(tmp) / "bundle")
            name = f"{args.arch} (random weights)"
        else:
            bundle = ModelBundle.load(ModelStore(args.store), args.model, "cpu")
            name = bundle.ref
        onnx, onnx_note = onnx_encoder(bundle, Path(tmp) / "onnx", args.device)  # exported from the CPU copy
        bundle.model.to(dev)
        bundle.device = str(dev)
        if args.auto:
            print_auto(bundle, str(dev), args.max_batch, Path(tmp) / "auto-cache")
        graphed = GraphedTorchTowers(bundle, max(args.batch_sizes))
        encoders: dict[str, Encode] = {
            "torch fp32": torch_encoder(bundle, dev, None, False),
            "torch fp16 autocast": torch_encoder(bundle, dev, torch.float16, False),
            "torch bf16 autocast": torch_encoder(bundle, dev, torch.bfloat16, False),
            f"torch fp16 + CUDA graphs (service: buckets {'/'.join(map(str, graphed.buckets))})": graphed.encode_images,
        }
        if not args.skip_compile:
            encoders["torch fp16 + CUDA graphs (torch.compile)"] = torch_encoder(bundle, dev, torch.float16, True)
        if onnx is not None:
            encoders["onnxruntime fp32 (CUDA provider)"] = onnx
        if args.only:
            encoders = {k: v for k, v in encoders.items() if k == "torch fp32" or any(w in k for w in args.only)}
        print(f"model {name} on {torch.cuda.get_device_name(dev)}, torch {torch.__version__} (CUDA "
              f"{torch.version.cuda}); ONNX Runtime: {onnx_note}")  # fmt: skip
        reference = encoders["torch fp32"]
        cosines = {label: parity(reference, enc, bundle.image_size) for label, enc in encoders.items()}
        rng = np.random.default_rng(0)
        best: dict[tuple[str, int], float] = {}
        for _ in range(args.rounds):
            for bs in args.batch_sizes:
                images = rng.integers(0, 256, (bs, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)
                for label, encode in encoders.items():
                    rate = image_throughput(encode, images, args.min_seconds)
                    best[label, bs] = max(best.get((label, bs), 0.0), rate)
        print(f"\nparity: min probe cosine against torch fp32 (the service's gate: {PARITY_THRESHOLD}); best of "
              f"{args.rounds} round(s) of {args.min_seconds:g} s per cell\n")  # fmt: skip
        print("| candidate | parity | batch | images/s | vs torch fp32 |\n|---|---|---|---|---|")
        for label in encoders:
            for bs in args.batch_sizes:
                ratio = best[label, bs] / best["torch fp32", bs]
                print(f"| {label} | {cosines[label]:.6f} | {bs} | {best[label, bs]:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
