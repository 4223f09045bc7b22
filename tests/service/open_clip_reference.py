"""Served embeddings against open_clip's own: the reference computation and the endpoint checks
shared by the imported-model tests (tests/service/test_imported_*.py)."""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import open_clip
import pytest
import torch
from typer.testing import CliRunner

from training.cli import app as train_app

TEXTS = ["a photo of a red circle", "a drawing of a blue square"]
LABELS = ["circle", "square"]
TEMPLATE = "a photo of a {}."
DIFFERENCE = "the first is red, while the second is blue."
MIN_COSINE = 0.9999
# open_clip's defaults (OpenAI CLIP's), as an open_clip hub config's preprocess_cfg writes them.
OPENAI_PREPROCESS = {
    "mean": list(open_clip.OPENAI_DATASET_MEAN),
    "std": list(open_clip.OPENAI_DATASET_STD),
    "interpolation": "bicubic",
    "resize_mode": "shortest",
}


def sample_image(px: int, seed: int) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.zeros((px, px, 3), np.uint8) + rng.integers(0, 255, 3, dtype=np.uint8)
    x, y = rng.integers(0, px // 2, 2)
    pixels[y : y + px // 3, x : x + px // 3] = rng.integers(0, 255, 3, dtype=np.uint8)
    return Image.fromarray(pixels)


def b64(image: Any) -> dict[str, str]:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return {"data": base64.b64encode(buf.getvalue()).decode()}


def import_model(store: Path, name: str, *args: str) -> None:
    result = CliRunner().invoke(train_app, ["import", name, "--store", str(store), *args])
    assert result.exit_code == 0, result.output


def save_hub(
    directory: Path, model_cfg: dict[str, Any], state: dict[str, torch.Tensor], preprocess: dict[str, Any]
) -> Path:
    """An open_clip hub-style folder (config + ``open_clip_pytorch_model.bin``), as users download them."""
    directory.mkdir(parents=True)
    config = {"model_cfg": model_cfg, "preprocess_cfg": preprocess}
    (directory / "open_clip_config.json").write_text(json.dumps(config))
    torch.save(state, directory / "open_clip_pytorch_model.bin")
    return directory


@dataclass
class Reference:
    """What open_clip itself computes from a weights file, for the test images and texts."""

    images: np.ndarray  # (2, D) normalised
    texts: np.ndarray  # (len(TEXTS), D)
    prompts: np.ndarray  # (len(LABELS), D)
    difference: np.ndarray  # (D,)
    logit_scale: float


@torch.no_grad()
def open_clip_reference(
    model_name: str, weights: Path | None, images: list[Any], preprocess_cfg: dict[str, Any] | None = None
) -> Reference:
    """open_clip's own ``create_model_and_transforms`` on ``weights`` (or a ``local-dir:`` hub folder's),
    with ``preprocess_cfg``'s transform (or the hub folder's)."""
    transform: dict[str, Any] = {}
    if preprocess_cfg is not None:
        transform = {
            "image_mean": tuple(preprocess_cfg["mean"]), "image_std": tuple(preprocess_cfg["std"]),
            "image_interpolation": preprocess_cfg["interpolation"], "image_resize_mode": preprocess_cfg["resize_mode"],
        }  # fmt: skip
    pretrained = None if weights is None else str(weights)
    model, _, preprocess = open_clip.create_model_and_transforms(model_name, pretrained=pretrained, **transform)
    model.eval()
    tokenizer = open_clip.get_tokenizer(model_name)

    def text(batch: list[str]) -> np.ndarray:
        return model.encode_text(tokenizer(batch), normalize=True).numpy()

    pixels = torch.stack([preprocess(image) for image in images])
    return Reference(
        images=model.encode_image(pixels, normalize=True).numpy(),
        texts=text(TEXTS),
        prompts=text([TEMPLATE.format(label) for label in LABELS]),
        difference=text([DIFFERENCE])[0],
        logit_scale=float(model.logit_scale.exp().clamp(max=100)),
    )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def check_served_equals_open_clip(
    url: str, ref: Reference, images: list[Any], model: str, *, pair_from_served: bool = False
) -> None:
    """/embed, /classify, /rank-pair and /rank agree with ``ref`` for the serving ``model``.

    ``pair_from_served``: a random MobileCLIP maps every image to nearly one point (cosine 0.9999
    between any two), so ``normalize(g(a) - g(b))`` is dominated by rounding in any two
    implementations; its /rank-pair score is then checked against the served embeddings (which are
    themselves checked against open_clip's) instead of open_clip's directly.
    """
    sent = [b64(image) for image in images]
    r = httpx.post(f"{url}/embed", json={"images": sent}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    served_images = np.asarray(r.json()["embeddings"])
    assert cosines(served_images, ref.images).min() >= MIN_COSINE
    r = httpx.post(f"{url}/embed", json={"texts": [*TEXTS, DIFFERENCE]}, timeout=120)
    assert r.status_code == 200, r.text
    assert cosines(r.json()["embeddings"], [*ref.texts, ref.difference]).min() >= MIN_COSINE
    served_difference = np.asarray(r.json()["embeddings"][-1])

    r = httpx.post(f"{url}/classify", json={"images": sent[:1], "labels": LABELS, "templates": [TEMPLATE]}, timeout=120)
    assert r.status_code == 200, r.text
    served = {s["label"]: s for s in r.json()["results"][0]["top_k"]}
    cosine = ref.prompts @ ref.images[0]
    logits = ref.logit_scale * cosine
    probability = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    for i, label in enumerate(LABELS):
        assert served[label]["cosine"] == pytest.approx(cosine[i], abs=2e-4)
        assert served[label]["probability"] == pytest.approx(probability[i], abs=2e-3)

    body = {"image_a": sent[0], "image_b": sent[1], "difference": DIFFERENCE}
    r = httpx.post(f"{url}/rank-pair", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if pair_from_served:
        delta, text = served_images[0] - served_images[1], served_difference
    else:
        assert cosines(ref.images[0], ref.images[1]) < 0.99  # a well-conditioned difference
        delta, text = ref.images[0] - ref.images[1], ref.difference
    expected = float(delta @ text / np.linalg.norm(delta))
    # The difference of two near-equal unit vectors amplifies rounding: compare at 1e-3 of its scale.
    assert r.json()["score"] == pytest.approx(expected, abs=1e-3)
    assert r.json()["first"] == ("a" if expected > 0 else "b")

    r = httpx.post(f"{url}/rank", json={"images": sent, "difference": DIFFERENCE}, timeout=120)
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["scores"], ref.images @ ref.difference, atol=2e-4)


def wait_serving(url: str, model: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/readyz").json().get("model") != model:
        assert time.monotonic() < deadline, f"{model} did not start serving"
        time.sleep(0.2)
