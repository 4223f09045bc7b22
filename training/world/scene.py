"""Scene graphs of the shapes world and their deterministic sampler.

A scene is 1-2 objects with shape, colour, size class, exact radius and centre (in [0, 1]
image coordinates, y down), plus the spatial relation of the first object to the second.
Scene ``i`` of a split is a pure function of ``(split, seed, i)``, so train and test sets
are reproducible and disjoint by construction (different split ids seed different streams).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

import numpy as np

from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, SHAPES, SIZE_RANGES, SIZES


class Split(enum.IntEnum):
    """Disjoint random streams. HELDOUT scenes contain only held-out colour-shape combos."""

    TRAIN = 1
    TEST = 2
    HELDOUT = 3


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    radius: float  # fraction of the image side
    x: float  # centre, fraction of the image width
    y: float  # centre, fraction of the image height (0 = top)

    @property
    def combo(self) -> tuple[str, str]:
        return (self.colour, self.shape)


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    # Relation of objects[0] to objects[1] ("left of", ...); None for one object.
    relation: str | None = None
    background: tuple[int, int, int] = (255, 255, 255)
    noise: float = 0.0
    meta: dict = field(default_factory=dict, compare=False)

    def with_objects(self, objects: tuple[SceneObject, ...], relation: str | None) -> Scene:
        return replace(self, objects=objects, relation=relation)


def _rng(split: Split, seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([int(split), int(seed), int(index)])


def sample_attributes(rng: np.random.Generator, split: Split) -> tuple[str, str, str]:
    """(shape, colour, size) allowed in the split."""
    while True:
        shape = SHAPES[rng.integers(len(SHAPES))]
        colour = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
        held = (colour, shape) in HELD_OUT_COMBOS
        if held == (split == Split.HELDOUT):
            break
    size = SIZES[rng.integers(len(SIZES))]
    return shape, colour, size


def sample_radius(rng: np.random.Generator, size: str) -> float:
    lo, hi = SIZE_RANGES[size]
    return float(rng.uniform(lo, hi))


def sample_background(rng: np.random.Generator) -> tuple[tuple[int, int, int], float]:
    """A flat, mostly achromatic background (dark or light) and a mild pixel-noise level."""
    level = rng.uniform(0, 45) if rng.random() < 0.3 else rng.uniform(200, 255)
    tint = rng.uniform(-8, 8, size=3)
    bg = tuple(int(np.clip(level + t, 0, 255)) for t in tint)
    noise = float(rng.uniform(0.0, 6.0)) if rng.random() < 0.7 else 0.0
    return bg, noise  # type: ignore[return-value]


def place_single(rng: np.random.Generator, radius: float) -> tuple[float, float]:
    margin = radius + 0.03
    return float(rng.uniform(margin, 1 - margin)), float(rng.uniform(margin, 1 - margin))


def place_pair(
    rng: np.random.Generator, r1: float, r2: float, relation: str
) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Centres for two objects such that obj1 is unambiguously ``relation`` obj2.

    Separation along the relation's axis exceeds the sum of radii plus a gap, and the
    offset along the other axis is at most a third of that separation.
    """
    for _ in range(50):
        gap = rng.uniform(0.04, 0.2)
        sep = r1 + r2 + gap
        off = rng.uniform(-sep / 3, sep / 3)
        # Coordinates of obj1 - obj2 along (axis, other).
        lo_a = max(r1, r2) + 0.02
        axis_c = rng.uniform(lo_a, 1 - lo_a)
        other_c = rng.uniform(lo_a, 1 - lo_a)
        a1, a2 = axis_c - sep / 2, axis_c + sep / 2  # obj1 before obj2 on the axis
        o1, o2 = other_c - off / 2, other_c + off / 2
        if relation in ("right of", "below"):
            a1, a2 = a2, a1
        ok = all(r + 0.02 <= c <= 1 - r - 0.02 for c, r in ((a1, r1), (a2, r2), (o1, r1), (o2, r2)))
        if not ok:
            continue
        if relation in ("left of", "right of"):
            return (a1, o1), (a2, o2)
        return (o1, a1), (o2, a2)
    return None


def sample_scene(split: Split, seed: int, index: int, n_objects: int | None = None, p_two: float = 0.5) -> Scene:
    """Scene ``index`` of ``split``; ``n_objects`` forces 1 or 2 objects."""
    rng = _rng(split, seed, index)
    n = n_objects or (2 if rng.random() < p_two else 1)
    bg, noise = sample_background(rng)
    while True:
        attrs = [sample_attributes(rng, split) for _ in range(n)]
        radii = [sample_radius(rng, a[2]) for a in attrs]
        if n == 1:
            x, y = place_single(rng, radii[0])
            obj = SceneObject(attrs[0][0], attrs[0][1], attrs[0][2], radii[0], x, y)
            return Scene((obj,), None, bg, noise)
        if attrs[0][:2] == attrs[1][:2]:
            continue  # two objects of the same colour and shape make relations ambiguous
        relation = ("left of", "right of", "above", "below")[rng.integers(4)]
        placed = place_pair(rng, radii[0], radii[1], relation)
        if placed is None:
            continue
        objs = tuple(SceneObject(a[0], a[1], a[2], r, c[0], c[1]) for a, r, c in zip(attrs, radii, placed))
        return Scene(objs, relation, bg, noise)


def relation_of(a: SceneObject, b: SceneObject) -> str:
    """Dominant-axis relation of ``a`` to ``b`` (used after edits that move objects)."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


def make_object(
    rng: np.random.Generator,
    split: Split,
    shape: str | None = None,
    colour: str | None = None,
    size: str | None = None,
    radius: float | None = None,
) -> SceneObject:
    """A single object with the given attributes and the rest sampled (split-valid combos)."""
    for _ in range(1000):
        s, c, z = sample_attributes(rng, split)
        s, c, z = shape or s, colour or c, size or z
        if ((c, s) in HELD_OUT_COMBOS) == (split == Split.HELDOUT):
            break
    else:
        raise ValueError(f"no {split.name} object with shape={shape} colour={colour}")
    r = radius if radius is not None else sample_radius(rng, z)
    x, y = place_single(rng, r)
    return SceneObject(s, c, z, r, x, y)


def single_scene(obj: SceneObject, rng: np.random.Generator) -> Scene:
    bg, noise = sample_background(rng)
    return Scene((obj,), None, bg, noise)
