"""Sequential (concurrency 1) latency of each endpoint, against the model-only cost in-process.

Starts ``python -m service`` on a free 127.0.0.1 port (no Redis: the in-process LRU only),
sends each request kind ``--n`` times after a warm-up, and prints p50 / p95 per endpoint beside
the same computation done directly on the loaded bundle (the model-only baseline), so the
ratio shows what HTTP, validation, decoding, caching and batching add.

    .venv/bin/python -m loadtests.bench_latency --store models --model default@production
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.world.render import draw_scene_pil
from training.world.scene import Scene, SceneObject

ROOT = Path(__file__).resolve().parents[1]

DENSE_TEXTS = [
    "a red circle to the left of a blue square",
    "a blue circle to the left of a red square",
    "a red circle to the right of a blue square",
    "a square without a triangle",
]
SIZE_TEXT = "The first image contains a larger shape, while the second contains a smaller shape."


def png(scene: Scene) -> bytes:
    buf = io.BytesIO()
    draw_scene_pil(scene, 224).save(buf, format="PNG")
    return buf.getvalue()


def fresh_pngs(scene: Scene, n: int) -> list[bytes]:
    """``n`` PNGs of ``scene`` that differ in one corner pixel each."""
    base = np.asarray(draw_scene_pil(scene, 224)).copy()
    out = []
    for i in range(n):
        img = base.copy()
        img[0, 0] = (i % 256, (i // 256) % 256, 7)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def timed(fn: Callable[[], object], n: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--torch-threads", type=int, default=1, help="for the model-only baseline (1 on a busy CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)

    pair = Scene(
        (SceneObject("circle", "red", "small", 0.1, 0.3, 0.5), SceneObject("square", "blue", "large", 0.2, 0.7, 0.5)),
        "left of",
    )
    big = Scene((SceneObject("circle", "red", "large", 0.21, 0.5, 0.5),))
    small = Scene((SceneObject("circle", "red", "small", 0.09, 0.5, 0.5),))
    img_pair, img_big, img_small = png(pair), png(big), png(small)
    b64 = {k: base64.b64encode(v).decode() for k, v in {"pair": img_pair, "big": img_big, "small": img_small}.items()}

    # The same server start-up (free port, no Redis, wait for /readyz) as the throughput benchmark.
    from loadtests.benchmark import server

    cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--store", args.store, "--model", args.model]
    with server(cmd) as url:
        client = httpx.Client(base_url=url, timeout=60)

        bundle = ModelBundle.load(
            ModelStore(ROOT / args.store if not Path(args.store).is_absolute() else args.store), args.model
        )
        arrays = {
            k: bundle.preprocess(Image.open(io.BytesIO(v)))
            for k, v in {"pair": img_pair, "big": img_big, "small": img_small}.items()
        }
        labels = ["circle", "square", "triangle", "diamond", "cross"]

        def post(path: str, body: dict) -> Callable[[], object]:
            def call() -> object:
                r = client.post(path, json=body)
                r.raise_for_status()
                return r

            return call

        # Fresh images (one pixel differs, so every sha256 differs): nothing comes from the cache.
        fresh = iter(fresh_pngs(pair, args.n + 10))

        def dense_fresh() -> object:
            body = {"image": {"data": base64.b64encode(next(fresh)).decode()}, "texts": DENSE_TEXTS}
            return post("/score/dense", body)()

        cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            (
                "POST /score/dense (1 fresh image, 4 texts)",
                dense_fresh,
                lambda: bundle.score_dense(
                    bundle.encode_dense_images(arrays["pair"][None])[0],
                    bundle.encode_dense_texts(DENSE_TEXTS),
                    bundle.dense_layouts(DENSE_TEXTS),
                ),
            ),
            (
                "POST /score/dense (1 image, 4 texts)",
                post("/score/dense", {"image": {"data": b64["pair"]}, "texts": DENSE_TEXTS}),
                lambda: bundle.score_dense(
                    bundle.encode_dense_images(arrays["pair"][None])[0],
                    bundle.encode_dense_texts(DENSE_TEXTS),
                    bundle.dense_layouts(DENSE_TEXTS),
                ),
            ),
            (
                "POST /rank-pair",
                post(
                    "/rank-pair",
                    {"image_a": {"data": b64["big"]}, "image_b": {"data": b64["small"]}, "difference": SIZE_TEXT},
                ),
                lambda: (
                    bundle.encode_images(np.stack([arrays["big"], arrays["small"]])),
                    bundle.encode_texts([SIZE_TEXT]),
                ),
            ),
            (
                "POST /classify (1 image, 5 labels)",
                post("/classify", {"images": [{"data": b64["big"]}], "labels": labels}),
                lambda: (
                    bundle.encode_images(arrays["big"][None]),
                    bundle.encode_texts([f"a photo of a {x}." for x in labels] * 5),
                ),
            ),
        ]
        print(
            f"model {bundle.ref}, n={args.n} sequential requests each (the service caches repeated inputs; "
            "the model-only column recomputes everything)\n"
        )
        print("| endpoint | service p50 ms | service p95 ms | model-only p50 ms | ratio p50 |")
        print("|---|---|---|---|---|")
        for name, http_call, direct in cases:
            s50, s95 = percentiles(timed(http_call, args.n))
            d50, _ = percentiles(timed(direct, max(10, args.n // 4)))
            print(f"| {name} | {s50:.1f} | {s95:.1f} | {d50:.1f} | {s50 / d50:.2f} |")


if __name__ == "__main__":
    main()
