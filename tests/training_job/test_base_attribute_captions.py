"""``clip-train base --attribute-captions``: labelled images are also captioned by two of their
label's declared attributes without the label's name and without a negation ("no collar" is left
out), from the text freeze's end on, the same captions for the same seed and step; without the
flag every image keeps its one caption."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from model_store import ModelStore
from training.cli import app
from training.datasets.fashion_mnist import ATTRIBUTES
from training.generate.attribute_captions import PAIR_FRAMES, phrase
from training.userdata.base_captions import BaseCaptions
from training.userdata.demo_data import write_user_dataset

LABELS = sorted(ATTRIBUTES)


def fashion_captions(attribute_captions: bool = True, freeze: int = 10) -> BaseCaptions:
    """Ten photos of each Fashion-MNIST label and two caption records."""
    labels_of: list[str | None] = [label for label in LABELS for _ in range(10)] + [None, None]
    texts = [f"a photo of a {label}." for label in LABELS for _ in range(10)] + ["a red disc.", "two squares."]
    return BaseCaptions(texts, labels_of, ATTRIBUTES, attribute_captions, attributes_from=freeze)


def pair_captions(label: str) -> set[str]:
    """Every caption of two of ``label``'s attributes that are not negations, in the retrieval
    queries' frames."""
    attrs = {name: value for name, value in ATTRIBUTES[label].items() if not value.startswith("no")}
    return {frame.format(p=phrase(a, attrs[a]), q=phrase(b, attrs[b]))
            for frame in PAIR_FRAMES for a in attrs for b in attrs if a != b}  # fmt: skip


def test_attribute_captions_describe_the_label_without_naming_any_label() -> None:
    captions = fashion_captions()
    rows = list(range(len(captions.texts)))
    label_words = {w for label in LABELS for w in re.findall(r"[a-z]+", label)}
    described = 0
    for step in range(10, 40):
        for row, text in zip(rows, captions.at(step, rows, seed=0), strict=True):
            label = captions.labels_of[row]
            if text == captions.texts[row]:
                continue
            assert label is not None  # caption records keep theirs
            assert text in pair_captions(label)
            words = set(re.findall(r"[a-z]+", text))
            assert not label_words & words and not {"no", "not", "without"} & words, text
            described += 1
    # Dresses ("short sleeves", "no legs") and sandals ("open toes", "no shaft") keep their label's caption.
    describable = sum(len(pair_captions(label)) > 0 for label in captions.labels_of if label is not None)
    assert describable == 60
    # About half of the describable photos each step (ATTRIBUTE_SHARE), never all, never none.
    assert 0.35 * 30 * describable < described < 0.65 * 30 * describable


def test_the_same_seed_and_step_give_the_same_captions_and_another_seed_others() -> None:
    captions = fashion_captions()
    rows = list(range(0, 102, 3))
    assert captions.at(25, rows, seed=0) == fashion_captions().at(25, rows, seed=0)
    assert captions.at(25, rows, seed=0) != captions.at(25, rows, seed=1)
    assert captions.at(25, rows, seed=0) != captions.at(26, rows, seed=0)


def test_the_frozen_text_tower_and_a_run_without_the_flag_read_one_caption_per_image() -> None:
    rows = list(range(102))
    fixed = list(fashion_captions().texts)
    assert all(fashion_captions().at(step, rows, seed=0) == fixed for step in range(10))
    assert all(fashion_captions(attribute_captions=False).at(step, rows, seed=0) == fixed for step in range(40))


def test_labels_without_two_attributes_are_refused() -> None:
    with pytest.raises(ValueError, match="declares two attributes"):
        BaseCaptions(["a photo of a bag."], ["bag"], ATTRIBUTES, attribute_captions=True)
    with pytest.raises(ValueError, match="declares two attributes"):
        BaseCaptions(["a photo of a coat."], ["coat"], {"coat": {}}, attribute_captions=True)
    with pytest.raises(ValueError, match="declares two attributes"):  # "no legs" is not described
        BaseCaptions(["a photo of a dress."], ["dress"], ATTRIBUTES, attribute_captions=True)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_base_with_attribute_captions_trains_and_publishes(tmp_path: Path) -> None:
    # rich wraps what it prints at the terminal's width: each message is compared with its words rejoined
    torch.set_num_threads(1)
    data = write_user_dataset(tmp_path / "data", per_label=4, scenes=2)
    store = tmp_path / "store"
    common = ["base", "--data", str(data / "labelled.jsonl"), "--store", str(store), "--config", "shapes-smoke",
              "--steps", "4", "--batch-size", "8", "--text-freeze-steps", "2", "--name", "fruit"]  # fmt: skip
    code, out = invoke(*common, "--attribute-captions", "--out", str(tmp_path / "runs"))
    assert code == 0 and "published fruit@v1" in " ".join(out.split()), out
    assert ModelStore(store).manifest("fruit", "v1").training["attribute_captions"] is True

    # Labels that declare no attributes: a clear error, nothing trained or published.
    (data / "labels.json").write_text(json.dumps(sorted(json.loads((data / "labels.json").read_text()))))
    code, out = invoke(*common, "--attribute-captions", "--out", str(tmp_path / "runs-plain"))
    assert code == 1 and "declares two attributes" in " ".join(out.split()), out
    code, out = invoke("base", "--attribute-captions", "--steps", "1", "--out", str(tmp_path / "world"))
    assert code == 1 and "needs --data" in " ".join(out.split()), out
