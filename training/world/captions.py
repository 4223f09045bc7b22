"""Captions of scene graphs from varied templates.

Training captions sometimes leave out the size or the colour, and sometimes say "shape"
instead of the shape's name, so that each word has to carry its own meaning (the zero-shot
prompts "a photo of a red shape." / "a photo of a circle." rely on it).
"""

from __future__ import annotations

import numpy as np

from training.world.scene import Scene, SceneObject
from training.world.vocab import INVERSE_RELATION, RELATION_PHRASES

SINGLE_TEMPLATES = (
    "{}",
    "a photo of {}.",
    "an image of {}.",
    "there is {}.",
    "a picture of {}.",
    "a drawing of {}.",
    "{} on a plain background.",
)
PAIR_TEMPLATES = (
    "{a} {rel} {b}",
    "a photo of {a} {rel} {b}.",
    "there is {a} {rel} {b}.",
    "an image of {a} {rel} {b}.",
)
CONJ_TEMPLATES = ("{a} and {b}", "a photo of {a} and {b}.", "an image with {a} and {b}.")


def with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def noun_phrase(obj: SceneObject, size: bool = True, colour: bool = True, shape: bool = True) -> str:
    words = [obj.size] if size else []
    if colour:
        words.append(obj.colour)
    words.append(obj.shape if shape else "shape")
    return " ".join(words)


def random_noun_phrase(obj: SceneObject, rng: np.random.Generator) -> str:
    """A noun phrase with attributes dropped at random (never all of them)."""
    u = rng.random()
    if u < 0.08:
        return noun_phrase(obj, size=False, colour=True, shape=False)  # "red shape"
    if u < 0.14:
        return noun_phrase(obj, size=True, colour=False, shape=False)  # "large shape"
    return noun_phrase(obj, size=rng.random() < 0.6, colour=rng.random() < 0.85, shape=True)


def full_caption(scene: Scene) -> str:
    """The canonical caption: every attribute of every object and the relation."""
    if len(scene.objects) == 1:
        return "a photo of " + with_article(noun_phrase(scene.objects[0])) + "."
    a, b = scene.objects
    assert scene.relation is not None  # two objects always have one
    return (
        f"a photo of {with_article(noun_phrase(a))} {RELATION_PHRASES[scene.relation]} {with_article(noun_phrase(b))}."
    )


def random_caption(scene: Scene, rng: np.random.Generator) -> str:
    """One training caption of the scene from a random template and phrasing."""
    if len(scene.objects) == 1:
        tpl = SINGLE_TEMPLATES[rng.integers(len(SINGLE_TEMPLATES))]
        return tpl.format(with_article(random_noun_phrase(scene.objects[0], rng)))
    a, b = scene.objects
    pa, pb = with_article(random_noun_phrase(a, rng)), with_article(random_noun_phrase(b, rng))
    u = rng.random()
    if u < 0.15:
        if rng.random() < 0.5:
            pa, pb = pb, pa
        return CONJ_TEMPLATES[rng.integers(len(CONJ_TEMPLATES))].format(a=pa, b=pb)
    rel = scene.relation
    assert rel is not None
    if u < 0.575:  # the same fact said from the other object's side
        pa, pb, rel = pb, pa, INVERSE_RELATION[rel]
    return PAIR_TEMPLATES[rng.integers(len(PAIR_TEMPLATES))].format(a=pa, rel=RELATION_PHRASES[rel], b=pb)
