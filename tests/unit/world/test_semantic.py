"""SemCLIP caption triplets: deterministic, paraphrases keep the facts, negations are false."""

from __future__ import annotations

from collections import Counter

from training.world.scene import Split
from training.world.semantic import NEGATION_KINDS, NOT_FORMS, caption_triplet, triplet_set


def test_triplets_are_deterministic_and_split_dependent() -> None:
    assert caption_triplet(Split.TRAIN, 0, 5) == caption_triplet(Split.TRAIN, 0, 5)
    assert caption_triplet(Split.TRAIN, 0, 5) != caption_triplet(Split.TEST, 0, 5)


def test_paraphrases_differ_and_keep_every_object() -> None:
    for t in triplet_set(Split.TEST, 1, 200):
        assert t.paraphrase != t.original
        for obj in t.scene.objects:
            assert obj.shape in t.paraphrase and obj.colour in t.paraphrase


def test_negations_are_false_of_the_scene() -> None:
    triplets = triplet_set(Split.TEST, 2, 400)
    kinds = Counter(t.negation_kind for t in triplets)
    assert set(kinds) == set(NEGATION_KINDS)
    for t in triplets:
        objs = t.scene.objects
        if t.negation_kind == "wrong_colour":
            assert f"{objs[0].colour} {objs[0].shape}" not in t.negation
        elif t.negation_kind in ("not", "no"):
            assert any(w in t.negation.split() for w in ("not", "no"))
        elif t.negation_kind == "absent":
            assert " and " in t.negation or " without " in t.negation
        elif t.negation_kind == "swap_colours":
            a, b = objs
            assert f"{b.colour} {a.shape}" in t.negation and f"{a.colour} {b.shape}" in t.negation
        else:  # reverse_relation
            assert t.negation != t.original and len(objs) == 2


def test_the_evaluation_prompt_is_not_a_training_form() -> None:
    assert all("this is not a photo of" not in form for form in NOT_FORMS)
