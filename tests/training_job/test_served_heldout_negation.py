"""A held-out negation phrasing, served: a small Fashion-MNIST base and its DCSM scorer trained
through the tutorial's commands (docs/tutorial.md, cut down to about a minute), served on real
uvicorn, answer ``POST /score/dense`` with "this isn't a {label}." and "you cannot see a {label}
here." (held-out phrasings no training reads, docs/negation.md) right on held-out photos, on both
sides: the photo's label (the affirmative must win) and another label (the negated caption must
win). A scorer that only punishes negation words wins the first side and loses the second."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from typer.testing import CliRunner

from training.cli import app
from training.generate.negation_grammar import FormSplit, form_named

SOURCE = Path("/usr/share/datasets/fashion-mnist")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SOURCE.exists(), reason="apt-get install dataset-fashion-mnist")]

HELD_OUT = ("this_isnt", "cannot_see")
PHOTOS = 40


def test_a_served_held_out_negation_phrasing_answers_right_on_both_sides(
    tmp_path: Path, serve_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN401
    torch.set_num_threads(1)
    monkeypatch.setenv("CLIP_FEATURE_CACHE", str(tmp_path / "features"))
    data, store = tmp_path / "fashion", tmp_path / "models"
    runner = CliRunner()
    for argv in (
        ["data", "fashion-mnist", str(data), "--limit", "1500", "--test-limit", "200"],
        ["base", "--data", str(data / "train.jsonl"), "--config", "vit-tiny-32", "--steps", "150",
         "--batch-size", "64", "--text-freeze-steps", "30", "--threads", "1", "--store", str(store), "--name",
         "fashion", "--alias", "production", "--out", str(tmp_path / "base")],
        ["dcsm", "--model", "fashion@v1", "--data", str(data / "train.jsonl"), "--store", str(store), "--steps",
         "200", "--batch-size", "32", "--threads", "1", "--run-dir", str(tmp_path / "dcsm")],
    ):  # fmt: skip
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()][:PHOTOS]
    labels = sorted({r["label"] for r in records})
    assert all(form_named(name).split == FormSplit.HELDOUT for name in HELD_OUT)
    wins: dict[tuple[str, str], list[bool]] = {}
    with serve_app(store=str(store), model="fashion@v2") as server:
        client = httpx.Client(base_url=server.url, timeout=60)
        for i, record in enumerate(records):
            image = {"data": base64.b64encode((data / record["image"]).read_bytes()).decode()}
            other = labels[(labels.index(record["label"]) + 1 + i) % len(labels)]
            if other == record["label"]:
                other = labels[(labels.index(other) + 1) % len(labels)]
            for name in HELD_OUT:
                for side, label in (("present", record["label"]), ("absent", other)):
                    affirmative, negated = form_named(name).pair(label)
                    r = client.post("/score/dense", json={"image": image, "texts": [affirmative, negated]})
                    assert r.status_code == 200, r.text
                    assert r.json()["model"] == "fashion@v2"
                    right = 0 if side == "present" else 1
                    wins.setdefault((name, side), []).append(r.json()["best"] == right)
    accuracy = {key: sum(w) / len(w) for key, w in wins.items()}
    # Measured on these 40 photos (AMD EPYC): present 1.00 / 0.95, absent 0.68 / 0.82; trained on the
    # forms as written (no composed captions) 0.40 / 0.40 and 0.48 / 0.85. A scorer that punishes
    # negation words scores 1 and 0, one that ignores them 0.5 overall.
    for name in HELD_OUT:
        assert accuracy[(name, "present")] >= 0.75 and accuracy[(name, "absent")] >= 0.55, accuracy
        assert (accuracy[(name, "present")] + accuracy[(name, "absent")]) / 2 >= 0.7, accuracy
