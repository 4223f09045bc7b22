"""Training on a user's data: bad data stops every command before training (file and line listed),
the frozen-feature cache computes each image once per image tower (a second run computes nothing,
a derived version shares its base's cache), checkpoints resume to the uninterrupted result, and
each method publishes a version that keeps its base's parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import image_features, normalize
from clipcore.models.preprocess import fit_square
from model_store import ModelStore
from training.cli import app
from training.derive import DerivedParts, publish_derived
from training.feature_cache import tower_key
from training.methods.yukino import OTIHyper, TextHyper
from training.userdata.context import RunContext
from training.userdata.demo_data import write_user_dataset
from training.userdata.pcclip import PCClipRun, run_pcclip
from training.userdata.semclip import SemClipRun, run_semclip
from training.userdata.yukino import YukinoRun, run_yukino


@pytest.fixture(scope="module")
def user_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_user_dataset(tmp_path_factory.mktemp("user") / "data", per_label=8, scenes=10)


@pytest.fixture
def store(tmp_path: Path, publish_model) -> Path:  # noqa: ANN001
    root = tmp_path / "store"
    publish_model(root, "tiny", comparatives=[])
    return root


def context(store: Path, data: Path, tmp_path: Path, name: str = "run", model: str = "tiny@production") -> RunContext:
    torch.set_num_threads(1)
    return RunContext.open(ModelStore(store), model, data, run_dir=tmp_path / name,
                           cache_dir=tmp_path / "features", log=lambda _: None)  # fmt: skip


@pytest.mark.parametrize("command", ["pcclip", "dcsm", "semclip", "yukino", "comparatives", "base"])
def test_bad_data_is_listed_with_file_and_line_and_nothing_trains(
    command: str, user_data: Path, tmp_path: Path, store: Path
) -> None:
    data = tmp_path / "bad"
    data.mkdir()
    good = (user_data / "labelled.jsonl").read_text().splitlines()
    (data / "images").symlink_to(user_data / "images")
    (data / "broken.png").write_bytes(b"\x89PNG not really")
    lines = [good[0], '{"image": "images/none.png", "label": "lime"}', "{not json", good[1],
             '{"image": "broken.png", "label": "lime"}',
             '{"image": "images/lime_000.png", "label": "kiwi"}']  # fmt: skip
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    (data / "labels.json").write_text(json.dumps(["tomato", "lemon", "lime", "plum"]))
    args = [command, "--data", str(data), "--store", str(store)]
    args += ["--name", "tiny", "--out", str(tmp_path / "run")] if command == "base" else ["--model", "tiny@production"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())  # rich wraps long lines
    train = str(data / "train.jsonl")
    for line, words in ((2, "not found"), (3, "bad JSON"), (5, "does not decode"), (6, "unknown label 'kiwi'")):
        assert f"{train}:{line}: " in out and words in out, (line, out)
    assert "4 problem(s)" in out and "nothing was trained" in out
    assert ModelStore(store).list_versions("tiny") == ["v1"]  # nothing published


def test_features_are_computed_once_per_image_tower_and_reused(user_data: Path, tmp_path: Path, store: Path) -> None:
    first = context(store, user_data, tmp_path)
    refs = [item.images[0] for item in first.dataset.of_kind("label")]
    pooled = first.features.of("pooled", refs)
    dense = first.features.of("dense", refs[:5])
    assert first.features.cache.computed == {"pooled": len(refs), "dense": 5}
    # What the service computes for the same files.
    pixels = np.stack([fit_square(Image.open(r.path), first.bundle.image_size) for r in refs])  # type: ignore[arg-type]
    np.testing.assert_allclose(pooled, first.bundle.encode_images(pixels), atol=1e-5)
    with torch.no_grad():
        _, tokens = image_features(first.bundle.model, first.bundle.preprocess_config.normalize(pixels[:5]), dense=True)
    np.testing.assert_allclose(dense, normalize(tokens).numpy(), atol=2e-3)  # stored as float16

    second = context(store, user_data, tmp_path, "again")  # another run, another process's view
    np.testing.assert_array_equal(second.features.of("pooled", refs), pooled)
    np.testing.assert_array_equal(second.features.of("dense", refs[:5]), dense)
    assert second.features.cache.computed == {"pooled": 0, "dense": 0}
    assert isinstance(second.features.cache.store("pooled")._chunk(0), np.memmap)

    # A version derived from it keeps its image tower, hence its cache; another tower does not.
    derived = publish_derived(ModelStore(store), "tiny@production", DerivedParts(files={"comparatives.json": b"[]"}))
    assert tower_key(derived) == tower_key(first.bundle.manifest) == first.features.cache.key
    third = context(store, user_data, tmp_path, "derived", model=derived.ref)
    third.features.of("pooled", refs)
    assert third.features.cache.computed == {"pooled": 0}
    other = ModelStore(store).manifest("tiny", "v1").model_copy(update={"architecture": {"changed": True}})
    assert tower_key(other) != first.features.cache.key


def test_pcclip_resumes_to_the_uninterrupted_result(user_data: Path, tmp_path: Path, store: Path) -> None:
    cfg = dict(steps=6, batch_size=8, lr=1e-3, generated_pairs=20, checkpoint_every=2)
    whole = run_pcclip(context(store, user_data, tmp_path, "whole"), PCClipRun(**cfg), name="whole")  # type: ignore[arg-type]
    ctx = context(store, user_data, tmp_path, "parts")
    assert run_pcclip(ctx, PCClipRun(**cfg, stop_after=3), name="parts") is None  # type: ignore[arg-type]
    assert ctx.checkpoint("pcclip").exists()
    resumed = run_pcclip(context(store, user_data, tmp_path, "parts"), PCClipRun(**cfg), name="parts")  # type: ignore[arg-type]
    assert whole is not None and resumed is not None
    a = ModelBundle.load(ModelStore(store), whole.ref).text_model("pcclip").state_dict()
    b = ModelBundle.load(ModelStore(store), resumed.ref).text_model("pcclip").state_dict()
    base = ModelBundle.load(ModelStore(store), "tiny@production").model.state_dict()
    assert not torch.equal(a["text_projection"], base["text_projection"])  # it trained
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)


def test_semclip_and_yukino_publish_versions_that_keep_the_base(user_data: Path, tmp_path: Path, store: Path) -> None:
    ctx = context(store, user_data, tmp_path)
    semclip = run_semclip(ctx, SemClipRun(steps=3, batch_size=8), aliases=("staging",))
    assert semclip is not None
    bundle = ModelBundle.load(ModelStore(store), "tiny@staging")
    assert set(bundle.text_models) == {"base", "pcclip", "semclip"}  # the base's pcclip kept
    yukino = run_yukino(
        context(store, user_data, tmp_path, "y", model=semclip.ref),
        YukinoRun(
            steps=3,
            batch_size=8,
            width=32,
            text_encoder="semclip",
            oti_items=4,
            oti=OTIHyper(steps=2),
            text=TextHyper(steps=3),
        ),  # fmt: skip
    )
    assert yukino is not None
    loaded = ModelBundle.load(ModelStore(store), yukino.ref)
    # The full method: a text variant finetuned from semclip, and the inverter inverting into it.
    assert loaded.yukino is not None and loaded.yukino.text_encoder == "yukino"
    assert set(loaded.text_models) == {"base", "pcclip", "semclip", "yukino"}
    pixels = np.zeros((2, loaded.image_size, loaded.image_size, 3), dtype=np.uint8)
    assert loaded.yukino_prompts(pixels).shape == (2, 2, loaded.embed_dim)


def test_dcsm_contrasts_a_labelled_image_with_another_label_and_its_own_negation(user_data: Path) -> None:
    """Label records alone still teach DCSM what "no" does: each labelled image gets another
    label's caption and its caption's rule-based edits (the negation) as hard negatives."""
    from types import SimpleNamespace

    from training.datasets.dataset import load_dataset
    from training.userdata.dcsm import negative_items

    dataset = load_dataset(user_data / "labelled.jsonl")
    items = negative_items(SimpleNamespace(dataset=dataset, seed=0))  # type: ignore[arg-type]
    assert items.images and len(items.captions) == len(items.negatives) == items.generated
    for caption, negatives in zip(items.captions, items.negatives, strict=True):
        label = caption.removeprefix("a photo of ").split(" ", 1)[1].rstrip(".")
        other = negatives[0].removeprefix("a photo of ").split(" ", 1)[1].rstrip(".")
        assert other != label and other in dataset.labels
        assert any(n.startswith("no ") or " not " in n or " no " in n for n in negatives[1:]), negatives


def test_dcsm_reads_the_labels_attributes_only_when_asked(user_data: Path) -> None:
    """``--attribute-captions``: labelled images whose label declares attributes also get captions
    of those attributes without the label's name; without it the items are what they were."""
    from types import SimpleNamespace

    from training.datasets.dataset import load_dataset
    from training.userdata.dcsm import negative_items

    dataset = load_dataset(user_data / "labelled.jsonl")
    ctx = SimpleNamespace(dataset=dataset, seed=0)
    plain = negative_items(ctx)  # type: ignore[arg-type]
    with_attributes = negative_items(ctx, attribute_captions=True)  # type: ignore[arg-type]
    assert plain.captions and set(plain.captions) <= set(with_attributes.captions)
    added = [(c, n) for c, n in zip(with_attributes.captions, with_attributes.negatives, strict=True)
             if c not in plain.captions]  # fmt: skip
    assert bool(added) == any(len(attrs) >= 2 for attrs in dataset.labels.values())
    assert all(negatives and caption not in negatives for caption, negatives in added)


def test_dcsm_pairs_every_labelled_image_with_another_label_both_ways_in_training_forms(user_data: Path) -> None:
    """Negation both ways: row 2i shows label L under a training form's affirmative of L, row 2i+1
    shows another label under the same form's negated caption of L (each the other's hard
    negative), both composed alike (docs/negation.md: the same filler words, never a label's, an
    attribute's or a held-out form's word); held-out forms never appear."""
    from collections import Counter
    from types import SimpleNamespace

    from training.datasets.dataset import load_dataset
    from training.generate.negation_grammar import FormSplit, form_named, heldout_words
    from training.userdata.context import items_of
    from training.userdata.dcsm import negation_pairs

    dataset = load_dataset(user_data / "labelled.jsonl")
    label_of = {item.images[0]: item.record.label for item in dataset.items}  # type: ignore[union-attr]
    pairs = negation_pairs(SimpleNamespace(dataset=dataset, seed=0))  # type: ignore[arg-type]
    assert len(pairs.forms) == len(items_of(dataset, "label"))  # one item per labelled training photo
    assert len(pairs.images) == len(pairs.captions) == 2 * len(pairs.forms)
    recomposed = 0
    for i, name in enumerate(pairs.forms):
        form = form_named(name)
        assert form.split == FormSplit.TRAINING
        shown = label_of[pairs.images[2 * i]]
        composed = (pairs.captions[2 * i], pairs.captions[2 * i + 1])
        added = [Counter(c.replace(".", " ").split()) - Counter(p.replace(".", " ").split())
                 for c, p in zip(composed, form.pair(shown), strict=True)]  # fmt: skip
        assert added[0] == added[1] and shown in composed[0] and shown in composed[1]
        assert not set(added[0]) & (heldout_words() | set(dataset.labels))
        recomposed += composed != form.pair(shown)
        assert label_of[pairs.images[2 * i + 1]] != shown  # the negated caption is true of this photo
    assert len(set(pairs.forms)) > 3 and recomposed > len(pairs.forms) // 2
