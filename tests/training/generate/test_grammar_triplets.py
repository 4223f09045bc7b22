"""SemCLIP's triplets are written by the negation grammar's training forms only: the original and
the negation differ only in the negation, the paraphrase is a training paraphrase form and never
the original's text, a caption naming a part gets an attribute negation, and held-out forms never
appear (on users' captions and in the shapes world's training triplets)."""

from __future__ import annotations

import random

import pytest

from training.generate.grammar_triplets import caption_phrase, caption_triplet
from training.generate.negation_grammar import (
    FormSplit,
    attribute_forms,
    form_named,
    forms,
    paraphrase_forms,
    parse_negated,
)
from training.world.captions import noun_phrase
from training.world.scene import Split
from training.world.semantic import GRAMMAR_KINDS, triplet_set

TRAINING_PARAPHRASES = {f.name: f for f in paraphrase_forms(FormSplit.TRAINING)}
HELD_OUT_NEGATED = {f.name for f in forms(FormSplit.HELDOUT)}


@pytest.mark.parametrize(
    ("caption", "phrase"),
    [("a photo of a shirt.", "shirt"), ("a photo of an ankle boot.", "ankle boot"), ("an image showing a red coat",
     "red coat"), ("The dog", "dog"), ("a coat with a hood", "coat with a hood"), ("two cats", "two cats")],
)  # fmt: skip
def test_a_caption_reduces_to_the_phrase_it_names(caption: str, phrase: str) -> None:
    assert caption_phrase(caption) == phrase


@pytest.mark.parametrize("label", ["shirt", "ankle boot", "t-shirt", "red circle"])
def test_a_label_caption_is_negated_and_paraphrased_in_training_forms_only(label: str) -> None:
    rng = random.Random(3)
    written = [caption_triplet(f"a photo of a {label}.", rng) for _ in range(200)]
    for t in written:
        form = form_named(t.form)
        assert form.split == FormSplit.TRAINING
        assert (t.original, t.negation) == form.pair(label)  # they differ only in the negation
        assert parse_negated(t.negation) == (t.form, label)
        assert t.paraphrase != t.original
        assert t.paraphrase in {f.render(label) for f in TRAINING_PARAPHRASES.values()}
    assert len({t.form for t in written}) == len(forms(FormSplit.TRAINING))  # every training form is drawn


def test_a_caption_that_names_a_part_gets_an_attribute_negation_with_the_true_side_first() -> None:
    rng = random.Random(0)
    training = {f.name: f for f in attribute_forms(FormSplit.TRAINING)}
    for _ in range(50):
        kept = caption_triplet("a coat with a hood", rng)
        assert kept.form in training and (kept.original, kept.negation) == training[kept.form].pair("coat", "hood")
        dropped = caption_triplet("a coat without a hood.", rng)
        assert (dropped.negation, dropped.original) == training[dropped.form].pair("coat", "hood")
        assert "hood" in kept.paraphrase and "hood" in dropped.paraphrase


def test_the_same_seed_writes_the_same_triplets() -> None:
    captions = ["a photo of a shirt.", "a coat with a hood", "a red coat and a blue hat"]
    first = [caption_triplet(c, random.Random(7)) for c in captions]
    assert first == [caption_triplet(c, random.Random(7)) for c in captions]


def test_the_worlds_training_triplets_use_training_forms_and_the_evaluations_keep_the_templates() -> None:
    training = triplet_set(Split.TRAIN, 300, 300, grammar=True)
    evaluation = triplet_set(Split.TRAIN, 300, 300)
    assert [t.scene for t in training] == [t.scene for t in evaluation]  # the same scenes, other words
    grammar_negations = 0
    for t in training:
        parsed = parse_negated(t.negation)
        if t.negation_kind in GRAMMAR_KINDS:
            assert parsed is not None and parsed[0] not in HELD_OUT_NEGATED, t.negation
            assert form_named(parsed[0]).family in GRAMMAR_KINDS[t.negation_kind]
            grammar_negations += 1
        if len(t.scene.objects) == 1:
            phrases = {noun_phrase(t.scene.objects[0], size=size) for size in (False, True)}
            assert t.original in {f.render(p) for f in TRAINING_PARAPHRASES.values() for p in phrases}, t.original
            assert t.paraphrase != t.original
    assert grammar_negations > 50
    assert {t.negation for t in evaluation} != {t.negation for t in training}
