"""The training job end to end on the smoke configuration: train, evaluate, publish."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.cli import app


@pytest.mark.slow
def test_build_default_smoke_publishes_an_evaluated_version(tmp_path: Path) -> None:
    store_dir, run_dir = tmp_path / "models", tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["build-default", "--smoke", "--store", str(store_dir), "--run-dir", str(run_dir), "--promote", "production"],
    )
    assert result.exit_code == 0, result.output
    store = ModelStore(store_dir)
    name, version = store.resolve("default@production")
    manifest = store.manifest(name, version)
    assert set(manifest.components["text_encoders"]) == {"pcclip", "semclip", "semclip_para", "semclip_neg", "yukino"}
    assert manifest.components["yukino"]["text_encoder"] == "yukino"  # its own finetuned text variant
    assert manifest.components["default_text_encoder"] == "pcclip"
    for key in (
        "base.zeroshot.shape",
        "pcclip.rank_pair.size",
        "cosine.binding",
        "pcclip.comparative.selected.confused",
        "semclip.semclip.orig_over_neg",
        "base.semclip_heldout.retrieval_orig",
        "semclip_neg.semclip.composite",
        "yukino.winoground.group",
        "oti.swap.binding",
        "base.winoground.negation.group",
        "retrieval.compositional.dcsm.r10",
        "retrieval.difference.pcclip.r1",
    ):
        assert 0.0 <= manifest.metrics[key] <= 1.0
    report = json.loads((store.version_dir(name, version) / "eval.json").read_text())
    assert report["model"] == f"{name}@{version}" and report["seeds"] == [0, 1]
    assert "base.rank_pair.size.stderr" in report["metrics"]
    assert "| metric | base | pcclip | semclip | semclip_neg | semclip_para |" in result.output
    assert "| metric | base | oti | yukino |" in result.output
    comparatives = json.loads((store.version_dir(name, version) / "comparatives.json").read_text())
    assert {
        "a": "circle",
        "b": "square",
        "text": "The first image contains a circle, while the second contains a square.",
    } in comparatives
    bundle = ModelBundle.load(store, "default@production")
    assert bundle.encode_texts(["a red circle"]).shape == (1, manifest.embed_dim)
    assert bundle.yukino_prompts(np.zeros((2, 64, 64, 3), np.uint8)).shape == (2, 2, manifest.embed_dim)

    # Rerunning resumes from the finished checkpoints and publishes the next version.
    again = CliRunner().invoke(app, ["build-default", "--smoke", "--store", str(store_dir), "--run-dir", str(run_dir),
                                     "--eval-seeds", "1"])  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "resumed from step" in again.output
    assert again.output.count("reusing ") >= 6, "PC-CLIP, the SemCLIP variants, YUKINO's text and inverter reused"
    # Without --promote the new version is published and no alias moves.
    assert store.list_versions("default") == ["v1", "v2"] and store.resolve("default@production")[1] == "v1"
