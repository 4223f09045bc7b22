"""Shapes-world scenes for two-sided negation: an object that is in the image and one that is not.

Sample ``index`` is a scene that shows object X (sometimes beside a distractor Z), the same scene
with X replaced by an object Y at X's place and size (so X is absent there), and one phrase
style for both ("red circle", "circle" or "red shape"). X, Y and Z differ in colour and in
shape, so whatever the phrase style, a phrase of X is false of the scene with Y and a phrase of Y
false of the scene with X. Training pairs (scene with X, "a photo of a red circle.") with (scene
with Y, "a photo of no red circle."); the evaluation asks both sides of every form on the
scene with X: X present, Y absent. A pure function of ``(split, seed, index)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.world.captions import noun_phrase
from training.world.scene import Scene, SceneObject, Split, make_object, place_pair, place_single, sample_background

PHRASE_STYLES = ("full", "shape", "colour")
_STYLE_P = (0.6, 0.25, 0.15)


@dataclass(frozen=True)
class NegationScene:
    scene: Scene  # shows ``present``
    without: Scene  # the same scene with ``present`` replaced by ``absent``
    present: str  # phrase of the object shown
    absent: str  # phrase of an object not shown


def phrase(obj: SceneObject, style: str) -> str:
    if style == "shape":
        return obj.shape
    if style == "colour":
        return f"{obj.colour} shape"
    return noun_phrase(obj, size=False)


def _differs(a: SceneObject, others: list[SceneObject]) -> bool:
    return all(a.colour != o.colour and a.shape != o.shape for o in others)


def negation_scene(split: Split, seed: int, index: int) -> NegationScene:
    rng = np.random.default_rng([int(split), int(seed), int(index), 83])
    style = PHRASE_STYLES[int(rng.choice(len(PHRASE_STYLES), p=_STYLE_P))]
    bg, noise = sample_background(rng)
    for _ in range(1000):
        x, y = make_object(rng, split), make_object(rng, split)
        z = make_object(rng, split) if rng.random() < 0.5 else None
        if not _differs(y, [x] + ([z] if z else [])) or (z is not None and not _differs(z, [x])):
            continue
        y = replace(y, size=x.size, radius=x.radius)
        rest: tuple[SceneObject, ...] = ()
        if z is None:
            cx, cy = place_single(rng, x.radius)
            shown, relation = replace(x, x=cx, y=cy), None
        else:
            relation = ("left of", "right of", "above", "below")[int(rng.integers(4))]
            placed = place_pair(rng, x.radius, z.radius, relation)
            if placed is None:
                continue
            (ax, ay), (bx, by) = placed
            shown, rest = replace(x, x=ax, y=ay), (replace(z, x=bx, y=by),)
        scene = Scene((shown, *rest), relation, bg, noise)
        without = scene.with_objects((replace(y, x=shown.x, y=shown.y), *rest), relation)
        return NegationScene(scene, without, phrase(x, style), phrase(y, style))
    raise RuntimeError("no valid negation scene")
