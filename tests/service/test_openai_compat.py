"""``/v1/embeddings`` and ``/v1/models`` called by the official ``openai`` package, and the native
``/embed``'s ``encoding_format``, against the real app (uvicorn, the tiny model, real Redis).

The OpenAI route must answer the vectors ``/embed`` answers for the same inputs (one pipeline),
in both of OpenAI's encodings, for texts and for images.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from clipcore.methods.common import truncate_dimensions

TEXTS = ["a red circle", "a blue square to the left of a green cross", "a small yellow triangle"]


@pytest.fixture(scope="module")
def client(base_url: str) -> Any:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def data_uri(image: dict[str, str]) -> str:
    return f"data:image/png;base64,{image['data']}"


def native(base_url: str, body: dict[str, Any]) -> np.ndarray:
    r = httpx.post(f"{base_url}/embed", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float32)


def vectors(answer: Any) -> np.ndarray:
    """The rows of an OpenAI answer; an explicit ``encoding_format="base64"`` leaves them as the
    strings the server sent (little-endian float32), which is how OpenAI's own API answers."""
    rows = [d.embedding for d in answer.data]
    if rows and isinstance(rows[0], str):
        return np.stack([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows]).astype(np.float32)
    return np.asarray(rows, dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_client_text_embeddings_equal_embed(client: Any, base_url: str, encoding_format: str) -> None:
    answer = client.embeddings.create(model="tiny", input=TEXTS, encoding_format=encoding_format)
    got = vectors(answer)
    assert [d.index for d in answer.data] == [0, 1, 2]
    assert answer.model.startswith("tiny@")
    # Usage counts open_clip's BPE tokens plus start and end (the tiny model's context is far larger).
    from open_clip.tokenizer import SimpleTokenizer

    expected = sum(len(SimpleTokenizer().encode(t)) + 2 for t in TEXTS)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == expected
    assert np.all(cosines(got, native(base_url, {"texts": TEXTS})) >= 0.9999)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_client_image_embeddings_equal_embed(
    client: Any, base_url: str, make_image: Any, encoding_format: str
) -> None:
    images = [make_image("circle", "red", "large"), make_image("square", "blue", "small")]
    answer = client.embeddings.create(
        model="tiny@production", input=[data_uri(i) for i in images], encoding_format=encoding_format
    )
    got = vectors(answer)
    assert answer.usage.prompt_tokens == 0  # images are not tokens
    assert np.all(cosines(got, native(base_url, {"images": images})) >= 0.9999)


def test_the_default_openai_call_uses_base64_and_decodes_to_the_same_vectors(client: Any, base_url: str) -> None:
    """The openai package asks for base64 when no format is given, and decodes it itself."""
    answer = client.embeddings.create(model="tiny", input="a red circle")
    got = vectors(answer)
    assert np.all(cosines(got, native(base_url, {"texts": ["a red circle"]})) >= 0.9999)


def test_mixed_texts_and_images_keep_input_order(base_url: str, make_image: Any) -> None:
    image = make_image("cross", "green", "medium")
    body = {"model": "tiny", "input": ["a red circle", data_uri(image), "a green cross"]}
    r = httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 200, r.text
    rows = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    texts = native(base_url, {"texts": ["a red circle", "a green cross"]})
    np.testing.assert_allclose(rows[[0, 2]], texts, atol=1e-6)
    np.testing.assert_allclose(rows[1], native(base_url, {"images": [image]})[0], atol=1e-6)


def test_dimensions_truncate_and_renormalise(client: Any, base_url: str) -> None:
    answer = client.embeddings.create(model="tiny", input=TEXTS, dimensions=16, encoding_format="float")
    got = vectors(answer)
    assert got.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, truncate_dimensions(native(base_url, {"texts": TEXTS}), 16), atol=1e-6)


def test_dimensions_above_the_width_is_a_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="tiny", input="a red circle", dimensions=100_000)
    assert caught.value.status_code == 400
    assert caught.value.body["code"] == "bad_input" and caught.value.body["field"] == "dimensions"


def test_unknown_model_is_a_404_in_the_service_envelope(client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="text-embedding-3-small", input="a red circle")
    body = caught.value.body
    assert body["code"] == "unknown_model" and body["field"] == "model"
    assert "tiny@" in body["message"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "tiny", "input": [[1, 2, 3]]}, 400, "bad_input"),  # token ids
        ({"model": "tiny", "input": []}, 400, "bad_input"),
        ({"model": "tiny", "input": [""]}, 400, "bad_input"),
        ({"model": "tiny", "input": "x", "encoding_format": "float16"}, 422, "validation_error"),
        ({"model": "tiny", "input": "x", "dimensions": 0}, 422, "validation_error"),
        ({"model": "tiny", "input": ["data:image/png;base64,!!!"]}, 400, "bad_input"),
        ({"model": "tiny", "input": ["data:image/png;base64,aGVsbG8="]}, 400, "bad_image"),
        ({"input": "x"}, 422, "validation_error"),
    ],
)
def test_bad_requests_are_answered_in_the_envelope(base_url: str, body: dict[str, Any], status: int, code: str) -> None:
    r = httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


def test_more_inputs_than_the_limits_is_a_413(base_url: str, tiny_server: Any) -> None:
    limit = tiny_server.services.settings.limits.max_texts
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": "tiny", "input": ["a red circle"] * (limit + 1)})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "payload_too_large"


def test_models_list(client: Any, base_url: str) -> None:
    ids = [m.id for m in client.models.list()]
    serving = httpx.get(f"{base_url}/models").json()["serving"]
    assert ids == ["tiny", serving]
    for name in ids:  # every listed id is accepted by /v1/embeddings
        assert client.embeddings.create(model=name, input="a red circle").data


@pytest.mark.parametrize(("fmt", "dtype"), [("base64", "<f4"), ("float16", "<f2")])
def test_embed_encoding_formats_decode_to_the_float_answer(
    base_url: str, make_image: Any, fmt: str, dtype: str
) -> None:
    for body in ({"texts": TEXTS}, {"images": [make_image("circle", "red", "large")]}):
        floats = native(base_url, body)
        r = httpx.post(f"{base_url}/embed", json={**body, "encoding_format": fmt}, timeout=60)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["encoding_format"] == fmt
        packed = np.stack([np.frombuffer(base64.b64decode(s), dtype=dtype) for s in answer["embeddings"]])
        assert packed.shape == floats.shape == (len(answer["ids"]), answer["dim"])
        # Served embeddings are float16-rounded: both packed forms carry them exactly.
        np.testing.assert_array_equal(packed.astype(np.float32), floats)
