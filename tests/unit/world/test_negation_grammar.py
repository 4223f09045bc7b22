"""The negation grammar: its training / held-out split is fixed by name, every family has both,
every negated caption reads back to its form and object, and the world's two-sided samples say
what their scenes show."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from clipcore.methods.dcsm import FUNCTIONAL_GROUPS
from training.generate.negation_grammar import (
    ATTRIBUTE_NEGATION_FORMS,
    NEGATION_FORMS,
    FormSplit,
    composed_pair,
    families,
    form_named,
    forms,
    heldout_words,
    paraphrase_forms,
    parse_negated,
    pick,
    tokenizer_fillers,
)
from training.world.hard_negatives import negation_sides_sample
from training.world.negation import negation_scene
from training.world.scene import Split

# The held-out forms as docs/negation.md lists them: changing this set changes what every
# held-out negation figure measures, so it is spelled out here rather than read from the module.
HELD_OUT = {"photo_of_no", "picture_with_no", "not_a_photo_of", "picture_without", "no_x_in_photo", "cannot_see",
            "is_missing", "this_isnt", "free_of"}  # fmt: skip


def test_held_out_forms_are_fixed_by_name_and_every_family_has_both_splits() -> None:
    assert {f.name for f in forms(FormSplit.HELDOUT)} == HELD_OUT
    assert len({f.name for f in NEGATION_FORMS}) == len(NEGATION_FORMS)
    for family in families():
        splits = {f.split for f in forms(family=family)}
        assert splits == {FormSplit.TRAINING, FormSplit.HELDOUT}, family
    assert {f.split for f in paraphrase_forms()} == {FormSplit.TRAINING, FormSplit.HELDOUT}


@pytest.mark.parametrize("phrase", ["shirt", "ankle boot", "red circle", "orange shape", "t-shirt"])
def test_every_negated_caption_parses_to_its_form_and_object(phrase: str) -> None:
    for form in NEGATION_FORMS:
        affirmative, negated = form.pair(phrase)
        assert phrase in affirmative and phrase in negated
        assert affirmative != negated
        assert parse_negated(negated) == (form.name, phrase), negated
        assert parse_negated(affirmative) is None, affirmative  # an affirmative negates nothing


def test_forms_render_articles_and_attribute_negations() -> None:
    assert form_named("photo_of_no").pair("apple") == ("a photo of an apple.", "a photo of no apple.")
    assert form_named("this_isnt").pair("shirt") == ("this is a shirt.", "this isn't a shirt.")
    assert form_named("is_missing").pair("red circle") == ("the red circle is shown.", "the red circle is missing.")
    by_name = {f.name: f for f in ATTRIBUTE_NEGATION_FORMS}
    assert by_name["part_without"].pair("shirt", "collar") == ("a shirt with a collar", "a shirt without a collar")
    assert by_name["part_less"].pair("shirt", "collar")[1] == "a collar-less shirt"
    with pytest.raises(KeyError, match="no negation form"):
        form_named("nope")


def test_every_negated_form_has_a_word_dcsm_reads_as_negation() -> None:
    words = set(FUNCTIONAL_GROUPS["negation"])
    for form in NEGATION_FORMS:
        negated = set(form.pair("shirt")[1].replace("'", " ").replace(".", " ").split())
        assert negated & words, form.name


def test_world_negation_samples_show_the_present_object_and_not_the_absent_one() -> None:
    for index in range(40):
        sample = negation_scene(Split.TEST, 3, index)
        assert sample == negation_scene(Split.TEST, 3, index)  # a pure function of its index
        shown = {(o.colour, o.shape) for o in sample.scene.objects}
        without = {(o.colour, o.shape) for o in sample.without.objects}
        words = lambda objects: {w for o in objects for w in (o.colour, o.shape)}  # noqa: E731
        for word in sample.present.replace(" shape", "").split():
            assert word in words(sample.scene.objects) and word not in words(sample.without.objects)
        for word in sample.absent.replace(" shape", "").split():
            assert word not in words(sample.scene.objects)
        assert len(shown) == len(without) == len(sample.scene.objects)
        item = negation_sides_sample(Split.TRAIN, 3, index)
        assert form_named(item.detail).split == FormSplit.TRAINING  # held-out forms never train
        trained = negation_scene(Split.TRAIN, 3, index)  # the scene the training item shows
        plain = form_named(item.detail).pair(trained.present)
        # The form's pair of the present object, recomposed alike on both sides: the same frame
        # words dropped, the same filler words added (none a held-out form's word or a word that
        # names something in a scene).
        added = [_added(c, p) for c, p in zip((item.positive, item.negative), plain, strict=True)]
        dropped = [_added(p, c) for c, p in zip((item.positive, item.negative), plain, strict=True)]
        assert added[0] == added[1] and dropped[0] == dropped[1]
        scene_words = words(trained.scene.objects) | words(trained.without.objects)
        assert not set(added[0]) & (heldout_words() | scene_words)


def _added(composed: str, plain: str) -> Counter[str]:
    """The words of ``composed`` that ``plain`` does not have (as many times as they are added)."""
    split = lambda caption: caption.replace("'", " '").replace(".", " ").split()  # noqa: E731
    return Counter(split(composed)) - Counter(split(plain))


def test_composed_pairs_add_the_same_fillers_to_both_captions_and_never_a_held_out_word() -> None:
    fillers = tokenizer_fillers(["shirt", "collar"])
    assert len(fillers) == 5000 and "shirt" not in fillers and "left" not in fillers
    assert not set(fillers) & heldout_words() and not set(fillers) & set(FUNCTIONAL_GROUPS["negation"])
    assert {"you", "see", "here", "can", "missing", "free"} <= heldout_words()
    rng, moved = random.Random(5), 0
    for _ in range(200):
        form = pick(forms(FormSplit.TRAINING), rng)
        plain = form.pair("shirt")
        composed = composed_pair(form, "shirt", rng, fillers)
        added = [_added(c, p) for c, p in zip(composed, plain, strict=True)]
        dropped = [_added(p, c) for c, p in zip(composed, plain, strict=True)]
        assert added[0] == added[1] and set(added[0]) <= set(fillers)
        assert dropped[0] == dropped[1] and "shirt" in composed[0] and "shirt" in composed[1]
        moved += composed != plain
    assert 100 < moved < 180  # about 70 % composed, the rest the plain pair
    again = [composed_pair(form, "shirt", random.Random(1), fillers) for _ in range(2)]
    assert again[0] == again[1]  # a pure function of the rng
