"""The naive reference server: what a user writes first, kept as a baseline for the benchmarks.

Plain FastAPI over one loaded model version: every request decodes its images and encodes its
images and texts from scratch (no cache, no batching across requests, no thread pool for
decoding). Endpoints answer the JSON contract subset the benchmarks use: ``/classify``,
``/rank-pair`` (single pair), ``/embed`` and ``/readyz``. It exists to be measured against,
not to be deployed: there are no limits, no auth and no error envelope beyond a 400.

    .venv/bin/python -m loadtests.naive_server --store models --model default@production --port 8100
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
from pathlib import Path

import numpy as np
from fastapi import FastAPI, HTTPException
from PIL import Image
from pydantic import BaseModel

from clipcore.backends.torch_towers import resolve_device
from clipcore.methods.pairwise_rank import pair_decision, pair_scores
from clipcore.models.bundle import ModelBundle
from clipcore.tasks import flat_prompts, label_embeddings, label_prompts, label_scores, top_labels
from model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]


class NaiveImage(BaseModel):
    data: str


class NaiveClassify(BaseModel):
    images: list[NaiveImage]
    labels: list[str]
    templates: list[str] | None = None
    top_k: int = 5


class NaiveRankPair(BaseModel):
    image_a: NaiveImage
    image_b: NaiveImage
    difference: str


class NaiveEmbed(BaseModel):
    texts: list[str] | None = None
    images: list[NaiveImage] | None = None


def _decode(image: NaiveImage) -> tuple[Image.Image, str]:
    data = image.data.split(",", 1)[1] if image.data.startswith("data:") else image.data
    try:
        raw = base64.b64decode(data, validate=True)
        return Image.open(io.BytesIO(raw)), hashlib.sha256(raw).hexdigest()
    except Exception as exc:  # a baseline: any decoding failure is simply a 400
        raise HTTPException(400, f"undecodable image: {exc}") from exc


def create_naive_app(bundle: ModelBundle) -> FastAPI:
    app = FastAPI(title="naive CLIP server")

    def encode_images(images: list[NaiveImage]) -> tuple[np.ndarray, list[str]]:
        decoded = [_decode(i) for i in images]
        arrays = np.stack([bundle.preprocess(img) for img, _ in decoded])
        return bundle.encode_images(arrays), [digest for _, digest in decoded]

    # Plain ``def`` handlers: FastAPI runs them in its thread pool, the way most first versions do.
    @app.get("/readyz")
    def readyz() -> dict[str, object]:
        return {"ready": True, "model": bundle.ref}

    @app.post("/classify")
    def classify(req: NaiveClassify) -> dict[str, object]:
        g, _ = encode_images(req.images)
        prompts = label_prompts(req.labels, req.templates or None)
        f, _ = label_embeddings(prompts, bundle.encode_texts(flat_prompts(prompts)))
        probs, cosine = label_scores(g, f, bundle.logit_scale)
        results = [
            {"label": top[0][0], "top_k": [{"label": lab, "probability": p, "cosine": c} for lab, p, c in top]}
            for top in top_labels(probs, cosine, req.labels, req.top_k)
        ]
        return {
            "model": bundle.ref,
            "comparative": {"applied": False, "pairs": [], "alpha": 0.9, "source": "none"},
            "results": results,
        }

    @app.post("/rank-pair")
    def rank_pair(req: NaiveRankPair) -> dict[str, object]:
        g, _ = encode_images([req.image_a, req.image_b])
        f = bundle.encode_texts([req.difference])
        score = float(pair_scores(g[:1], g[1:], f)[0])
        return {"model": bundle.ref, "first": pair_decision(score), "score": score}

    @app.post("/embed")
    def embed(req: NaiveEmbed) -> dict[str, object]:
        if (req.texts is None) == (req.images is None):
            raise HTTPException(400, "give exactly one of 'texts' or 'images'")
        if req.texts is not None:
            emb = bundle.encode_texts(req.texts)
            ids = [hashlib.sha256(t.encode()).hexdigest() for t in req.texts]
        else:
            emb, ids = encode_images(req.images or [])
        return {"model": bundle.ref, "dim": int(emb.shape[1]), "embeddings": emb.tolist(), "ids": ids}

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--device", default=os.environ.get("CLIP_DEVICE", "cpu"), help="default: $CLIP_DEVICE or cpu")
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "localhost"):
        raise SystemExit("the naive server is a local benchmark baseline: bind 127.0.0.1 only")
    store = Path(args.store) if Path(args.store).is_absolute() else ROOT / args.store
    bundle = ModelBundle.load(ModelStore(store), args.model, resolve_device(args.device))
    uvicorn.run(create_naive_app(bundle), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
