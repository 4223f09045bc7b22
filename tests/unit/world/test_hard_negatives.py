"""Hard negatives: the negative caption is false of the image and true of the negative scene.

Captions are checked by a small independent reader of the world's caption grammar.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from training.world.hard_negatives import KINDS, HardNegative, hard_negative_set, sample_hard_negative
from training.world.scene import Scene, SceneObject, Split, relation_of
from training.world.vocab import HELD_OUT_COMBOS, INVERSE_RELATION

PREFIXES = ("a photo of ", "an image of ", "an image with ", "a photo with ", "there is ")
RELATIONS = {"to the left of": "left of", "to the right of": "right of", "above": "above", "over": "above",
             "below": "below", "under": "below", "beneath": "below"}  # fmt: skip
REL_RE = "|".join(sorted(RELATIONS, key=len, reverse=True))


def matches(phrase: str, o: SceneObject) -> bool:
    words = re.sub(r"^(a|an) ", "", phrase.strip()).split()
    return all(w in (o.size, o.colour, o.shape, "shape") for w in words) and (words[-1] in (o.shape, "shape"))


def exists(phrase: str, scene: Scene) -> bool:
    return any(matches(phrase, o) for o in scene.objects)


def holds(caption: str, scene: Scene) -> bool:
    """Truth of a hard-negative caption for a scene graph."""
    text = caption.rstrip(".")
    for p in PREFIXES:
        if text.startswith(p):
            text = text[len(p) :]
            break
    if text.startswith("no "):
        return not exists(text[3:], scene)
    for sep in (" without ", " but not ", " and no "):
        if sep in text:
            x, y = text.split(sep)
            return exists(x, scene) and not exists(y, scene)
    if text.endswith(" absent"):
        x, y = text[: -len(" absent")].split(" with ")
        return exists(x, scene) and not exists(y, scene)
    m = re.fullmatch(rf"(.+) ({REL_RE}) (.+)", text)
    if m:
        a, rel, b = m.group(1), RELATIONS[m.group(2)], m.group(3)
        return any(matches(a, oa) and matches(b, ob) and relation_of(oa, ob) == rel
                   for oa in scene.objects for ob in scene.objects if oa is not ob)  # fmt: skip
    a, b = text.split(" and ")
    return any(matches(a, oa) and matches(b, ob) for oa in scene.objects for ob in scene.objects if oa is not ob)


def items(split: Split, n: int = 120) -> list[HardNegative]:
    return [sample_hard_negative(split, 4, i, kind) for kind in KINDS for i in range(n)]


@pytest.mark.parametrize("split", [Split.TRAIN, Split.TEST, Split.HELDOUT])
def test_negative_caption_is_false_for_the_image_and_true_for_the_negative_scene(split: Split) -> None:
    for it in items(split):
        assert it.positive != it.negative
        assert holds(it.positive, it.scene), it
        assert not holds(it.negative, it.scene), it
        assert holds(it.negative, it.negative_scene), it
        assert not holds(it.positive, it.negative_scene), it


def test_samples_are_a_pure_function_of_split_seed_index() -> None:
    for kind in KINDS:
        assert sample_hard_negative(Split.TRAIN, 1, 5, kind) == sample_hard_negative(Split.TRAIN, 1, 5, kind)
        assert sample_hard_negative(Split.TRAIN, 1, 5, kind) != sample_hard_negative(Split.TRAIN, 1, 6, kind)
        assert sample_hard_negative(Split.TRAIN, 1, 5, kind) != sample_hard_negative(Split.TEST, 1, 5, kind)
    assert hard_negative_set(Split.TRAIN, 0, 50) == hard_negative_set(Split.TRAIN, 0, 50)


def test_spatial_flips_swap_positions_and_are_tagged_by_axis() -> None:
    for it in items(Split.TRAIN):
        if not it.kind.startswith("spatial"):
            continue
        a, b = it.scene.objects
        na, nb = it.negative_scene.objects
        assert (na.x, na.y, nb.x, nb.y) == (b.x, b.y, a.x, a.y)
        assert (na.shape, na.colour, na.size) == (a.shape, a.colour, a.size)
        assert relation_of(a, b) == it.scene.relation == it.detail
        assert relation_of(na, nb) == it.negative_scene.relation == INVERSE_RELATION[it.detail]
        axis = ("left of", "right of") if it.kind == "spatial_lr" else ("above", "below")
        assert it.detail in axis
        for o in (*it.scene.objects, *it.negative_scene.objects):
            assert o.radius <= o.x <= 1 - o.radius and o.radius <= o.y <= 1 - o.radius


def test_binding_swaps_an_attribute_between_objects_in_place() -> None:
    seen = Counter()
    for it in items(Split.TRAIN):
        if it.kind != "binding":
            continue
        (a, b), (na, nb) = it.scene.objects, it.negative_scene.objects
        assert (na.x, na.y, nb.x, nb.y) == (a.x, a.y, b.x, b.y) and (na.shape, nb.shape) == (a.shape, b.shape)
        attr = it.detail
        assert getattr(na, attr) == getattr(b, attr) != getattr(a, attr) == getattr(nb, attr)
        seen[(attr, " and " in it.positive)] += 1
    assert set(seen) == {("colour", True), ("colour", False), ("size", True), ("size", False)}


def test_negation_shows_x_alone_and_the_negative_scene_y_alone() -> None:
    forms = Counter()
    for it in items(Split.TRAIN):
        if it.kind != "negation":
            continue
        (x,), (y,) = it.scene.objects, it.negative_scene.objects
        assert x.colour != y.colour and x.shape != y.shape
        forms[it.detail] += 1
    assert set(forms) == {"without", "but_not", "and_no", "absent", "no"}


def test_splits_keep_held_out_combinations_apart() -> None:
    for split in (Split.TRAIN, Split.TEST):
        for it in items(split):
            for o in (*it.scene.objects, *it.negative_scene.objects):
                assert o.combo not in HELD_OUT_COMBOS
    for it in items(Split.HELDOUT):
        assert all(o.combo in HELD_OUT_COMBOS for o in it.scene.objects)


def test_set_follows_the_mix_and_interleaves_kinds() -> None:
    mix = {"binding": 0.5, "spatial_lr": 0.25, "negation": 0.25}
    got = hard_negative_set(Split.TRAIN, 0, 40, mix)
    assert Counter(it.kind for it in got) == {"binding": 20, "spatial_lr": 10, "negation": 10}
    assert {it.kind for it in got[:8]} == set(mix)  # any prefix holds every kind
    with pytest.raises(ValueError):
        sample_hard_negative(Split.TRAIN, 0, 0, "colourful")


def test_world_dcsm_trains_two_sided_negation_beside_v6s_items() -> None:
    # The recipe's items per kind: v6's 18,000 in their proportions plus 4,500 two-sided negations
    # of the grammar's training forms (docs/negation.md, "The shapes world").
    from training.train_dcsm import DCSMTrainConfig

    cfg = DCSMTrainConfig()
    total = sum(cfg.mix.values())
    items = {kind: round(cfg.samples * share / total) for kind, share in cfg.mix.items()}
    assert items == {"binding": 7200, "spatial_lr": 3600, "spatial_ab": 3600, "negation": 3600, "negation_sides": 4500}
    assert set(cfg.mix) == {*KINDS, "negation_sides"}
