"""Happy paths of every endpoint through a real uvicorn server and the real tiny model.

The tiny model has random weights, so these tests check shapes, contracts and internal
consistency (probabilities sum to one, rankings agree with pairwise decisions, ids round-trip),
not meaning; ``test_http_default_model.py`` checks meaning on the committed model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        yield c


def test_health_ready_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    # The public probe lists no model by default (probes_list_models); /models does.
    assert client.get("/readyz").json() == {"ready": True, "model": None, "redis": "up", "store": "ok", "models": []}
    assert [m["ref"] for m in client.get("/models").json()["served"]] == ["tiny@production"]
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'clip_model_info{encoder="base",model="tiny@production",name="tiny",version="v1"} 1.0' in r.text
    assert 'route="/readyz"' in r.text


def test_classify_contract(client: httpx.Client, make_image: Any) -> None:
    labels = ["red circle", "blue square", "green triangle"]
    images = [make_image("circle", "red"), make_image("square", "blue")]
    body = client.post("/classify", json={"images": images, "labels": labels, "top_k": 2}).json()
    assert body["model"] == "tiny@v1"
    assert body["comparative"] == {"applied": False, "pairs": [], "alpha": 0.9, "source": "none"}
    assert len(body["results"]) == 2
    for result in body["results"]:
        assert len(result["top_k"]) == 2
        assert result["label"] == result["top_k"][0]["label"]
        probs = [t["probability"] for t in result["top_k"]]
        assert probs == sorted(probs, reverse=True)
        assert all(-1.0001 <= t["cosine"] <= 1.0001 for t in result["top_k"])
    full = client.post("/classify", json={"images": images[:1], "labels": labels, "top_k": 10}).json()
    assert math.isclose(sum(t["probability"] for t in full["results"][0]["top_k"]), 1.0, rel_tol=1e-4)
    assert "truncated_texts" not in full


def test_classify_templates_descriptions_and_encoder(client: httpx.Client, make_image: Any) -> None:
    images = [make_image("circle", "red")]
    base = {"images": images, "labels": ["circle", "square"]}
    plain = client.post("/classify", json=base).json()
    templated = client.post("/classify", json={**base, "templates": ["a {} shape."]}).json()
    described = client.post("/classify", json={**base, "descriptions": {"circle": ["a round shape"]}}).json()
    pcclip = client.post("/classify", json={**base, "encoder": "pcclip"}).json()
    tops = [r["results"][0]["top_k"][0]["probability"] for r in (plain, templated, described, pcclip)]
    assert len(set(tops)) == 4, "templates, descriptions and encoder must each change the prompts"


def test_comparative_from_request_library_and_none(client: httpx.Client, make_image: Any) -> None:
    images = [make_image("circle", "red"), make_image("circle", "blue")]
    labels = ["red circle", "blue circle", "green square"]
    lib = client.post("/classify", params={"comparative": "true"}, json={"images": images, "labels": labels}).json()
    assert lib["comparative"]["applied"] is True
    assert lib["comparative"]["source"] == "library"
    assert lib["comparative"]["pairs"] == [["red circle", "blue circle"]]
    std = client.post("/classify", json={"images": images, "labels": labels}).json()
    assert lib["results"] != std["results"]

    comps = [{"a": "green square", "b": "red circle", "text": "the first is green, while the second is red."}]
    req = client.post(
        "/classify",
        params={"comparative": "true"},
        json={"images": images, "labels": labels, "comparatives": comps, "alpha": 0.5, "symmetric": True},
    ).json()
    assert req["comparative"] == {
        "applied": True,
        "pairs": [["green square", "red circle"]],
        "alpha": 0.5,
        "source": "request",
    }

    none = client.post(
        "/classify",
        params={"comparative": "true"},
        json={"images": images, "labels": ["yellow cross", "purple diamond"]},
    ).json()
    assert none["comparative"]["applied"] is False and none["comparative"]["source"] == "none"


def test_comparative_pairs_are_listed_once_however_many_texts(client: httpx.Client, make_image: Any) -> None:
    """A pair with several texts (one per template or generated answer) is one entry of ``pairs``; its
    reverse order, which corrects the other class, is another; every text is still applied."""
    images = [make_image("circle", "red")]
    labels = ["red circle", "blue circle", "green square"]
    texts = ["the first is red, while the second is blue.", "a red one, while a blue one.", "red, while blue."]
    comps = [{"a": "red circle", "b": "blue circle", "text": t} for t in texts]
    comps.insert(1, {"a": "blue circle", "b": "red circle", "text": "the first is blue, while the second is red."})
    body = {"images": images, "labels": labels, "comparatives": comps, "alpha": 0.5}
    both = client.post("/classify", params={"comparative": "true"}, json=body).json()
    assert both["comparative"]["pairs"] == [["red circle", "blue circle"], ["blue circle", "red circle"]]
    first_text_only = client.post(
        "/classify", params={"comparative": "true"}, json={**body, "comparatives": comps[:2]}
    ).json()
    assert first_text_only["comparative"]["pairs"] == both["comparative"]["pairs"]
    assert first_text_only["results"] != both["results"], "the other texts of the pair must still count"


def test_a_library_with_several_texts_per_pair_lists_each_pair_once(
    tmp_path: Any, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    library = [
        {"a": "red circle", "b": "blue circle", "text": f"the first is red, while the second is blue ({i})."}
        for i in range(4)
    ] + [{"a": "green square", "b": "red circle", "text": "the first has corners, while the second is round."}]
    publish_model(tmp_path, "lib", comparatives=library)
    with serve_app(store=str(tmp_path), model="lib@production") as running:
        answer = httpx.post(
            f"{running.url}/classify",
            params={"comparative": "true"},
            json={"images": [make_image("circle", "red")], "labels": ["red circle", "blue circle", "green square"]},
            timeout=30,
        ).json()
    assert answer["comparative"]["source"] == "library"
    assert answer["comparative"]["pairs"] == [["red circle", "blue circle"], ["green square", "red circle"]]


def test_comparative_gating(client: httpx.Client, make_image: Any) -> None:
    images = [make_image("circle", "red"), make_image("circle", "blue")]
    body = {"images": images, "labels": ["red circle", "blue circle", "green square"]}
    never = client.post("/classify", params={"comparative": "true"}, json={**body, "gate_margin": 0.0}).json()
    assert never["comparative"]["images_gated"] == [False, False]
    std = client.post("/classify", json=body).json()
    assert never["results"] == std["results"]
    always = client.post("/classify", params={"comparative": "true"}, json={**body, "gate_margin": 1.01}).json()
    assert always["comparative"]["images_gated"] == [True, True]
    ungated = client.post("/classify", params={"comparative": "true"}, json=body).json()
    assert always["results"] == ungated["results"]


def test_rank_pair_single_and_batch_agree(client: httpx.Client, make_image: Any) -> None:
    a, b = make_image("circle", "red", "large"), make_image("circle", "red", "small")
    text = "The first image contains a larger shape, while the second contains a smaller shape."
    single = client.post("/rank-pair", json={"image_a": a, "image_b": b, "difference": text}).json()
    assert set(single) == {"model", "first", "score"}
    assert single["first"] == ("a" if single["score"] >= 0 else "b")
    swapped = client.post("/rank-pair", json={"image_a": b, "image_b": a, "difference": text}).json()
    assert swapped["score"] == pytest.approx(-single["score"], abs=1e-5)
    batch = client.post(
        "/rank-pair",
        json={
            "pairs": [
                {"image_a": a, "image_b": b, "difference": text},
                {"image_a": b, "image_b": a, "difference": text},
            ]
        },
    ).json()
    assert set(batch) == {"model", "results"}
    assert batch["results"][0]["score"] == pytest.approx(single["score"], abs=1e-5)
    assert [r["first"] for r in batch["results"]] == [single["first"], swapped["first"]]


def test_rank_orders_consistently_with_pairs(client: httpx.Client, make_image: Any) -> None:
    images = [make_image("square", c) for c in ("red", "blue", "green", "yellow")]
    text = "The first shape is red, while the second is blue."
    body = client.post("/rank", json={"images": images, "difference": text}).json()
    scores = body["scores"]
    assert [r["index"] for r in body["ranking"]] == sorted(range(4), key=lambda i: -scores[i])
    assert sorted(r["index"] for r in body["ranking"]) == [0, 1, 2, 3]
    best, worst = body["ranking"][0]["index"], body["ranking"][-1]["index"]
    pair = client.post(
        "/rank-pair", json={"image_a": images[best], "image_b": images[worst], "difference": text}
    ).json()
    assert pair["first"] == "a"


def test_embed_texts_and_images_with_ids(client: httpx.Client, make_image: Any) -> None:
    texts = ["a red circle", "a red circle", "x " * 100]
    body = client.post("/embed", json={"texts": texts}).json()
    assert body["dim"] == 32 and len(body["embeddings"]) == 3
    assert body["ids"][0] == hashlib.sha256(b"a red circle").hexdigest()
    assert body["truncated"] == [False, False, True]
    vec = np.array(body["embeddings"])
    assert np.allclose(np.linalg.norm(vec, axis=1), 1.0, atol=2e-3)
    assert np.array_equal(vec[0], vec[1])
    other = client.post("/embed", json={"texts": texts[:1], "encoder": "pcclip"}).json()
    assert other["embeddings"][0] != body["embeddings"][0]

    img = make_image("diamond", "cyan")
    emb = client.post("/embed", json={"images": [img]}).json()
    import base64

    assert emb["ids"] == [hashlib.sha256(base64.b64decode(img["data"])).hexdigest()]
    assert "truncated" not in emb
    again = client.post("/embed", json={"images": [{"sha256": emb["ids"][0].upper()}]}).json()
    assert again["embeddings"] == emb["embeddings"]
    ranked = client.post("/rank", json={"images": [{"sha256": emb["ids"][0]}, img], "difference": "x"})
    assert ranked.status_code == 200


def test_truncation_is_reported_in_classify(client: httpx.Client, make_image: Any) -> None:
    long_label = "very " * 40 + "long label"
    body = client.post("/classify", json={"images": [make_image()], "labels": [long_label, "short"]}).json()
    assert body["truncated_texts"] == 5  # every default template of the long label


def test_image_formats_and_data_uri(client: httpx.Client) -> None:
    import base64
    import io

    from PIL import Image

    rgba = Image.new("RGBA", (40, 30), (255, 0, 0, 128))
    out = []
    for fmt, im in (
        ("JPEG", rgba.convert("RGB")),
        ("PNG", rgba),
        ("WEBP", rgba),
        ("GIF", rgba.convert("P")),
        ("BMP", rgba.convert("RGB")),
    ):
        buf = io.BytesIO()
        im.save(buf, fmt)
        out.append({"data": base64.b64encode(buf.getvalue()).decode()})
    out.append({"data": "data:image/png;base64," + out[1]["data"]})
    wrapped = "\n".join(out[1]["data"][i : i + 76] for i in range(0, len(out[1]["data"]), 76))
    out.append({"data": wrapped})
    body = client.post("/embed", json={"images": out})
    assert body.status_code == 200, body.text
    ids = body.json()["ids"]
    assert ids[5] == ids[1] == ids[6]  # same bytes, however they were wrapped


def test_models_listing(client: httpx.Client) -> None:
    body = client.get("/models").json()
    assert body["serving"] == "tiny@v1"
    (model,) = body["models"]
    assert model["name"] == "tiny" and model["aliases"] == {"production": "v1"} and model["serving"] == "v1"
    (version,) = model["versions"]
    assert version["serving"] is True and version["aliases"] == ["production"]
    assert version["text_encoders"] == ["base", "pcclip"]
    assert version["metrics"] == {"smoke.random": 0.5}
    assert client.get("/models/tiny").json() == model


def test_openapi_lists_error_envelope(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    responses = spec["paths"]["/classify"]["post"]["responses"]
    for status in ("400", "404", "413", "422", "429", "503"):
        assert status in responses
    assert "ErrorResponse" in spec["components"]["schemas"]


def test_stage_timing_headers_and_route_templates(client: httpx.Client) -> None:
    r = client.post("/embed", json={"texts": ["timing headers, a fresh text"]})
    assert float(r.headers["x-queue-time"]) >= 0 and float(r.headers["x-inference-time"]) > 0
    assert "x-queue-time" not in client.get("/healthz").headers
    client.get("/models/tiny")
    client.get("/models/does-not-exist")
    text = client.get("/metrics").text
    assert 'route="/models/{name}"' in text and "does-not-exist" not in text
