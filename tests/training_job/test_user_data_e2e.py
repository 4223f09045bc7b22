"""A user's own data end to end, through the commands a user runs: a folder of drawn pictures and
JSONL records -> ``clip-train base --data`` (from scratch) -> ``pcclip`` -> ``dcsm`` ->
``comparatives`` (an OpenAI-compatible stand-in on 127.0.0.1 that also answers junk) -> each
publishes a version -> the service on real uvicorn answers ``/rank-pair``,
``/classify?comparative=true`` (from the version's library, for the user's labels) and
``/score/dense`` with the new version. Tiny config and few steps: this checks the product's
plumbing and contracts, not accuracy."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
import torch
from typer.testing import CliRunner

from model_store import GateRefused, ModelStore
from tests.training_job.fake_llm import fake_llm_server
from training.cli import app
from training.generate.llm import MIN_CHARS, clean_comparative
from training.userdata.demo_data import LABELS, write_user_dataset

pytestmark = pytest.mark.slow


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def b64(path: Path) -> dict[str, str]:
    return {"data": base64.b64encode(path.read_bytes()).decode()}


def test_own_data_base_pcclip_dcsm_comparatives_publish_and_serve(
    tmp_path: Path, serve_app, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    data = write_user_dataset(tmp_path / "data", per_label=16, scenes=24)
    store, runs, cache = tmp_path / "store", tmp_path / "runs", tmp_path / "features"
    common = ["--data", str(data), "--store", str(store)]
    cached = ["--feature-cache", str(cache)]

    out = invoke("base", *common, "--config", "shapes-smoke", "--steps", "12", "--batch-size", "32",
                 "--text-freeze-steps", "4", "--name", "fruit", "--alias", "production",
                 "--out", str(runs / "base"))  # fmt: skip
    assert "published fruit@v1 (production)" in out
    out = invoke("pcclip", "--model", "fruit@production", *common, *cached, "--steps", "8", "--batch-size", "16",
                 "--generated-pairs", "60", "--lr", "1e-3", "--run-dir", str(runs / "pcclip"))  # fmt: skip
    assert "published fruit@v2" in out
    out = invoke("dcsm", "--model", "fruit@v2", *common, *cached, "--steps", "6", "--batch-size", "8",
                 "--channels", "8", "--hidden", "32", "--run-dir", str(runs / "dcsm"))  # fmt: skip
    assert "published fruit@v3" in out

    monkeypatch.setenv("FRUIT_LLM_KEY", "sk-test-secret")
    with fake_llm_server() as (llm_url, fake):
        out = invoke("comparatives", "--model", "fruit@v3", *common, *cached, "--generator", "llm",
                     "--llm-base-url", llm_url, "--llm-model", "stand-in", "--llm-key-env", "FRUIT_LLM_KEY",
                     "--pairs", "2", "--run-dir", str(runs / "comparatives"))  # fmt: skip
    assert "published fruit@v4" in out
    # Neither v1 nor v4 was evaluated: the gate refuses to move production until one is, or the move is forced.
    with pytest.raises(GateRefused, match="neither v1 nor v4 has an evaluation"):
        ModelStore(store).promote("fruit", "production", "v4")
    ModelStore(store).promote("fruit", "production", "v4", force=True, reason="this test serves it unevaluated")
    assert "sk-test-secret" not in out
    sent = [r for r in fake.requests if r["_authorization"] is not None]
    assert sent and all(r["_authorization"] == "Bearer sk-test-secret" for r in sent)
    assert len(fake.requests) == 1 + 2 * 2 * 3  # one 503 retried, 2 pairs x 2 orders x 3 samples

    model_store = ModelStore(store)
    manifest = model_store.manifest("fruit", "v4")
    assert manifest.components["text_encoders"] == {"pcclip": "text_pcclip.safetensors"}
    assert manifest.components["default_text_encoder"] == "pcclip" and "dcsm" in manifest.components
    assert manifest.training["base"] == "fruit@v3" and manifest.training["method"] == "comparatives"
    library = json.loads((model_store.version_dir("fruit", "v4") / "comparatives.json").read_text())
    assert library, "the junk filter left nothing"
    assert len(library) < 2 * 2 * 3  # junk answers (code, markup, non-ASCII, too short) were dropped
    for entry in library:
        assert {entry["a"], entry["b"]} <= set(LABELS) and entry["a"] != entry["b"]
        text = entry["text"]
        assert clean_comparative(text) == text and len(text) >= MIN_CHARS and "Q:" not in text and "<" not in text
    confused = {frozenset(p[:2]) for p in manifest.training["confused_pairs"]}
    assert {frozenset((e["a"], e["b"])) for e in library} <= confused

    lemon, tomato = data / "images" / "lemon_000.png", data / "images" / "tomato_001.jpg"
    scene = data / "images" / "scene_000.jpg"
    with serve_app(store=str(store), model="fruit@production") as server:
        client = httpx.Client(base_url=server.url, timeout=60)
        ranked = client.post("/rank-pair", json={"image_a": b64(lemon), "image_b": b64(tomato),
                             "difference": "The first fruit is yellow, while the second is red."})  # fmt: skip
        assert ranked.status_code == 200, ranked.text
        assert ranked.json()["model"] == "fruit@v4" and ranked.json()["first"] in ("a", "b")

        labels = sorted(LABELS)
        classified = client.post("/classify", params={"comparative": "true"},
                                 json={"images": [b64(lemon)], "labels": labels})  # fmt: skip
        assert classified.status_code == 200, classified.text
        body = classified.json()
        assert body["model"] == "fruit@v4"
        assert body["comparative"]["source"] == "library" and body["comparative"]["applied"]
        assert {r["label"] for r in body["results"][0]["top_k"]} == set(labels)

        dense = client.post("/score/dense", json={"image": b64(scene), "texts": [
            "a red tomato left of a yellow lemon", "a red tomato right of a yellow lemon"]})  # fmt: skip
        assert dense.status_code == 200, dense.text
        assert dense.json()["model"] == "fruit@v4" and len(dense.json()["scores"]) == 2
        assert "left" in dense.json()["functional_words"][0] and "right" in dense.json()["functional_words"][1]
