"""Caption triplets for SemCLIP: an original caption of a scene, a paraphrase, and a negation.

* The **paraphrase** states the same facts in other words: another template, synonyms ("big",
  "little", "over", "left of"), and the relation said from the other object's side or the
  objects of an "and" caption in the other order.
* The **negation** inverts the meaning so that it is false of the scene: "not" / "no" forms of
  the original, a wrong colour, an absent object ("X and Y" when only X is there, "Y without X"),
  and for two objects the colours swapped between them or the relation reversed.

With ``grammar`` (what SemCLIP trains on, ``training.train_semclip``) a one-object caption and its
paraphrase are the negation grammar's TRAINING paraphrase forms, and the "not" / "no" negations its
TRAINING negation forms (``training.generate.negation_grammar``), so the held-out forms stay unread
by training; without it (what the evaluation's triplets keep, so their figures compare across
versions) the fixed templates below. Triplet ``index`` of a split is a pure function of
``(split, seed, index, grammar)``, like scenes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.generate.negation_grammar import FormSplit, forms, paraphrase_forms
from training.world.captions import noun_phrase, with_article
from training.world.scene import Scene, SceneObject, Split, make_object, sample_scene
from training.world.vocab import COLOUR_NAMES, INVERSE_RELATION, RELATION_PHRASES

NEGATION_KINDS: tuple[str, ...] = ("not", "no", "wrong_colour", "absent", "swap_colours", "reverse_relation")

ORIGINAL_SINGLE = ("a photo of {}.", "{}", "there is {}.", "an image of {}.")
PARAPHRASE_SINGLE = ("a picture showing {}.", "this image contains {}.", "{} is shown.", "a drawing of {}.")
ORIGINAL_PAIR = ("a photo of {a} {rel} {b}.", "{a} {rel} {b}", "there is {a} {rel} {b}.")
PARAPHRASE_PAIR = ("a picture where {a} is {rel} {b}.", "{a} is placed {rel} {b}.", "in this image, {a} is {rel} {b}.")
# The evaluation's "this is not a photo of a X." prompt is deliberately not among these.
NOT_FORMS = ("this picture is not of {}.", "not {}", "a photo that does not show {}.")
NO_FORMS = ("there is no {}.", "a photo with no {}.", "no {} here.")
# The grammar's training forms by the kind they stand for: "not" (a negated verb, copula or
# predicate) and "no" (a determiner, "without", "lacking").
GRAMMAR_KINDS = {"not": ("not", "clause", "copula", "absent"), "no": ("determiner", "without", "lacking")}

SIZE_SYNONYMS = {"large": ("big", "large"), "small": ("little", "small"), "medium": ("medium-sized", "medium")}
RELATION_SYNONYMS = {
    "left of": ("left of", "on the left of"),
    "right of": ("right of", "on the right of"),
    "above": ("over", "on top of"),
    "below": ("under", "beneath"),
}


@dataclass(frozen=True)
class CaptionTriplet:
    scene: Scene
    original: str
    paraphrase: str
    negation: str
    negation_kind: str  # one of NEGATION_KINDS


def _phrase(obj: SceneObject, with_size: bool, synonym: bool, rng: np.random.Generator) -> str:
    if not synonym or not with_size:
        return noun_phrase(obj, size=with_size)
    size = SIZE_SYNONYMS[obj.size][int(rng.integers(2))]
    return f"{size} {obj.colour} {obj.shape}"


def _other_colour(taken: set[str], rng: np.random.Generator) -> str:
    choices = [c for c in COLOUR_NAMES if c not in taken]
    return choices[int(rng.integers(len(choices)))]


def _grammar_negation(kind: str, bare: str, rng: np.random.Generator) -> str:
    options = [f for f in forms(FormSplit.TRAINING) if f.family in GRAMMAR_KINDS[kind]]
    return options[int(rng.integers(len(options)))].pair(bare)[1]


def _negation(
    scene: Scene, described: str, with_size: bool, rng: np.random.Generator, split: Split, grammar: bool = False
) -> tuple[str, str]:
    """A caption that is false of ``scene``, and its kind. ``described`` is the noun phrase (with
    article) of the scene's first object as the original names it."""
    pair = len(scene.objects) == 2
    kinds = NEGATION_KINDS if pair else NEGATION_KINDS[:4]
    kind = kinds[int(rng.integers(len(kinds)))]
    a = scene.objects[0]
    bare = described.split(" ", 1)[1]  # without the article
    if grammar and kind in GRAMMAR_KINDS:
        return _grammar_negation(kind, bare, rng), kind
    if kind == "not":
        return NOT_FORMS[int(rng.integers(len(NOT_FORMS)))].format(described), kind
    if kind == "no":
        return NO_FORMS[int(rng.integers(len(NO_FORMS)))].format(bare), kind
    if kind == "wrong_colour":
        # Not the object's colour, nor one that would make it the other object (still true then).
        taken = {a.colour} | {o.colour for o in scene.objects[1:] if o.shape == a.shape}
        wrong = replace(a, colour=_other_colour(taken, rng))
        if pair:
            b = scene.objects[1]
            rel = RELATION_PHRASES[scene.relation or "left of"]
            return (
                f"a photo of {with_article(noun_phrase(wrong, size=with_size))} {rel} "
                f"{with_article(noun_phrase(b, size=with_size))}.",
                kind,
            )
        return f"a photo of {with_article(noun_phrase(wrong, size=with_size))}.", kind
    if kind == "absent":
        present = {o.combo for o in scene.objects}
        for _ in range(100):
            other = make_object(rng, split)
            if other.combo not in present and other.shape not in {o.shape for o in scene.objects}:
                break
        missing = with_article(noun_phrase(other, size=False))
        if rng.random() < 0.5:
            return f"a photo of {described} and {missing}.", kind
        return f"a photo of {missing} without {described}.", kind
    b = scene.objects[1]
    rel = scene.relation or "left of"
    if kind == "swap_colours" and a.colour != b.colour:
        sa, sb = replace(a, colour=b.colour), replace(b, colour=a.colour)
        return (
            f"a photo of {with_article(noun_phrase(sa, size=with_size))} {RELATION_PHRASES[rel]} "
            f"{with_article(noun_phrase(sb, size=with_size))}.",
            kind,
        )
    # reverse_relation (also for a colour swap of two same-coloured objects): the relation inverted
    return (
        f"a photo of {described} {RELATION_PHRASES[INVERSE_RELATION[rel]]} "
        f"{with_article(noun_phrase(b, size=with_size))}.",
        "reverse_relation",
    )


def _grammar_single(phrase: str, synonym: str, rng: np.random.Generator) -> tuple[str, str]:
    """A one-object caption and its paraphrase in two different training paraphrase forms."""
    training = paraphrase_forms(FormSplit.TRAINING)
    first = int(rng.integers(len(training)))
    second = (first + 1 + int(rng.integers(len(training) - 1))) % len(training)
    return training[first].render(phrase), training[second].render(synonym)


def caption_triplet(split: Split, seed: int, index: int, grammar: bool = False) -> CaptionTriplet:
    """Scene ``index`` of ``split`` with an original caption, a paraphrase and a negation (with
    ``grammar``: in the negation grammar's training forms where it has them)."""
    scene = sample_scene(split, seed, index)
    rng = np.random.default_rng([int(split), int(seed), int(index), 91])
    with_size = bool(rng.random() < 0.5)
    a = scene.objects[0]
    pa = with_article(noun_phrase(a, size=with_size))
    if len(scene.objects) == 1 and grammar:
        original, paraphrase = _grammar_single(noun_phrase(a, size=with_size), _phrase(a, with_size, True, rng), rng)
    elif len(scene.objects) == 1:
        original = ORIGINAL_SINGLE[int(rng.integers(len(ORIGINAL_SINGLE)))].format(pa)
        para_phrase = with_article(_phrase(a, with_size, True, rng))
        paraphrase = PARAPHRASE_SINGLE[int(rng.integers(len(PARAPHRASE_SINGLE)))].format(para_phrase)
    else:
        b = scene.objects[1]
        rel = scene.relation or "left of"
        pb = with_article(noun_phrase(b, size=with_size))
        original = ORIGINAL_PAIR[int(rng.integers(len(ORIGINAL_PAIR)))].format(a=pa, rel=RELATION_PHRASES[rel], b=pb)
        qa, qb = _phrase(a, with_size, True, rng), _phrase(b, with_size, True, rng)
        if rng.random() < 0.5:  # said from the other object's side
            qa, qb, rel = qb, qa, INVERSE_RELATION[rel]
        words = RELATION_SYNONYMS[rel][int(rng.integers(2))]
        template = PARAPHRASE_PAIR[int(rng.integers(len(PARAPHRASE_PAIR)))]
        paraphrase = template.format(a=with_article(qa), rel=words, b=with_article(qb))
    negation, kind = _negation(scene, pa, with_size, rng, split, grammar)
    return CaptionTriplet(scene, original, paraphrase, negation, kind)


def triplet_set(split: Split, seed: int, n: int, offset: int = 0, grammar: bool = False) -> list[CaptionTriplet]:
    return [caption_triplet(split, seed, offset + i, grammar) for i in range(n)]


__all__ = ["NEGATION_KINDS", "CaptionTriplet", "caption_triplet", "triplet_set"]
