"""What the client sends for each endpoint and how it reads the answers (real local server)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest
from scripted_server import Reply, ScriptedServer, envelope

from clipdiff import (
    BadRequest,
    Client,
    ClipServiceError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)

IMG = b"\x89PNG fake image bytes"
B64 = base64.b64encode(IMG).decode()
SHA = "ab" * 32

CLASSIFY = {
    "model": "default@v1",
    "comparative": {"applied": True, "pairs": [["circle", "square"]], "alpha": 0.9, "source": "request"},
    "results": [
        {
            "label": "circle",
            "top_k": [
                {"label": "circle", "probability": 0.7, "cosine": 0.31},
                {"label": "square", "probability": 0.3, "cosine": 0.22},
            ],
        }
    ],
    "truncated_texts": 0,
    "a_field_from_a_newer_server": {"x": 1},
}


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[Client]:
    with Client(server.url, max_retries=0) as c:
        yield c


def test_classify_body_query_and_result(server: ScriptedServer, client: Client) -> None:
    server.script("/classify", Reply(body=CLASSIFY))
    res = client.classify(
        [IMG],
        ["circle", "square"],
        templates=["a {}."],
        comparative=True,
        comparatives=[("circle", "square", "a circle is round, while a square has corners")],
        alpha=0.8,
        gate_margin=0.2,
        top_k=2,
        model="default@production",
    )
    (seen,) = server.hits("/classify")
    assert seen.method == "POST" and seen.query == {"comparative": ["true"]}
    assert seen.body == {
        "images": [{"data": B64}],
        "labels": ["circle", "square"],
        "templates": ["a {}."],
        "comparatives": [{"a": "circle", "b": "square", "text": "a circle is round, while a square has corners"}],
        "alpha": 0.8,
        "gate_margin": 0.2,
        "top_k": 2,
        "model": "default@production",
    }
    assert res.model == "default@v1" and res.labels == ["circle"]
    assert res.comparative is not None and res.comparative.applied and res.comparative.pairs == [("circle", "square")]
    assert res.results[0].score("square").cosine == pytest.approx(0.22)
    assert res.results[0].score("triangle") is None
    # Unknown fields of a newer server are kept, not rejected.
    assert res.model_extra == {"a_field_from_a_newer_server": {"x": 1}}


def test_classify_defaults_send_no_options(server: ScriptedServer, client: Client) -> None:
    server.script("/classify", Reply(body=CLASSIFY))
    client.classify([IMG], ("circle", "square"))
    (seen,) = server.hits("/classify")
    assert seen.query == {} and set(seen.body) == {"images", "labels"}
    with pytest.raises(TypeError):
        client.classify([IMG], "circle")  # a single string is not a label list


def test_rank_pair_single_and_batch(server: ScriptedServer, client: Client) -> None:
    server.script(
        "/rank-pair",
        Reply(body={"model": "m@1", "first": "b", "score": -0.25}),
        Reply(body={"model": "m@1", "results": [{"first": "a", "score": 0.5}, {"first": "b", "score": -0.1}]}),
    )
    one = client.rank_pair(IMG, {"sha256": SHA}, "the first is red, while the second is blue", encoder="pcclip")
    assert (one.model, one.first, one.score) == ("m@1", "b", -0.25)
    many = client.rank_pairs([(IMG, IMG, "d1"), ({"sha256": SHA}, IMG, "d2")])
    assert [(p.model, p.first, p.score) for p in many] == [("m@1", "a", 0.5), ("m@1", "b", -0.1)]
    single, batch = server.hits("/rank-pair")
    assert single.body == {
        "image_a": {"data": B64},
        "image_b": {"sha256": SHA},
        "difference": "the first is red, while the second is blue",
        "encoder": "pcclip",
    }
    assert batch.body == {
        "pairs": [
            {"image_a": {"data": B64}, "image_b": {"data": B64}, "difference": "d1"},
            {"image_a": {"sha256": SHA}, "image_b": {"data": B64}, "difference": "d2"},
        ]
    }


def test_rank(server: ScriptedServer, client: Client) -> None:
    ranking = [{"index": 1, "score": 0.3}, {"index": 0, "score": 0.1}]
    server.script("/rank", Reply(body={"model": "m@1", "ranking": ranking, "scores": [0.1, 0.3]}))
    res = client.rank([IMG, IMG], "larger")
    assert res.order == [1, 0] and res.scores == [0.1, 0.3]
    assert server.hits("/rank")[0].body == {"images": [{"data": B64}, {"data": B64}], "difference": "larger"}


def test_embed_texts_and_images(server: ScriptedServer, client: Client) -> None:
    server.script(
        "/embed",
        Reply(body={"model": "m@1", "dim": 2, "embeddings": [[0.6, 0.8]], "ids": [SHA], "truncated": [False]}),
        Reply(body={"model": "m@1", "dim": 2, "embeddings": [[1.0, 0.0], [0.0, 1.0]], "ids": [SHA, SHA]}),
    )
    texts = client.embed_texts(["a red circle"], encoder="base")
    assert texts.dim == 2 and texts.truncated == [False]
    assert texts.as_numpy().shape == (1, 2) and str(texts.as_numpy().dtype) == "float32"
    images = client.embed_images([IMG, {"sha256": SHA}])
    assert images.ids == [SHA, SHA] and images.as_numpy().tolist() == [[1.0, 0.0], [0.0, 1.0]]
    t, i = server.hits("/embed")
    assert t.body == {"texts": ["a red circle"], "encoder": "base"}
    assert i.body == {"images": [{"data": B64}, {"sha256": SHA}]}


def test_score_dense(server: ScriptedServer, client: Client) -> None:
    server.script("/score/dense", Reply(body={"model": "m@1", "scores": [0.2, 0.9], "best": 1, "cosine": [0.1, 0.2],
                                              "functional_words": [[], ["left"]]}))  # fmt: skip
    res = client.score_dense(IMG, ["a", "b"], return_maps=False)
    assert res.best == 1 and res.maps is None and res.functional_words == [[], ["left"]]
    assert server.hits("/score/dense")[0].body == {"image": {"data": B64}, "texts": ["a", "b"], "return_maps": False}


def test_models_and_model(server: ScriptedServer, client: Client) -> None:
    info = {"name": "default", "aliases": {"production": "v2"}, "serving": "v2",
            "versions": [{"version": "v2", "created_at": "2025-01-01T00:00:00Z", "aliases": ["production"],
                          "serving": True, "text_encoders": ["base", "pcclip"], "metrics": {"a": 0.9}}]}  # fmt: skip
    server.script("/models", Reply(body={"serving": "default@v2", "models": [info]}))
    server.script("/models/my%20model", Reply(body={**info, "name": "my model"}))
    assert client.models().models[0].versions[0].text_encoders == ["base", "pcclip"]
    assert client.model("my model").name == "my model"


def test_a_client_model_is_sent_unless_a_call_names_its_own(server: ScriptedServer) -> None:
    served = [
        {"ref": "default@production", "serving": "default@v2", "state": "ready", "default": True, "store": "ok"},
        {"ref": "other@v3", "serving": None, "state": "unloaded", "default": False, "store": "ok"},
    ]
    server.script("/models", Reply(body={"serving": "default@v2", "served": served, "models": []}))
    server.script("/embed", Reply(body={"model": "other@v3", "dim": 2, "embeddings": [[1.0, 0.0]], "ids": ["x"]}))
    server.script("/rank", Reply(body={"model": "default@v2", "ranking": [], "scores": []}))
    with Client(server.url, max_retries=0, split=False, model="other@v3") as c:
        assert [(m.ref, m.serving, m.state, m.default) for m in c.served_models()] == [
            ("default@production", "default@v2", "ready", True),
            ("other@v3", None, "unloaded", False),
        ]
        assert c.embed_texts(["a"]).model == "other@v3"
        c.rank([IMG], "d", model="default")
    assert server.hits("/embed")[0].body == {"texts": ["a"], "model": "other@v3"}
    assert server.hits("/rank")[0].body["model"] == "default"
    with Client(server.url, max_retries=0, split=False) as plain:
        plain.rank([IMG], "d")
    assert "model" not in server.hits("/rank")[1].body  # the server's default model answers


def test_health_ready_and_wait(server: ScriptedServer, client: Client) -> None:
    server.script("/healthz", Reply(body={"status": "ok"}))
    server.script("/readyz", Reply(503, envelope("not_ready", "loading")), Reply(body={"ready": True, "model": "m@1"}))
    assert client.health()
    assert not client.ready()
    client.wait_ready(timeout=5, interval=0.01)
    assert client.ready()


def test_wait_ready_times_out_and_probes_never_raise() -> None:
    with Client("http://127.0.0.1:9", max_retries=0, timeout=1) as dead:  # port 9: nothing listens
        assert not dead.health() and not dead.ready()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            dead.wait_ready(timeout=0.2, interval=0.05)
        assert time.monotonic() - t0 < 3


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (400, BadRequest, "bad_image"),
        (422, BadRequest, "validation_error"),
        (401, Unauthorized, "unauthorized"),
        (403, Unauthorized, "forbidden"),
        (404, NotFound, "unknown_image"),
        (413, PayloadTooLarge, "payload_too_large"),
        (429, Overloaded, "overloaded"),
        (503, Unavailable, "not_ready"),
        (504, Unavailable, "timeout"),
        (500, ClipServiceError, "internal_error"),
    ],
)
def test_error_envelope_maps_to_exception(
    server: ScriptedServer, client: Client, status: int, kind: type, code: str
) -> None:
    server.script("/rank", Reply(status, envelope(code, "it went wrong", "images.0.data"), {"Retry-After": "7"}))
    with pytest.raises(kind) as info:
        client.rank([IMG, IMG], "d")
    err = info.value
    assert isinstance(err, ClipServiceError)
    assert (err.status, err.code, err.message, err.field) == (status, code, "it went wrong", "images.0.data")
    if status == 429:
        assert err.retry_after == 7.0


def test_foreign_error_bodies_still_give_readable_errors(server: ScriptedServer, client: Client) -> None:
    server.script("/rank", Reply(422, {"detail": [{"msg": "field required"}]}), Reply(502, b"<html>bad gateway</html>"))
    with pytest.raises(BadRequest) as info:
        client.rank([IMG], "d")
    assert info.value.code == "validation_error" and "field required" in info.value.message
    with pytest.raises(ClipServiceError) as info2:
        client.rank([IMG], "d")
    assert info2.value.status == 502 and "bad gateway" in info2.value.message


def test_api_key_and_headers(server: ScriptedServer) -> None:
    server.script("/models", Reply(body={"serving": None, "models": []}))
    with Client(server.url + "/", api_key="s3cret", headers={"x-request-id": "r1"}) as c:
        c.models()
    seen = server.hits("/models")[0]
    assert seen.headers["authorization"] == "Bearer s3cret"
    assert seen.headers["x-request-id"] == "r1"
    assert seen.headers["user-agent"].startswith("clipdiff-client/")


def test_unknown_endpoint_is_not_found(server: ScriptedServer, client: Client) -> None:
    # /score/dense may not exist on an older server: a NotFound, not a crash while parsing.
    with pytest.raises(NotFound):
        client.score_dense(IMG, ["a"])


def test_url_and_key_default_to_the_environment(server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIP_SERVICE_URL", server.url)
    monkeypatch.setenv("CLIP_SERVICE_API_KEY", "env-key")
    server.script("/healthz", Reply(body={"status": "ok"}))
    with Client(max_retries=0) as c:
        assert c.health()
    assert server.hits("/healthz")[-1].headers["authorization"] == "Bearer env-key"
    with Client(server.url, api_key="", max_retries=0) as c:  # an explicit empty key sends none
        c.health()
    assert "authorization" not in server.hits("/healthz")[-1].headers
