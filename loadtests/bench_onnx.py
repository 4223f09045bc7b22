"""ONNX export, parity gate and image throughput of torch eager against onnxruntime, in one process.

.venv/bin/python -m loadtests.bench_onnx --store models --model default@production
.venv/bin/python -m loadtests.bench_onnx --arch ViT-B-32 --image-precision int8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from clipcore.backends.onnx import load_towers
from clipcore.backends.onnx_export import export_bundle
from clipcore.backends.parity import PARITY_THRESHOLD, PROBE_TEXTS, probe_images, require_parity
from clipcore.models.bundle import ModelBundle
from clipcore.models.preprocess import OPENAI_MEAN, OPENAI_STD


def image_throughput(encode: object, images: np.ndarray, min_s: float) -> float:
    """Images/s of ``encode(images)`` over at least ``min_s`` seconds, after one warm-up call."""
    fn = encode  # a callable; typed loosely so torch and onnx encoders fit alike
    fn(images)  # type: ignore[operator]
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_s or n == 0:
        fn(images)  # type: ignore[operator]
        n += len(images)
    return n / elapsed


def random_bundle(arch: str, directory: Path) -> ModelBundle:
    """A random-weights open_clip ``arch`` as a bundle (speed does not depend on weight values)."""
    import open_clip

    from model_store import Manifest

    cfg = open_clip.get_model_config(arch)
    if cfg is None:
        raise SystemExit(f"unknown open_clip architecture {arch!r}")
    manifest = Manifest(
        name="bench",
        version="random",
        architecture={"open_clip_name": arch},
        context_length=cfg["text_cfg"].get("context_length", 77),
        embed_dim=cfg["embed_dim"],
        image_size=cfg["vision_cfg"].get("image_size", 224),
        preprocess={"mean": list(OPENAI_MEAN), "std": list(OPENAI_STD)},
    )
    torch.manual_seed(0)
    return ModelBundle.from_directory(manifest, directory)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="export to ONNX, gate on parity, compare image throughput")
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--arch", default=None, help="a random-weights open_clip architecture instead of --model")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads for torch and onnxruntime alike")
    parser.add_argument("--image-precision", default="fp32", choices=["fp32", "int8"])
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="onnx-export-") as tmp:
        if args.arch:
            bundle = random_bundle(args.arch, Path(tmp))
        else:
            from model_store import ModelStore

            bundle = ModelBundle.load(ModelStore(args.store), args.model)
        t0 = time.perf_counter()
        export_bundle(bundle, Path(tmp) / "onnx", image_precision=args.image_precision)
        towers = load_towers(Path(tmp) / "onnx", device=args.device, threads=args.threads)
        used = towers.providers
        name = bundle.ref if not args.arch else f"{args.arch} (random weights)"
        print(f"model {name}: exported ({args.image_precision} image tower) in {time.perf_counter() - t0:.1f} s, "
              f"providers {used}")  # fmt: skip
        worst = require_parity(bundle, towers)
        print(
            f"parity: min cosine {worst:.6f} over {len(probe_images(bundle.image_size))} probe images and "
            f"{len(PROBE_TEXTS)} texts (gate >= {PARITY_THRESHOLD})\n"
        )
        print("| batch | torch eager images/s | onnxruntime images/s | onnx / torch |\n|---|---|---|---|")
        rng = np.random.default_rng(0)
        for bs in args.batch_sizes:
            images = rng.integers(0, 256, (bs, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)
            t = image_throughput(bundle.encode_images, images, args.min_seconds)
            o = image_throughput(towers.encode_images, images, args.min_seconds)
            print(f"| {bs} | {t:.1f} | {o:.1f} | {o / t:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
