"""The shapes world's retrieval queries: each query's own scene satisfies it, its edited copy does not,
and every right item is one that the query's words describe."""

from __future__ import annotations

import re

import numpy as np

from training.evaluation.world.retrieval import difference_queries, text_queries
from training.world.scene import Scene

N = 6


def named(text: str) -> list[tuple[str, str]]:
    """The (colour, shape) pairs a query names, in order."""
    return re.findall(r"(\w+) (circle|square|triangle|diamond|cross)\b", text)


def combos(scene: Scene) -> set[tuple[str, str]]:
    return {o.combo for o in scene.objects}


def test_compositional_queries_are_satisfied_by_their_scene_and_not_by_its_edit() -> None:
    gallery, compositional, _ = text_queries(seed=3, n=N)
    assert len(gallery) == 4 * 2 * N and compositional.relevant.shape == (3 * N, len(gallery))
    for i, text in enumerate(compositional.texts):
        scene, edited = 2 * i, 2 * i + 1
        assert compositional.relevant[i, scene], text
        first, second = named(text)
        for g in np.flatnonzero(compositional.relevant[i]):
            assert {first, second} == combos(gallery[g]), text  # both objects, nothing else
        if i >= N:  # spatial: the edit swaps the objects' places, so the relation is false there
            assert not compositional.relevant[i, edited], text
        elif gallery[scene].objects[0].colour != gallery[edited].objects[0].colour:  # colours swapped
            assert not compositional.relevant[i, edited], text


def test_negated_queries_want_the_first_object_without_the_second() -> None:
    gallery, _, negated = text_queries(seed=3, n=N)
    assert len(negated.texts) == N
    for i, text in enumerate(negated.texts):
        scene, edited = 2 * (3 * N + i), 2 * (3 * N + i) + 1
        assert negated.relevant[i, scene] and not negated.relevant[i, edited], text
        shown, absent = named(text)[:2]
        for g in range(len(gallery)):
            assert negated.relevant[i, g] == (shown in combos(gallery[g]) and absent not in combos(gallery[g]))


def test_difference_queries_want_the_target_and_never_the_query_itself() -> None:
    gallery, queries = difference_queries(seed=3, n=N)
    assert len(gallery) == 2 * 3 * N and queries.query.tolist() == list(range(0, len(gallery), 2))
    for i, (q, text) in enumerate(zip(queries.query, queries.texts, strict=True)):
        assert queries.relevant[i, q + 1] and not queries.relevant[i, q], text
        query, target = gallery[q].objects[0], gallery[q + 1].objects[0]
        changed = [a for a in ("colour", "shape", "size") if getattr(query, a) != getattr(target, a)]
        assert len(changed) == 1 and text.startswith("The first")
