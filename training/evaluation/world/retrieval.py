"""Retrieval on the shapes world: a gallery of TEST scenes searched by compositional, negated and
difference queries (figures: ``training.evaluation.methods.retrieval``).

The text gallery holds both scenes of ``n_retrieval`` hard-negative items of each kind (the scene
and its edited copy: colours or sizes swapped, relation flipped, the other object alone), so every
query meets its hardest distractor. Queries are written from a scene's content, and a query's right
items are every gallery scene that satisfies it, checked on the objects' colours and shapes:

* compositional: "a photo of a red circle and a blue square." (both objects shown) and "a red
  circle to the left of a blue square" (the two in that relation);
* negated: "a red circle without a blue square" in the negation forms the world's DCSM trains on
  (``training.world.hard_negatives.NEGATION_FORMS``, less the bare "no Y"): X shown, Y not.

Difference queries: one-object scenes, each with a target that differs from it in one attribute
(colour, shape or size class); the text is the pair-ranking sentence true of (target, query),
e.g. "The first shape is red, while the second is blue."; the right items are the gallery scenes
showing the target's colour, shape and size class.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from training.evaluation.methods.retrieval import (
    DifferenceQueries,
    TextQueries,
    difference_retrieval,
    text_retrieval,
)
from training.evaluation.world.base import EvalBase, generator_images
from training.world.captions import noun_phrase, with_article
from training.world.differences import eval_text
from training.world.hard_negatives import NEGATION_FORMS, sample_hard_negative
from training.world.scene import Scene, SceneObject, Split, make_object, single_scene
from training.world.vocab import COLOUR_NAMES, INVERSE_RELATION, RELATION_PHRASES, SHAPES

RETRIEVAL_OFFSET = 3 * 10**6  # evaluation scenes never coincide with training ones
NEGATED_FORMS = tuple(t for form, templates in NEGATION_FORMS.items() if form != "no" for t in templates)
Combo = tuple[str, str]  # (colour, shape)
Test = Callable[[Scene], bool]  # whether a scene satisfies a query


def shows(scene: Scene, combo: Combo) -> bool:
    return any(o.combo == combo for o in scene.objects)


def shows_both(scene: Scene, a: Combo, b: Combo) -> bool:
    return len(scene.objects) == 2 and {o.combo for o in scene.objects} == {a, b}


def shows_without(scene: Scene, x: Combo, y: Combo) -> bool:
    return shows(scene, x) and not shows(scene, y)


def in_relation(scene: Scene, a: Combo, relation: str, b: Combo) -> bool:
    """Whether the scene shows ``a`` ``relation`` ``b`` (its relation is of objects[0] to objects[1])."""
    if len(scene.objects) != 2 or scene.relation is None:
        return False
    first, second = (o.combo for o in scene.objects)
    return (first, scene.relation, second) in ((a, relation, b), (b, INVERSE_RELATION[relation], a))


def _phrase(o: SceneObject) -> str:
    return with_article(noun_phrase(o, size=False))


def text_queries(seed: int, n: int) -> tuple[list[Scene], TextQueries, TextQueries]:
    """The gallery and its compositional and negated queries (``n`` items of each kind)."""
    rng = np.random.default_rng([seed, 37])
    gallery: list[Scene] = []
    compositional: list[tuple[str, Test]] = []
    negated: list[tuple[str, Test]] = []
    for kind in ("binding", "spatial_lr", "spatial_ab", "negation"):
        for i in range(n):
            item = sample_hard_negative(Split.TEST, seed, RETRIEVAL_OFFSET + i, kind)
            gallery += [item.scene, item.negative_scene]
            if kind == "negation":
                x, y = item.scene.objects[0], item.negative_scene.objects[0]
                template = NEGATED_FORMS[int(rng.integers(len(NEGATED_FORMS)))]
                text = template.format(x=_phrase(x), y=_phrase(y), yb=noun_phrase(y, size=False))
                negated.append((text, partial(shows_without, x=x.combo, y=y.combo)))
                continue
            a, b = item.scene.objects
            if kind == "binding":
                text = f"a photo of {_phrase(a)} and {_phrase(b)}."
                compositional.append((text, partial(shows_both, a=a.combo, b=b.combo)))
            else:
                relation = item.scene.relation or "left of"
                text = f"{_phrase(a)} {RELATION_PHRASES[relation]} {_phrase(b)}"
                compositional.append((text, partial(in_relation, a=a.combo, relation=relation, b=b.combo)))

    def queries(kind: str, rows: list[tuple[str, Test]]) -> TextQueries:
        relevant = np.array([[test(s) for s in gallery] for _, test in rows], dtype=bool)
        return TextQueries(kind, [t for t, _ in rows], relevant)

    return gallery, queries("compositional", compositional), queries("negated", negated)


def _changed(rng: np.random.Generator, o: SceneObject, attribute: str) -> SceneObject:
    """A TEST object like ``o`` but for ``attribute`` (a larger size class for ``size``)."""
    for _ in range(100):
        try:
            if attribute == "colour":
                colour = COLOUR_NAMES[int(rng.integers(len(COLOUR_NAMES)))]
                if colour != o.colour:
                    return make_object(rng, Split.TEST, shape=o.shape, colour=colour, size=o.size)
            elif attribute == "shape":
                shape = SHAPES[int(rng.integers(len(SHAPES)))]
                if shape != o.shape:
                    return make_object(rng, Split.TEST, shape=shape, colour=o.colour, size=o.size)
            else:
                return make_object(rng, Split.TEST, shape=o.shape, colour=o.colour, size="large")
        except ValueError:  # a held-out colour-shape combination: draw again
            continue
    raise RuntimeError(f"no TEST object differing from {o} in {attribute}")


def difference_queries(seed: int, n: int) -> tuple[list[Scene], DifferenceQueries]:
    """``n`` (query, target) pairs per attribute; the gallery holds every query and target scene."""
    rng = np.random.default_rng([seed, 39])
    gallery: list[Scene] = []
    texts: list[str] = []
    targets: list[SceneObject] = []
    for attribute in ("colour", "shape", "size"):
        for _ in range(n):
            query = make_object(rng, Split.TEST, size="small" if attribute == "size" else None)
            target = _changed(rng, query, attribute)
            gallery += [single_scene(query, rng), single_scene(target, rng)]
            texts.append(eval_text(attribute, target, query))
            targets.append(target)
    objects = [s.objects[0] for s in gallery]
    relevant = np.array([[(o.combo, o.size) == (t.combo, t.size) for o in objects] for t in targets], dtype=bool)
    query_index = np.arange(0, len(gallery), 2)
    relevant[np.arange(len(query_index)), query_index] = False  # the query is not its own answer
    return gallery, DifferenceQueries(query_index, texts, relevant)


class RetrievalEval(EvalBase):
    def retrieval(self, seed: int) -> dict[str, float]:
        """Recall@1/10 of compositional, negated and difference queries (``retrieval.*`` keys)."""
        n = self.cfg.n_retrieval
        gallery, compositional, negated = text_queries(seed, n)
        images = generator_images(gallery)
        pooled = self.images(images)
        tokens = None
        if self.bundle.dcsm is not None:
            tokens = np.concatenate(
                [self.bundle.encode_dense_images(images[i : i + 256]) for i in range(0, len(images), 256)]
            )
        out = text_retrieval(self.bundle, pooled, tokens, compositional)
        out.update(text_retrieval(self.bundle, pooled, tokens, negated))
        pairs_gallery, differences = difference_queries(seed, n)
        out.update(difference_retrieval(self.bundle, self.images(generator_images(pairs_gallery)), differences))
        return out
