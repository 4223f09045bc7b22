"""Retrieval rows of ``clip-train evaluate --data``: real Fashion-MNIST images and a real tiny model with
a DCSM scorer, through the command; and the evaluation's DCSM re-rank scores what a search scores."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.cli import app
from training.evaluation.methods.retrieval import dense_scores

SOURCE = Path("/usr/share/datasets/fashion-mnist")
pytestmark = [pytest.mark.skipif(not SOURCE.exists(), reason="apt-get install dataset-fashion-mnist"),
              pytest.mark.slow]  # fmt: skip
runner = CliRunner()
TEXT_KINDS = ("compositional", "negated")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fmnist")
    result = runner.invoke(app, ["data", "fashion-mnist", str(out), "--limit", "10", "--test-limit", "60"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Callable[..., str]) -> Path:
    root = tmp_path_factory.mktemp("store")
    publish_dense_model(root)
    return root


@pytest.fixture(scope="module")
def evaluated(data: Path, root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, str]:
    """(the printed table, eval.json's metrics, report.html) of one evaluate run on 60 photos."""
    out = tmp_path_factory.mktemp("report")
    args = ["evaluate", "dense@production", "--store", str(root), "--data", str(data / "test.jsonl"),
            "--split", "all", "--dataset-name", "fm", "--seeds", "2", "--n-zeroshot", "20", "--n-pairs", "20",
            "--n-captions", "12", "--n-gallery", "40", "--threads", "1", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "eval.json").read_text())["metrics"]
    return result.output, metrics, (out / "report.html").read_text()


def test_evaluate_prints_retrieval_rows_with_their_change_and_chance(evaluated: tuple[str, dict, str]) -> None:
    output, _, report = evaluated
    lines = output.splitlines()
    for kind in TEXT_KINDS:
        for at in ("1", "10"):
            assert f"| {kind} text queries, recall@{at}, cosine | `retrieval.{kind}.cosine.r{at}` |" in output
            row = next(line for line in lines if f"`retrieval.{kind}.dcsm.r{at}`" in line)
            assert " vs cosine |" in row  # the change column: DCSM's paired gain over cosine
            assert row.rstrip(" |").rsplit("|", 1)[1].strip().startswith("0.")  # chance, as measured
    diff = next(line for line in lines if "`retrieval.difference.pcclip.r10`" in line)
    assert " vs sum baseline |" in diff
    assert "`retrieval.difference.chance" not in output  # chance is a column, not a row
    assert "retrieval over a gallery" in report


def test_eval_json_holds_every_figure_its_stderr_gain_and_chance(evaluated: tuple[str, dict, str]) -> None:
    _, metrics, _ = evaluated
    keys = {k[len("data.fm.") :] for k in metrics if k.startswith("data.fm.retrieval.")}
    for kind, (first, second) in {"compositional": ("cosine", "dcsm"), "negated": ("cosine", "dcsm"),
                                  "difference": ("sum", "pcclip")}.items():  # fmt: skip
        for at in ("r1", "r10"):
            for ranking in (first, second, "chance"):
                key = f"retrieval.{kind}.{ranking}.{at}"
                assert {key, f"{key}.stderr"} <= keys
                assert 0.0 <= metrics[f"data.fm.{key}"] <= 1.0
            ours, theirs = (metrics[f"data.fm.retrieval.{kind}.{r}.{at}"] for r in (second, first))
            # The mean of the per-seed differences is the difference of the means.
            assert metrics[f"data.fm.gain.retrieval.{kind}.{second}.{at}"] == pytest.approx(ours - theirs)
    # Negated queries ("a thing with long sleeves, not a coat."): one or two labels of ten satisfy
    # each, so a random order fills little of the top 10 with them.
    assert metrics["data.fm.retrieval.negated.chance.r10"] < 0.4


def test_the_batched_rerank_scores_each_candidate_as_a_dense_search_does(root: Path) -> None:
    bundle = ModelBundle.load(ModelStore(root), "dense@production")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, bundle.image_size, bundle.image_size, 3), dtype=np.uint8)
    tokens = bundle.encode_dense_images(images)
    text = "a photo of an item with no collar and long sleeves."
    candidates = np.array([4, 0, 2])
    batched = dense_scores(bundle, tokens, candidates, text)
    texts, layouts = bundle.encode_dense_texts([text]), bundle.dense_layouts([text])
    one_by_one = [float(bundle.score_dense(tokens[c], texts, layouts)[0][0]) for c in candidates]
    assert batched == pytest.approx(one_by_one, abs=1e-5)


def test_a_rerank_over_the_whole_gallery_ranks_every_photo_by_dcsm(data: Path, root: Path) -> None:
    """``rerank_k`` (``scripts/eval_retrieval.py --rerank-k``) is the search's ``k``: at the gallery's
    size the DCSM rows are those of DCSM ranking every photo; at 2 a re-rank holds two photos."""
    from clipcore.methods.retrieval import (
        cosine_top_k,
        first_stage_query,
        first_stage_texts,
        order_by_scores,
        recall_at_k,
        reranked,
    )
    from training.evaluation.userdata.data import UserEvalConfig, load_eval_set, sample
    from training.evaluation.userdata.retrieval import compositional_queries, retrieval

    bundle = ModelBundle.load(ModelStore(root), "dense@production")
    es = load_eval_set(data / "test.jsonl", bundle, "all")
    whole = retrieval(es, UserEvalConfig(n_gallery=40, rerank_k=40, n_captions=8), seed=0)
    picked = sample(es.labelled, 40, 0, salt=9)
    labels = [item.record.label for item in picked]  # type: ignore[union-attr]
    tokens = bundle.encode_dense_images(np.stack([es.pixels(item.images[0]) for item in picked]))
    queries = compositional_queries({n: dict(es.dataset.labels.get(n, {})) for n in sorted(set(labels))}, labels)
    kept = [(text, rel) for text, rel in zip(queries.texts, queries.relevant, strict=True) if rel.any()]
    by_dcsm = [order_by_scores(dense_scores(bundle, tokens, np.arange(40), text)) for text, _ in kept]
    expected = np.mean([recall_at_k(r, rel, 10) for r, (_, rel) in zip(by_dcsm, kept, strict=True)])
    assert whole["retrieval.compositional.dcsm.r10"] == pytest.approx(expected)
    two = retrieval(es, UserEvalConfig(n_gallery=40, rerank_k=2, n_captions=8), seed=0)
    pooled = es.embed([item.images[0] for item in picked])
    heads = []
    for text, _ in kept:  # the first stage's two nearest photos, in DCSM's order
        candidates = cosine_top_k(pooled, first_stage_query(text, bundle.encode_texts(first_stage_texts(text))), 2)
        heads.append(reranked(candidates, dense_scores(bundle, tokens, candidates, text)))
    expected = np.mean([recall_at_k(h, rel, 10) for h, (_, rel) in zip(heads, kept, strict=True)])
    assert two["retrieval.compositional.dcsm.r10"] == pytest.approx(expected)
    assert two["retrieval.compositional.dcsm.r10"] != pytest.approx(whole["retrieval.compositional.dcsm.r10"])
