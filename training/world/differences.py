"""Pairs of scenes and texts that say how the first differs from the second (PC-CLIP data).

Every text is phrased "first ..., second ..." in many ways, including the paper's form
("The first image contains a larger shape, while the second contains a smaller shape.").
Both orders occur because pairs are sampled independently. ``EVAL_FORMS`` are the fixed
sentences the evaluation ranks with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.world.scene import Scene, SceneObject, Split, make_object, sample_scene, single_scene
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZE_RANGES, SIZES

EVAL_FORMS = {
    "size": "The first image contains a larger shape, while the second contains a smaller shape.",
    "colour": "The first shape is {c1}, while the second is {c2}.",
    "shape": "The first image contains a {s1}, while the second contains a {s2}.",
}

_SIZE = (
    "The first image contains a {big} shape, while the second contains a {small} shape.",
    "The first shape is {big}, while the second is {small}.",
    "The first image shows a {big} {s1}, while the second shows a {small} {s2}.",
    "The shape in the first image is {big} than the one in the second.",
    "The first is {big}, while the second is {small}.",
)
_COLOUR = (
    "The first shape is {c1}, while the second is {c2}.",
    "The first image contains a {c1} shape, while the second contains a {c2} shape.",
    "The first image shows a {c1} {s1}, while the second shows a {c2} {s2}.",
    "The first is {c1}, while the second is {c2}.",
)
_SHAPE = (
    "The first image contains a {s1}, while the second contains a {s2}.",
    "The first shape is a {s1}, while the second is a {s2}.",
    "The first image shows a {c1} {s1}, while the second shows a {c2} {s2}.",
    "The first is a {s1}, while the second is a {s2}.",
)
_POSITION = {
    "x": (
        "The shape in the first image is further {a}, while in the second it is further {b}.",
        "The first shape is more to the {a}, while the second is more to the {b}.",
    ),
    "y": (
        "The shape in the first image is {a}, while in the second it is {b}.",
        "The first shape sits {a}, while the second sits {b}.",
    ),
}
_COUNT = (
    "The first image contains {n1} shapes, while the second contains {n2}.",
    "The first image has {more} shapes, while the second has {fewer}.",
)
_BIGGER = ("larger", "bigger")
_SMALLER = ("smaller",)


@dataclass(frozen=True)
class DifferencePair:
    first: Scene
    second: Scene
    text: str
    attribute: str  # size | colour | shape | position | count


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[rng.integers(len(options))]


def describe_difference(
    a: Scene, b: Scene, rng: np.random.Generator, only: str | None = None
) -> tuple[str, str] | None:
    """A (text, attribute) saying how scene ``a`` differs from ``b``; None if nothing clear.

    ``only`` restricts the description to one attribute when it differs.
    """
    if len(a.objects) != len(b.objects):
        n1, n2 = len(a.objects), len(b.objects)
        words = {1: "one", 2: "two"}
        tpl = _pick(rng, _COUNT)
        more, fewer = ("more", "fewer") if n1 > n2 else ("fewer", "more")
        return tpl.format(n1=words[n1], n2=words[n2], more=more, fewer=fewer), "count"
    if len(a.objects) != 1:
        return None
    oa, ob = a.objects[0], b.objects[0]
    options: list[str] = []
    ratio = oa.radius / ob.radius
    if ratio > 1.12 or ratio < 1 / 1.12:
        options.append("size")
    if oa.colour != ob.colour:
        options.append("colour")
    if oa.shape != ob.shape:
        options.append("shape")
    if abs(oa.x - ob.x) > 0.2 or abs(oa.y - ob.y) > 0.2:
        options.append("position")
    if only is not None:
        options = [o for o in options if o == only]
    if not options:
        return None
    attribute = options[rng.integers(len(options))]
    fields = {"c1": oa.colour, "c2": ob.colour, "s1": oa.shape, "s2": ob.shape}
    if attribute == "size":
        big, small = (
            (_pick(rng, _BIGGER), _pick(rng, _SMALLER)) if ratio > 1 else (_pick(rng, _SMALLER), _pick(rng, _BIGGER))
        )
        return _pick(rng, _SIZE).format(big=big, small=small, **fields), "size"
    if attribute == "colour":
        return _pick(rng, _COLOUR).format(**fields), "colour"
    if attribute == "shape":
        return _pick(rng, _SHAPE).format(**fields), "shape"
    dx, dy = oa.x - ob.x, oa.y - ob.y
    if abs(dx) >= abs(dy):
        first, second = ("left", "right") if dx < 0 else ("right", "left")
        return _pick(rng, _POSITION["x"]).format(a=first, b=second), "position"
    first, second = ("higher", "lower") if dy < 0 else ("lower", "higher")
    return _pick(rng, _POSITION["y"]).format(a=first, b=second), "position"


def sample_difference_pair(
    split: Split, seed: int, index: int, p_count: float = 0.08, p_fine_size: float = 0.2
) -> DifferencePair:
    """Pair ``index`` of a split: mostly single objects, sometimes a count difference, and with
    ``p_fine_size`` two objects of the same size class that differ in radius (fine size)."""
    rng = np.random.default_rng([int(split), seed, index, 11])
    if rng.random() < p_fine_size:
        size = SIZES[rng.integers(len(SIZES))]
        lo, hi = SIZE_RANGES[size]
        r_small = rng.uniform(lo, hi / 1.12)
        r_big = rng.uniform(r_small * 1.12, hi)
        radii = (r_big, r_small) if rng.random() < 0.5 else (r_small, r_big)
        a, b = (single_scene(make_object(rng, split, size=size, radius=r), rng) for r in radii)
        text, _ = describe_difference(a, b, rng, only="size")  # type: ignore[misc]
        return DifferencePair(a, b, text, "size")
    k = 0
    while True:
        two = rng.random() < p_count
        a = sample_scene(split, seed, 2 * (index * 16 + k), n_objects=2 if two and rng.random() < 0.5 else 1)
        b = sample_scene(split, seed, 2 * (index * 16 + k) + 1, n_objects=2 if two and len(a.objects) == 1 else 1)
        k += 1
        described = describe_difference(a, b, rng)
        if described is not None:
            return DifferencePair(a, b, described[0], described[1])


def eval_text(attribute: str, first: SceneObject, second: SceneObject) -> str:
    """The fixed evaluation sentence for ``attribute`` with ``first`` as the first image."""
    return EVAL_FORMS[attribute].format(c1=first.colour, c2=second.colour, s1=first.shape, s2=second.shape)


def comparative_text(label_a: str, label_b: str, attribute: str) -> str:
    """A comparative in the trained phrasing: how class ``a`` differs from class ``b``."""
    if attribute == "colour":
        return EVAL_FORMS["colour"].format(c1=label_a, c2=label_b)
    if attribute == "shape":
        return EVAL_FORMS["shape"].format(s1=label_a, s2=label_b)
    if attribute == "combo":  # labels like "red circle"
        return f"The first image shows a {label_a}, while the second shows a {label_b}."
    raise ValueError(f"no comparative phrasing for {attribute!r}")


__all__ = [
    "COLOUR_NAMES",
    "SHAPES",
    "DifferencePair",
    "comparative_text",
    "describe_difference",
    "eval_text",
    "sample_difference_pair",
]
