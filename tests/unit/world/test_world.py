"""The shapes world: determinism, disjoint splits, held-out combinations, captions, renderers."""

from __future__ import annotations

import numpy as np
import pytest

from training.world.captions import full_caption, random_caption
from training.world.differences import describe_difference, eval_text, sample_difference_pair
from training.world.render import draw_scene_pil, object_mask, render_batch, render_scene
from training.world.scene import Scene, SceneObject, Split, make_object, relation_of, sample_scene
from training.world.vocab import COLOURS, HELD_OUT_COMBOS, SHAPES, SIZE_RANGES


def test_scene_is_a_pure_function_of_split_seed_index() -> None:
    assert sample_scene(Split.TRAIN, 3, 17) == sample_scene(Split.TRAIN, 3, 17)
    assert sample_scene(Split.TRAIN, 3, 17) != sample_scene(Split.TRAIN, 3, 18)
    a = render_batch([sample_scene(Split.TRAIN, 3, i) for i in range(4)], seed=5)
    b = render_batch([sample_scene(Split.TRAIN, 3, i) for i in range(4)], seed=5)
    assert np.array_equal(a, b)


def test_train_and_test_streams_differ_and_held_out_combos_never_train() -> None:
    train = [sample_scene(Split.TRAIN, 0, i) for i in range(600)]
    test = [sample_scene(Split.TEST, 0, i) for i in range(600)]
    assert not set(train) & set(test)
    for scene in train + test:
        assert all(o.combo not in HELD_OUT_COMBOS for o in scene.objects)
    held = [sample_scene(Split.HELDOUT, 0, i) for i in range(200)]
    assert all(o.combo in HELD_OUT_COMBOS for s in held for o in s.objects)
    # every colour and every shape is still seen in training
    seen = {o.combo for s in train for o in s.objects}
    assert {c for c, _ in seen} == set(COLOURS) and {s for _, s in seen} == set(SHAPES)


def test_two_object_relations_hold_geometrically() -> None:
    for i in range(300):
        scene = sample_scene(Split.TRAIN, 1, i, n_objects=2)
        a, b = scene.objects
        assert scene.relation == relation_of(a, b)
        assert np.hypot(a.x - b.x, a.y - b.y) > a.radius + b.radius  # no overlap
        assert a.combo != b.combo


def test_sizes_fall_in_their_class_ranges() -> None:
    for i in range(300):
        for obj in sample_scene(Split.TRAIN, 2, i).objects:
            lo, hi = SIZE_RANGES[obj.size]
            assert lo <= obj.radius <= hi


@pytest.mark.parametrize("shape", SHAPES)
def test_renderer_draws_the_object_in_its_colour(shape: str) -> None:
    obj = SceneObject(shape, "blue", "large", 0.2, 0.5, 0.5)
    img = render_scene(Scene((obj,), None, (255, 255, 255), 0.0), 64)
    mask = object_mask(obj, 64)
    assert 0.05 < mask.mean() < 0.4
    assert np.abs(np.median(img[mask], axis=0) - COLOURS["blue"]).max() < 3  # edges are blended
    assert (img[~mask] > 150).all(axis=-1).mean() > 0.97  # background stays white


def test_the_two_renderers_agree_on_geometry() -> None:
    scene = Scene((SceneObject("triangle", "red", "large", 0.2, 0.4, 0.6),), None, (255, 255, 255))
    ours = render_scene(scene, 64)
    pil = np.asarray(draw_scene_pil(scene, 64))
    red_ours = (ours[..., 1] < 128).astype(float)
    red_pil = (pil[..., 1] < 128).astype(float)
    iou = (red_ours * red_pil).sum() / np.maximum(red_ours, red_pil).sum()
    assert iou > 0.85


def test_captions_name_what_is_there() -> None:
    rng = np.random.default_rng(0)
    for i in range(200):
        scene = sample_scene(Split.TRAIN, 0, i)
        full = full_caption(scene)
        for obj in scene.objects:
            assert obj.shape in full and obj.colour in full and obj.size in full
        cap = random_caption(scene, rng)
        assert any(o.shape in cap or o.colour in cap or o.size in cap for o in scene.objects)
    two = Scene(
        (SceneObject("circle", "red", "small", 0.1, 0.2, 0.5), SceneObject("square", "blue", "large", 0.2, 0.7, 0.5)),
        "left of",
    )
    assert full_caption(two) == "a photo of a small red circle to the left of a large blue square."


def test_difference_texts_are_true_in_order() -> None:
    rng = np.random.default_rng(0)
    big = Scene((SceneObject("circle", "red", "large", 0.22, 0.5, 0.5),))
    small = Scene((SceneObject("circle", "red", "small", 0.08, 0.5, 0.5),))
    text, attr = describe_difference(big, small, rng)  # type: ignore[misc]
    assert attr == "size" and ("larger" in text or "bigger" in text) and text.index("first") < text.index("second")
    first_word = "larger" if "larger" in text else "bigger"
    assert text.index(first_word) < text.index("second")
    for i in range(200):
        pair = sample_difference_pair(Split.TRAIN, 0, i)
        if pair.attribute == "colour":
            a, b = pair.first.objects[0].colour, pair.second.objects[0].colour
            assert pair.text.index(a) < pair.text.rindex(b)
    a, b = make_object(rng, Split.TEST, colour="red"), make_object(rng, Split.TEST, colour="blue")
    assert eval_text("colour", a, b) == "The first shape is red, while the second is blue."
