"""Hard negatives for dense scoring: a scene, a true caption and a minimally different false one.

Each sample holds the image scene, its caption, a hard-negative caption that is false for the
scene, and the hard-negative scene (same layout, edited) for which that caption is true, so
training can use both images. Kinds:

* ``binding``: two objects with their colours (or size classes) swapped between them;
  captions in the relation form (from either object's side) or the "and" form (either order).
* ``spatial_lr`` / ``spatial_ab``: the relation flipped; the negative scene swaps the two
  objects' positions. Above/below captions sometimes say "over" / "under" / "beneath".
* ``negation``: "X without Y", "X but not Y", "X and no Y", "X with Y absent", "no Y" against
  the same form with X and Y swapped; the image shows X alone, the negative scene Y alone.
* ``negation_sides``: one training form of the negation grammar
  (``training.generate.negation_grammar``) on both sides: the image shows X and its caption is
  the form's affirmative ("there is a red circle."), the negative is the negated caption ("there
  is no red circle."), true of the negative scene, where Y stands in X's place
  (``training.world.negation``). Not among ``KINDS``: the evaluation asks it on every form,
  training and held out (``training.evaluation.world.negation``).

Sample ``index`` is a pure function of ``(split, seed, index)``. TRAIN and TEST scenes (both
the image and the negative scene) never contain a held-out colour-shape combination; HELDOUT
images contain only held-out combinations (their negative scenes may not).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from training.generate.negation_grammar import FormSplit, composed_pair, forms, tokenizer_fillers
from training.world.captions import CONJ_TEMPLATES, PAIR_TEMPLATES, noun_phrase, with_article
from training.world.negation import negation_scene
from training.world.scene import Scene, SceneObject, Split, make_object, place_pair, sample_background
from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, INVERSE_RELATION, RELATION_PHRASES, SHAPES, SIZES

KINDS: tuple[str, ...] = ("binding", "spatial_lr", "spatial_ab", "negation")
_KIND_IDS = {k: i for i, k in enumerate((*KINDS, "negation_sides"))}

# Spatial synonyms of the vertical relations: the scorer sees them through shared functional rows.
_SYNONYMS = {"above": ("over",), "below": ("under", "beneath")}

NEGATION_FORMS: dict[str, tuple[str, ...]] = {
    "without": ("{x} without {y}", "a photo of {x} without {y}.", "an image of {x} without {y}."),
    "but_not": ("{x} but not {y}", "a photo of {x} but not {y}.", "there is {x} but not {y}."),
    "and_no": ("{x} and no {yb}", "a photo of {x} and no {yb}.", "an image with {x} and no {yb}."),
    "absent": ("{x} with {y} absent", "a photo of {x} with {y} absent."),
    "no": ("a photo with no {yb}.", "there is no {yb}.", "an image with no {yb}.", "no {yb}"),
}


@dataclass(frozen=True)
class HardNegative:
    kind: str  # one of KINDS
    detail: str  # binding: colour | size; spatial: the true relation; negation: the form
    scene: Scene  # the image: ``positive`` is true of it, ``negative`` is not
    positive: str
    negative: str
    negative_scene: Scene  # ``negative`` is true of it, ``positive`` is not


def _rng(split: Split, seed: int, index: int, kind: str) -> np.random.Generator:
    return np.random.default_rng([int(split), int(seed), int(index), 77, _KIND_IDS[kind]])


def _allowed(objects: Sequence[SceneObject], split: Split) -> bool:
    """TRAIN/TEST scenes never show a held-out combination (that is what HELDOUT measures)."""
    return split == Split.HELDOUT or all(o.combo not in HELD_OUT_COMBOS for o in objects)


def _in_frame(o: SceneObject) -> bool:
    return all(o.radius + 0.01 <= c <= 1 - o.radius - 0.01 for c in (o.x, o.y))


def _pair(
    rng: np.random.Generator, split: Split, relation: str, ok: Callable[[SceneObject, SceneObject], bool]
) -> Scene:
    """Two split-valid objects placed so that the first is ``relation`` the second."""
    bg, noise = sample_background(rng)
    for _ in range(1000):
        a, b = make_object(rng, split), make_object(rng, split)
        if a.combo == b.combo or not ok(a, b):
            continue
        placed = place_pair(rng, a.radius, b.radius, relation)
        if placed is None:
            continue
        (ax, ay), (bx, by) = placed
        return Scene((replace(a, x=ax, y=ay), replace(b, x=bx, y=by)), relation, bg, noise)
    raise RuntimeError("could not place a pair of objects")


def _pair_caption(
    rng: np.random.Generator, relation_form: bool
) -> Callable[[Scene, Callable[[SceneObject], str]], str]:
    """A caption renderer whose random choices are fixed now, so that applying it to a scene
    and to its edited copy gives two captions that differ only in the edit."""
    from_b, tpl_rel = rng.random() < 0.5, int(rng.integers(len(PAIR_TEMPLATES)))
    tpl_conj, synonym, which = int(rng.integers(len(CONJ_TEMPLATES))), rng.random(), int(rng.integers(2))

    def render(scene: Scene, phrase: Callable[[SceneObject], str]) -> str:
        a, b = scene.objects
        pa, pb = with_article(phrase(a)), with_article(phrase(b))
        if not relation_form:
            return (
                CONJ_TEMPLATES[tpl_conj].format(a=pb, b=pa) if from_b else CONJ_TEMPLATES[tpl_conj].format(a=pa, b=pb)
            )
        rel = scene.relation or "left of"
        if from_b:
            pa, pb, rel = pb, pa, INVERSE_RELATION[rel]
        words = RELATION_PHRASES[rel]
        if rel in _SYNONYMS and synonym < 0.25:
            words = _SYNONYMS[rel][which % len(_SYNONYMS[rel])]
        return PAIR_TEMPLATES[tpl_rel].format(a=pa, rel=words, b=pb)

    return render


def binding_sample(split: Split, seed: int, index: int) -> HardNegative:
    rng = _rng(split, seed, index, "binding")
    attribute = "colour" if rng.random() < 0.65 else "size"
    relation = ("left of", "right of", "above", "below")[rng.integers(4)]
    for _ in range(1000):
        if attribute == "colour":
            scene = _pair(rng, split, relation, lambda a, b: a.colour != b.colour and a.shape != b.shape)
            a, b = scene.objects
            swapped = (replace(a, colour=b.colour), replace(b, colour=a.colour))
        else:
            scene = _pair(rng, split, relation, lambda a, b: a.size != b.size and a.shape != b.shape)
            a, b = scene.objects
            swapped = (replace(a, size=b.size, radius=b.radius), replace(b, size=a.size, radius=a.radius))
        # Swapping radii keeps the centre distance valid (same sum); only the frame can fail.
        if _allowed(swapped, split) and all(_in_frame(o) for o in swapped):
            break
    else:
        raise RuntimeError("no valid binding sample")
    negative_scene = scene.with_objects(swapped, scene.relation)
    with_size = rng.random() < 0.5
    if attribute == "colour":

        def phrase(o: SceneObject) -> str:
            return noun_phrase(o, size=with_size)
    else:

        def phrase(o: SceneObject) -> str:
            return noun_phrase(o, colour=with_size)

    render = _pair_caption(rng, relation_form=rng.random() < 0.6)
    return HardNegative(
        "binding", attribute, scene, render(scene, phrase), render(negative_scene, phrase), negative_scene
    )


def spatial_sample(split: Split, seed: int, index: int, axis: str) -> HardNegative:
    kind = "spatial_lr" if axis == "lr" else "spatial_ab"
    rng = _rng(split, seed, index, kind)
    relations = ("left of", "right of") if axis == "lr" else ("above", "below")
    relation = relations[rng.integers(2)]
    for _ in range(1000):
        scene = _pair(rng, split, relation, lambda a, b: True)
        a, b = scene.objects
        moved = (replace(a, x=b.x, y=b.y), replace(b, x=a.x, y=a.y))
        if all(_in_frame(o) for o in moved):
            break
    else:
        raise RuntimeError("no valid spatial sample")
    negative_scene = scene.with_objects(moved, INVERSE_RELATION[relation])
    with_size = rng.random() < 0.3

    def phrase(o: SceneObject) -> str:
        return noun_phrase(o, size=with_size)

    render = _pair_caption(rng, relation_form=True)
    return HardNegative(kind, relation, scene, render(scene, phrase), render(negative_scene, phrase), negative_scene)


def _negation_phrase(o: SceneObject, mode: int) -> str:
    if mode == 0:
        return noun_phrase(o, size=False)  # "red circle"
    if mode == 1:
        return o.shape  # "circle"
    return noun_phrase(o, size=False, shape=False)  # "red shape"


def negation_sample(split: Split, seed: int, index: int) -> HardNegative:
    rng = _rng(split, seed, index, "negation")
    form = tuple(NEGATION_FORMS)[rng.integers(len(NEGATION_FORMS))]
    template = NEGATION_FORMS[form][rng.integers(len(NEGATION_FORMS[form]))]
    for _ in range(1000):
        x, y = make_object(rng, split), make_object(rng, split)
        # Different in both colour and shape, so any description of Y is false of X.
        if x.colour != y.colour and x.shape != y.shape:
            break
    else:
        raise RuntimeError("no valid negation sample")
    modes = rng.choice(3, size=2, p=[0.6, 0.25, 0.15])
    px, py = _negation_phrase(x, int(modes[0])), _negation_phrase(y, int(modes[1]))

    def caption(present: str, absent: str) -> str:
        return template.format(x=with_article(present), y=with_article(absent), yb=absent)

    bg, noise = sample_background(rng)
    scene, negative_scene = Scene((x,), None, bg, noise), Scene((y,), None, bg, noise)
    return HardNegative("negation", form, scene, caption(px, py), caption(py, px), negative_scene)


def negation_sides_sample(split: Split, seed: int, index: int) -> HardNegative:
    """A training form of the negation grammar on both sides: each anchor's caption is the other's
    hard negative (the in-batch pair loss), so the scorer learns the negated caption must win
    where the object is absent, not only lose where it is present."""
    rng = _rng(split, seed, index, "negation_sides")
    training_forms = forms(FormSplit.TRAINING)
    form = training_forms[int(rng.integers(len(training_forms)))]
    sample = negation_scene(split, seed, index)
    affirmative, negated = composed_pair(form, sample.present, random.Random(int(rng.integers(2**31))),
                                         _fillers())  # fmt: skip
    return HardNegative("negation_sides", form.name, sample.scene, affirmative, negated, sample.without)


@functools.cache
def _fillers() -> tuple[str, ...]:
    """Filler words for composed negations: never a word that names something in a scene."""
    return tokenizer_fillers((*SHAPES, *COLOUR_NAMES, *SIZES, "shape", "shapes", "object", "objects"))


def sample_hard_negative(split: Split, seed: int, index: int, kind: str) -> HardNegative:
    if kind == "binding":
        return binding_sample(split, seed, index)
    if kind in ("spatial_lr", "spatial_ab"):
        return spatial_sample(split, seed, index, kind.split("_")[1])
    if kind == "negation":
        return negation_sample(split, seed, index)
    if kind == "negation_sides":
        return negation_sides_sample(split, seed, index)
    raise ValueError(f"unknown hard-negative kind {kind!r}; known: {KINDS}")


DEFAULT_MIX: dict[str, float] = {"binding": 0.4, "spatial_lr": 0.2, "spatial_ab": 0.2, "negation": 0.2}


def hard_negative_set(
    split: Split, seed: int, n: int, mix: dict[str, float] | None = None, offset: int = 0
) -> list[HardNegative]:
    """``n`` samples whose kinds follow ``mix`` exactly (largest remainders), interleaved."""
    mix = mix or DEFAULT_MIX
    total = sum(mix.values())
    counts = {k: int(n * w / total) for k, w in mix.items()}
    for k in sorted(mix, key=lambda k: -(n * mix[k] / total - counts[k]))[: n - sum(counts.values())]:
        counts[k] += 1
    # Interleave by fractional position so any prefix of the list has about the same mix.
    keyed = [((j + 0.5) / c, k, offset + j) for k, c in counts.items() for j in range(c)]
    return [sample_hard_negative(split, seed, idx, k) for _, k, idx in sorted(keyed)]
