"""Image-encode throughput of the serving backends: torch fp32, torch bf16 (autocast), torch int8
(quantised linears), ONNX Runtime fp32 and int8 (the image tower's MatMul weights quantised).

In-process, no HTTP: each backend encodes the same random uint8 batch through exactly what the
service's image batcher calls (``TorchTowers`` / ``OnnxTowers``), after the parity gate figures
(min cosine against torch fp32 over the fixed probe images and texts, every text variant). The
backends take turns within each round, and each cell is the best of ``--rounds`` rounds, so a
busy neighbour slows every backend alike rather than whichever ran during the burst.

On the CPU the run ends with the fp32 bound of this machine: the image tower's multiply-adds
counted by torch's FLOP counter, against the best fp32 matrix-multiply rate torch reaches here
with the same threads (large square products, measured in the same run). No fp32 backend can
encode faster than that quotient, whatever its runtime; only lower precision goes past it.

    .venv/bin/python -m loadtests.bench_backends --store models --model default@production --threads 1
    .venv/bin/python -m loadtests.bench_backends --arch ViT-B-32 --threads 1 --min-seconds 4

The libraries pick their kernels by CPUID; to time the AVX2 kernels an AVX2-only CPU would run, on
any x86-64 CPU, hold torch, MKL and fbgemm to them (onnxruntime has no such setting):

    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
    FBGEMM_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python -m loadtests.bench_backends --arch ViT-B-32 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from clipcore.backends.auto import kernel_settings
from clipcore.backends.onnx import OnnxTowers, load_towers
from clipcore.backends.onnx_export import export_bundle
from clipcore.backends.parity import PARITY_THRESHOLD, check_dense_parity, check_parity
from clipcore.backends.torch_int8 import Int8TorchTowers
from clipcore.backends.torch_towers import AUTOCAST_DTYPES, TorchTowers, resolve_device
from clipcore.models.bundle import ModelBundle
from loadtests.bench_onnx import image_throughput
from loadtests.bench_onnx import random_bundle as _random_bundle
from model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--arch", default=None, help="a random-weights open_clip architecture instead of --model")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--min-seconds", type=float, default=2.0, help="per backend, batch size and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads for torch and onnxruntime alike")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    low = "fp16" if device == "cuda" else "bf16"  # what the service's precision setting allows there

    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        if args.arch:
            bundle = _random_bundle(args.arch, Path(tmp))
            bundle.model.to(device)
            bundle.device = device
            name = f"{args.arch} (random weights)"
        else:
            bundle = ModelBundle.load(ModelStore(args.store), args.model, device)
            name = bundle.ref
        t0 = time.perf_counter()
        export_bundle(bundle, Path(tmp) / "onnx", variants=True)
        onnx = load_towers(Path(tmp) / "onnx", device=device, threads=args.threads)
        export_s = time.perf_counter() - t0
        lowered = [(f"torch {low}", TorchTowers(bundle, AUTOCAST_DTYPES[low])), ("onnx", onnx)]
        if device == "cpu":  # int8 runs on the CPU only (the service refuses it on CUDA)
            lowered.append(("torch int8", Int8TorchTowers(bundle)))
            export_bundle(bundle, Path(tmp) / "onnx-int8", image_precision="int8")
            lowered.append(("onnx int8", load_towers(Path(tmp) / "onnx-int8", device=device, threads=args.threads)))
        backends: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
        parity: dict[str, str] = {"torch fp32": "(reference)"}
        backends["torch fp32"] = TorchTowers(bundle).encode_images
        for label, towers in lowered:
            parity[label] = f"{check_parity(bundle, towers):.6f}"
            backends[label] = towers.encode_images
        print(f"model {name} on {device}, {torch.get_num_threads()} torch thread(s), onnxruntime {onnx.providers}")
        kernels = ", ".join(kernel_settings()) or "no kernel settings"
        print(f"torch kernels {torch.backends.cpu.get_cpu_capability()}; {kernels}")
        print(f"ONNX export of {1 + len(onnx.variants)} text tower(s) and the image tower: {export_s:.1f} s")
        print(f"parity gate: min cosine >= {PARITY_THRESHOLD}; best of {args.rounds} round(s) of "
              f"{args.min_seconds:g} s per cell\n")  # fmt: skip

        best = print_table(backends, parity, "min cosine", bundle.image_size, args)
        if device == "cpu":
            print_fp32_bound(bundle, best, args.min_seconds, args.rounds)
        if bundle.dense is not None:
            dense_table(bundle, Path(tmp), args)


def print_table(
    backends: dict[str, Callable[[np.ndarray], object]],
    parity: dict[str, str],
    parity_name: str,
    image_size: int,
    args: argparse.Namespace,
) -> dict[tuple[str, int], float]:
    """Images/s of each backend per batch size (best of ``args.rounds``, backends taking turns),
    printed as a table and returned by (backend, batch size)."""
    rng = np.random.default_rng(0)
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for bs in args.batch_sizes:
            images = rng.integers(0, 256, (bs, image_size, image_size, 3), dtype=np.uint8)
            for label, encode in backends.items():
                rate = image_throughput(encode, images, args.min_seconds)
                best[label, bs] = max(best.get((label, bs), 0.0), rate)
    print(f"| backend | parity ({parity_name}) | batch | images/s | vs torch fp32 |\n|---|---|---|---|---|")
    for label in backends:
        for bs in args.batch_sizes:
            ratio = best[label, bs] / best["torch fp32", bs]
            print(f"| {label} | {parity[label]} | {bs} | {best[label, bs]:.1f} | {ratio:.2f}x |")
    return best


def image_flops(model: torch.nn.Module, image_size: int, device: str = "cpu") -> float:
    """Floating-point operations of one image through ``model.encode_image`` (2 per multiply-add) in
    its matrix products and convolutions. torch's counter leaves out the attention score products on
    the CPU (about 1% of a ViT-B/32), so the bound below errs on the generous side."""
    from torch.utils.flop_counter import FlopCounterMode

    pixels = torch.zeros(1, 3, image_size, image_size, device=device)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    # The fused attention fast path hides its projections from the counter; the math path is the same work.
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.encode_image(pixels)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return float(counter.get_total_flops())


def matmul_peak(min_seconds: float, sizes: Sequence[int] = (1024, 2048)) -> float:
    """The best fp32 FLOP/s of torch's matrix multiply on this CPU with the current threads."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        calls, start = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - start < min_seconds:
            a @ b
            calls += 1
        best = max(best, 2 * n**3 * calls / (time.perf_counter() - start))
    return best


def print_fp32_bound(bundle: ModelBundle, best: dict[tuple[str, int], float], min_seconds: float, rounds: int) -> None:
    """The fp32 images/s no runtime can pass on this CPU, and how close each fp32 backend comes
    (the peak is the best of ``rounds``, as the table's cells are)."""
    flops = image_flops(bundle.model, bundle.image_size, bundle.device)
    peak = max(matmul_peak(min_seconds) for _ in range(max(rounds, 1)))
    bound = peak / flops
    print(f"\nfp32 bound here: {flops / 1e9:.3g} GFLOP per image, fp32 matmul peak {peak / 1e9:.0f} GFLOP/s "
          f"({torch.get_num_threads()} thread(s)) -> at most {bound:.1f} images/s in fp32")  # fmt: skip
    for (label, bs), rate in best.items():
        if label in ("torch fp32", "onnx"):
            print(f"  {label} batch {bs}: {rate:.1f} images/s = {rate / bound:.0%} of the fp32 bound")


def dense_table(bundle: ModelBundle, tmp: Path, args: argparse.Namespace) -> None:
    """DCSM's dense image features (class + patch tokens) per backend: torch fp32 and the ONNX
    dense graphs, fp32 and int8, behind the per-token gate."""
    encoder = bundle.dense_encoder()

    def through(runner: OnnxTowers | None) -> Callable[[np.ndarray], object]:
        def encode(images: np.ndarray) -> object:
            return encoder.image_features(images, runner)

        return encode

    backends, parity = {"torch fp32": through(None)}, {"torch fp32": "(reference)"}
    for label, precision in (("onnx", "fp32"), ("onnx int8", "int8")):
        export_bundle(bundle, tmp / f"dense-{precision}", image_precision=precision, dense=True)  # type: ignore[arg-type]
        towers = load_towers(tmp / f"dense-{precision}", device="cpu", threads=args.threads)
        parity[label] = f"{check_dense_parity(bundle, towers):.6f}"
        backends[label] = through(towers)
    print("\nDCSM dense image features (class + patch tokens):\n")
    print_table(backends, parity, "min token cosine", bundle.image_size, args)


if __name__ == "__main__":
    main()
