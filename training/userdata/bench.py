"""Speed of the user-data commands on a real open_clip architecture (random weights).

    python -m training.userdata.bench --arch ViT-B-32 --images 48 --steps 4 --threads 1

Publishes a randomly initialised ``--arch`` into a scratch store, draws a small dataset
(``demo_data``) at the architecture's image size, then times the frozen-feature precompute
(pooled and DCSM dense, images/s), a second precompute (served from the cache: nothing computed),
and ``pcclip`` and ``dcsm`` training steps (steps/s). Prints one markdown table row per stage.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from clipcore.models.clip_model import build_model
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore
from training.from_scratch import image_size
from training.recipe import model_config
from training.userdata.context import RunContext
from training.userdata.dcsm import DCSMRun, train_user_dcsm
from training.userdata.demo_data import write_user_dataset
from training.userdata.pcclip import PCClipRun, train_user_pcclip


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="ViT-B-32", help="open_clip architecture name")
    parser.add_argument("--images", type=int, default=48, help="labelled images (4 labels)")
    parser.add_argument("--steps", type=int, default=4, help="training steps of each method")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = model_config(args.arch)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        publish_bundle(
            ModelStore(root / "store"), "bench", TrainedModel(build_model(config), config), aliases=["production"]
        )
        rows.append(("publish random weights", f"{time.perf_counter() - t0:.1f} s"))
        data = write_user_dataset(root / "data", per_label=args.images // 4, scenes=0, size=image_size(config))
        ctx = RunContext.open(ModelStore(root / "store"), "bench@production", data, run_dir=root / "run",
                              cache_dir=root / "features", device=args.device, precision="auto")  # fmt: skip
        refs = [item.images[0] for item in ctx.dataset.of_kind("label")]
        for kind in ("pooled", "dense"):
            t0 = time.perf_counter()
            ctx.features.of(kind, refs)  # type: ignore[arg-type]
            seconds = time.perf_counter() - t0
            rows.append((f"{kind} features, {len(refs)} images (decode + encode + write)",
                         f"{len(refs) / seconds:.2f} images/s"))  # fmt: skip
            t0 = time.perf_counter()
            ctx.features.of(kind, refs)  # type: ignore[arg-type]
            rows.append((f"{kind} features again (cache)", f"{time.perf_counter() - t0:.3f} s, 0 computed"))
        t0 = time.perf_counter()
        train_user_pcclip(ctx, PCClipRun(steps=args.steps, batch_size=args.batch_size, generated_pairs=64))
        rows.append((f"pcclip, {args.steps} steps of batch {args.batch_size} (+ caption loss)",
                     f"{args.steps / (time.perf_counter() - t0):.2f} steps/s"))  # fmt: skip
        t0 = time.perf_counter()
        train_user_dcsm(ctx, DCSMRun(steps=args.steps, batch_size=args.batch_size))
        rows.append((f"dcsm, {args.steps} steps of batch {args.batch_size} (texts encoded first)",
                     f"{args.steps / (time.perf_counter() - t0):.2f} steps/s"))  # fmt: skip
        assert ctx.features.cache.computed == {"pooled": len(refs), "dense": len(refs)}
    print(f"\n{args.arch}, random weights, {args.device}, {args.threads} thread(s), {cpu_name()}\n")
    print("| stage | speed |\n|---|---|")
    for stage, speed in rows:
        print(f"| {stage} | {speed} |")


if __name__ == "__main__":
    main()
