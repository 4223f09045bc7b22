"""The tiny ViT's image tower behind NVIDIA Triton (PyTriton), as a peer for the host-path benchmark.

Runs in its own virtualenv (``nvidia-pytriton``, which bundles ``tritonserver``; see
``ensure_pytriton`` in ``loadtests.peer.benchmark``); torch, open_clip and Pillow come from the
service's environment, so both servers run the same torch build.

One model, ``clip_image``, on Triton's own HTTP (KServe v2) protocol: input ``image``, BYTES, one
base64 JPEG string per request (what ``/embed`` takes in its JSON), output ``embedding``, FP32,
L2-normalised (what ``/embed`` returns). Triton's dynamic batcher gathers requests; the Python
model function decodes the batch (base64, Pillow with a draft-mode reduction as the service does,
resize + centre crop + normalise to the model side) on ``--threads`` threads, then runs the tower
in torch on the CPU with ``--threads`` intra-op threads. Random weights (seed 0): speed does not
depend on weight values.

    pytriton-venv/bin/python loadtests/peer/pytriton_server.py --config loadtests/tiny_vit.json --port 8000
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import os
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

MODEL_NAME = "clip_image"
# open_clip's OPENAI_DATASET_MEAN / STD: the service's default preprocessing for these models
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def image_tower(config: Path, threads: int) -> tuple[Any, int]:
    """The open_clip vision tower of ``config`` (random weights, seed 0), eval mode; and its input side."""
    import torch
    from open_clip.model import CLIP

    torch.set_num_threads(threads)
    cfg = json.loads(config.read_text())
    torch.manual_seed(0)
    model = CLIP(embed_dim=cfg["embed_dim"], vision_cfg=cfg["vision_cfg"], text_cfg=cfg["text_cfg"])
    return model.visual.eval(), int(cfg["vision_cfg"]["image_size"])


def preprocess(b64: bytes, side: int) -> np.ndarray:
    """One base64 JPEG -> the tower's CHW float32 input: decoded in draft mode to at least twice the
    side (as the service's ``decode_image``), shorter side resized to ``side`` (bicubic), centre crop,
    normalised."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(b64, validate=True))) as image:
        image.draft("RGB", (2 * side, 2 * side))
        rgb = image.convert("RGB")
    w, h = rgb.size
    scale = side / min(w, h)
    rgb = rgb.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.Resampling.BICUBIC)
    w, h = rgb.size
    left, top = (w - side) // 2, (h - side) // 2
    arr = np.asarray(rgb.crop((left, top, left + side, top + side)), dtype=np.float32) / 255.0
    return ((arr - MEAN) / STD).transpose(2, 0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="open_clip model config JSON")
    parser.add_argument("--port", type=int, required=True, help="Triton's HTTP port on 127.0.0.1")
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads and decode threads")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-delay-us", type=int, default=0, help="the dynamic batcher's wait for more")
    args = parser.parse_args()

    import torch
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    logging.basicConfig(level=logging.WARNING)
    # Triton's Python backend stub links libpython3.X.so.1.0: without this it finds the system's
    # (Debian's 3.11.2) and runs it against this interpreter's standard library (a pyenv 3.11.7's),
    # which fails at model load (RLock has no _recursion_count).
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")]))
    tower, side = image_tower(args.config, args.threads)
    decoders = ThreadPoolExecutor(args.threads, thread_name_prefix="decode")

    @batch
    def infer(image: np.ndarray) -> dict[str, np.ndarray]:
        pixels = np.stack(list(decoders.map(lambda b: preprocess(b, side), image[:, 0])))
        with torch.inference_mode():
            features = tower(torch.from_numpy(pixels))
            features = torch.nn.functional.normalize(features, dim=-1)
        return {"embedding": features.numpy().astype(np.float32, copy=False)}

    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, grpc_address="127.0.0.1",
                          grpc_port=args.grpc_port, metrics_address="127.0.0.1", metrics_port=args.metrics_port,
                          allow_gpu_metrics=False, exit_on_error=True)  # fmt: skip
    batcher = DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=infer,
            inputs=[Tensor(name="image", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=args.max_batch_size, batcher=batcher),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
