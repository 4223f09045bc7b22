"""``clip-train evaluate --data``: real Fashion-MNIST images, a real tiny model, eval.json and the
HTML report written into the version; what the version lacks is skipped and said."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from clipcore.models.clip_model import build_model
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore
from training.cli import app
from training.datasets.fashion_mnist import LABELS, read_idx
from training.derive import DerivedParts, publish_derived
from training.recipe import model_config

SOURCE = Path("/usr/share/datasets/fashion-mnist")
pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="apt-get install dataset-fashion-mnist")
runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fmnist")
    result = runner.invoke(app, ["data", "fashion-mnist", str(out), "--limit", "40", "--test-limit", "60"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    store = ModelStore(root)
    torch.manual_seed(0)
    config = model_config("shapes-smoke")
    publish_bundle(store, "fm", TrainedModel(build_model(config), config), aliases=["plain"])
    library = [
        {"a": "shirt", "b": "t-shirt", "text": "The first image shows long sleeves, while the second short ones."},
        {"a": "t-shirt", "b": "shirt", "text": "The first image shows short sleeves, while the second long ones."},
        {"a": "coat", "b": "planet", "text": "A label the data does not have: never used."},
    ]
    publish_derived(
        store,
        "fm@plain",
        DerivedParts(files={"comparatives.json": json.dumps(library).encode()}),
        aliases=["with-library"],
    )
    return root


def test_the_converter_writes_the_raw_pixels_and_labels(data: Path) -> None:
    images, labels = read_idx(SOURCE / "t10k-images-idx3-ubyte.gz"), read_idx(SOURCE / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10000, 28, 28)
    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 60 and len((data / "train.jsonl").read_text().splitlines()) == 40
    for i in (0, 59):
        assert np.array_equal(np.asarray(Image.open(data / rows[i]["image"])), images[i])
        assert rows[i]["label"] == LABELS[labels[i]]
    assert set(json.loads((data / "labels.json").read_text())) == set(LABELS)


@pytest.mark.slow
def test_evaluate_writes_figures_and_report_into_the_version(data: Path, root: Path, tmp_path: Path) -> None:
    args = ["evaluate", "fm@with-library", "--store", str(root), "--data", str(data / "test.jsonl"),
            "--split", "all", "--dataset-name", "fmnist", "--seeds", "2", "--n-captions", "20"]  # fmt: skip
    result = runner.invoke(app, [*args, "--out", str(tmp_path)])
    store = ModelStore(root)
    assert result.exit_code == 0, result.output
    name, version = store.resolve("fm@with-library")
    assert store.annex_files(name, version) == ["eval.json", "report.html"]
    report = json.loads(store.file_path(name, version, "eval.json").read_text())
    m = report["metrics"]
    for key in ("zeroshot.acc", "zeroshot_comparative.acc", "zeroshot.confused_acc", "rank_pair.label.base",
                "hard_negatives.cosine.all", "hard_negatives.cosine.label",
                "semclip.orig_over_neg.base", "winoground.group.cosine"):  # fmt: skip
        assert 0.0 <= m[f"data.fmnist.{key}"] <= 1.0, key
        assert f"data.fmnist.{key}.stderr" in m
    section = report["datasets"]["fmnist"]
    zs = section["details"]["zeroshot"]
    # All 60 images every seed: accuracy is the confusion matrix's diagonal, the same on each seed.
    matrix = np.array(zs["confusion"])
    assert matrix.sum() == 60 and m["data.fmnist.zeroshot.acc"] == pytest.approx(np.trace(matrix) / 60)
    assert m["data.fmnist.zeroshot.acc.stderr"] == 0.0
    assert zs["comparative_classes"] == ["shirt", "t-shirt"] and zs["comparatives"] == 2  # "planet" left out
    targeted = [zs["labels"].index(c) for c in ("shirt", "t-shirt")]
    after = np.array(zs["confusion_comparative"])
    assert m["data.fmnist.zeroshot_comparative.confused_acc"] == pytest.approx(
        after[targeted, targeted].sum() / after[targeted].sum()
    )
    assert set(section["skipped"]) >= {"pcclip", "dcsm", "yukino"} and "comparative" not in section["skipped"]
    page = store.file_path(name, version, "report.html").read_text()
    assert page.count('src="data:image/png;base64,') >= 4
    assert (tmp_path / "fmnist-confusion.png").read_bytes()[:4] == b"\x89PNG"
    assert report["report"] == "report.html"

    # A second dataset is added beside the first; the first one's figures stay.
    again = runner.invoke(app, [*args[:9], "second", "--seeds", "1", "--n-captions", "5"])
    assert again.exit_code == 0, again.output
    merged = json.loads(store.file_path(name, version, "eval.json").read_text())
    assert "data.fmnist.zeroshot.acc" in merged["metrics"] and "data.second.zeroshot.acc" in merged["metrics"]


def test_a_version_without_a_library_skips_comparatives_and_says_why(data: Path, root: Path) -> None:
    result = runner.invoke(app, ["evaluate", "fm@plain", "--store", str(root), "--data", str(data / "test.jsonl"),
                                 "--split", "all", "--seeds", "1", "--n-captions", "5", "--no-write"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "has no comparatives for these labels" in " ".join(result.output.split())
    store = ModelStore(root)
    name, version = store.resolve("fm@plain")
    assert store.annex_files(name, version) == []


def test_bad_data_stops_the_evaluation_with_its_line(data: Path, root: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"image": str(data / "images/test/00000.png"), "label": "shirt"}) + "\n{oops\n")
    result = runner.invoke(app, ["evaluate", "fm@plain", "--store", str(root), "--data", str(bad), "--split", "all"])
    assert result.exit_code == 1
    assert "bad.jsonl:2" in result.output


def test_an_unknown_version_is_named_without_a_traceback(data: Path, root: Path) -> None:
    result = runner.invoke(app, ["evaluate", "fm@nowhere", "--store", str(root), "--data", str(data / "test.jsonl")])
    assert result.exit_code == 1 and "nowhere" in result.output and "Traceback" not in result.output
