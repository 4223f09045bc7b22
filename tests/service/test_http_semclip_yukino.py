"""SemCLIP and YUKINO over HTTP: a real uvicorn server, real Redis, and a tiny model version with
a ``semclip`` text-encoder variant and a (random) YUKINO inverter, published to a temporary store.

The weights are random, so what is checked is that requests choose them, that the served numbers
are exactly what the model version computes in-process, the cache, and the error answers.
Meaning on the trained default model is checked in test_sdk_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

SMOKE_CONFIG = Path(__file__).resolve().parents[2] / "training" / "configs" / "shapes-smoke.json"
CAPTIONS = [
    "a red circle to the left of a blue square",
    "a blue circle to the left of a red square",
    "there is no red circle",
]


def publish_semclip_yukino(root: Path) -> str:
    import torch

    from clipcore.models.clip_model import build_model
    from clipcore.models.publish import TrainedModel, publish_bundle
    from clipcore.models.yukino import Inverter, YukinoHead
    from model_store import ModelStore

    config = json.loads(SMOKE_CONFIG.read_text())
    torch.manual_seed(0)
    model = build_model(config)
    generator = torch.Generator().manual_seed(1)
    semclip = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) if k.startswith("transformer.") else v
        for k, v in model.state_dict().items()
    }
    grid = (config["vision_cfg"]["image_size"] // config["vision_cfg"]["patch_size"]) ** 2
    in_dim = (grid + 1) * config["embed_dim"]
    width = config["text_cfg"]["width"]
    head = YukinoHead(
        Inverter(in_dim, width, 32), "semclip", {"in_dim": in_dim, "token_dim": width, "width": 32, "scale": 50.0}
    )
    files, component = head.to_files()
    manifest = publish_bundle(
        ModelStore(root),
        "sy",
        TrainedModel(
            model,
            config,
            text_variants={"semclip": semclip},
            extra_files=files,
            components={"yukino": component},
            fp16=False,
        ),
        aliases=["production"],
    )
    return manifest.version


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("semclip-yukino-store")
    publish_semclip_yukino(root)
    return root


@pytest.fixture(scope="module")
def client(store: Path, service_redis: Any, serve_app: Any) -> Iterator[httpx.Client]:
    with serve_app(store=str(store), model="sy@production", redis_url=service_redis.url) as running:
        with httpx.Client(base_url=running.url, timeout=60) as c:
            yield c


@pytest.fixture(scope="module")
def bundle(store: Path) -> Any:
    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore

    return ModelBundle.load(ModelStore(store), "sy@production")


def test_models_lists_semclip_and_yukino(client: httpx.Client) -> None:
    version = client.get("/models/sy").json()["versions"][0]
    assert version["text_encoders"] == ["base", "semclip"]
    assert "yukino" in version["components"]


def test_semclip_encoder_is_chosen_per_request(client: httpx.Client, bundle: Any, make_image: Any) -> None:
    texts = ["a photo of a red circle.", "there is no red circle."]
    base = np.array(client.post("/embed", json={"texts": texts}).json()["embeddings"])
    sem = np.array(client.post("/embed", json={"texts": texts, "encoder": "semclip"}).json()["embeddings"])
    np.testing.assert_allclose(sem, bundle.encode_texts(texts, "semclip"), atol=2e-3)
    assert np.abs(sem - base).max() > 0.01, "the semclip variant is a different text encoder"
    body = {"images": [make_image("circle", "red")], "labels": texts, "templates": ["{}"]}
    standard = client.post("/classify", json=body).json()
    semclip = client.post("/classify", json={**body, "encoder": "semclip"}).json()
    assert standard["method"] == semclip["method"] == "standard"
    cos = {r["label"]: r["cosine"] for r in semclip["results"][0]["top_k"]}
    image = bundle.encode_images(np.stack([bundle.preprocess(_decode(body["images"][0]))]))[0]
    expected = bundle.encode_texts(texts, "semclip") @ image
    assert [cos[t] for t in texts] == pytest.approx(expected.tolist(), abs=3e-3)
    unknown = client.post("/classify", json={**body, "encoder": "semclip2"})
    assert unknown.status_code == 400 and unknown.json()["error"]["field"] == "encoder"


def _decode(image: dict[str, str]) -> Any:
    import base64
    import io

    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(image["data"])))


def test_yukino_scores_are_the_versions_yes_no_scores(client: httpx.Client, bundle: Any, make_image: Any) -> None:
    from clipcore.methods.yukino import yes_no_scores

    images = [make_image("circle", "red", x=0.3), make_image("square", "blue", x=0.7)]
    body = {"images": images, "labels": CAPTIONS, "templates": ["{}"], "method": "yukino", "top_k": 3}
    first = client.post("/classify", json=body)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["method"] == "yukino" and answer["comparative"]["applied"] is False
    pixels = np.stack([bundle.preprocess(_decode(img)) for img in images])
    prompts = bundle.yukino_prompts(pixels)
    expected = yes_no_scores(prompts[:, 0], prompts[:, 1], bundle.encode_texts(CAPTIONS, "semclip"))
    for i, result in enumerate(answer["results"]):
        scores = {r["label"]: r["cosine"] for r in result["top_k"]}
        assert [scores[c] for c in CAPTIONS] == pytest.approx(expected[i].tolist(), abs=3e-3)
        assert result["label"] == CAPTIONS[int(np.argmax(expected[i]))]
        assert sum(r["probability"] for r in result["top_k"]) == pytest.approx(1.0, abs=1e-5)
    # Served again from the cache (prompt features by image sha256): the same answer.
    again = client.post("/classify", json={**body, "images": [{"sha256": r} for r in _ids(client, images)]})
    assert again.status_code == 200 and again.json()["results"] == answer["results"]


def _ids(client: httpx.Client, images: list[dict[str, str]]) -> list[str]:
    import base64
    import hashlib

    return [hashlib.sha256(base64.b64decode(img["data"])).hexdigest() for img in images]


def test_yukino_errors(client: httpx.Client, make_image: Any) -> None:
    body = {"images": [make_image()], "labels": CAPTIONS, "method": "yukino"}
    comparative = client.post("/classify?comparative=true", json=body)
    assert comparative.status_code == 400 and comparative.json()["error"]["field"] == "method"
    encoder = client.post("/classify", json={**body, "encoder": "base"})
    assert encoder.status_code == 400 and encoder.json()["error"]["field"] == "encoder"
    method = client.post("/classify", json={**body, "method": "oti"})
    error = method.json()["error"]
    assert method.status_code == 422 and (error["code"], error["field"]) == ("validation_error", "method")


def test_yukino_on_a_version_without_it(base_url: str, make_image: Any) -> None:
    body = {"images": [make_image()], "labels": CAPTIONS, "method": "yukino"}
    response = httpx.post(f"{base_url}/classify", json=body, timeout=60)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_component"
