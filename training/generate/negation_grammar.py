"""Negation and paraphrase as a small grammar: named forms in families, split into training and
held-out forms (docs/negation.md lists them).

A **negation form** turns an object phrase ("red circle", "shirt") into a matched pair of captions
that differ only in the negation: the affirmative ("there is a shirt in this photo.") and the
negated ("there is no shirt in this photo."). Both sides of a negation figure come from one form:
on an image that shows the object the affirmative must win, on an image that does not show it the
negated caption must win, so a scorer that merely lowers any caption with a negation word scores
0.5 (``two_sided``).

An **attribute negation form** does the same for a part of an object ("a shirt with a collar" /
"a shirt without a collar" / "a collarless shirt"): the object is in the image either way.

A **paraphrase form** says "there is X" in other words ("a picture of X", "X, photographed").

Which forms train and which are held out is fixed here by name (never drawn), so every run and
every evaluation agrees on it; the held-out forms are what the negation figures are judged on.
Pure: strings in, strings out.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from clipcore.methods.dcsm import FUNCTIONAL_GROUPS, NEGATION_WORDS


class FormSplit(StrEnum):
    TRAINING = "training"
    HELDOUT = "heldout"


@dataclass(frozen=True)
class NegationForm:
    """``affirmative`` / ``negated`` templates over ``{a}`` (the phrase with its indefinite article),
    ``{x}`` (the bare phrase) and ``{the}`` (with "the")."""

    name: str
    family: str
    affirmative: str
    negated: str
    split: FormSplit

    def pair(self, phrase: str) -> tuple[str, str]:
        """(affirmative, negated) caption of ``phrase``."""
        slots = _slots(phrase)
        return _sentence(self.affirmative.format(**slots)), _sentence(self.negated.format(**slots))


@dataclass(frozen=True)
class AttributeNegationForm:
    """``{a}`` / ``{x}``: the object phrase as above; ``{part}``: the part ("collar")."""

    name: str
    family: str
    affirmative: str
    negated: str
    split: FormSplit

    def pair(self, noun: str, part: str) -> tuple[str, str]:
        slots = {**_slots(noun), "part": part, "a_part": f"{indefinite(part)} {part}"}
        return _sentence(self.affirmative.format(**slots)), _sentence(self.negated.format(**slots))


@dataclass(frozen=True)
class ParaphraseForm:
    name: str
    family: str
    template: str  # over {a} / {x} / {the}
    split: FormSplit

    def render(self, phrase: str) -> str:
        return _sentence(self.template.format(**_slots(phrase)))


T, H = FormSplit.TRAINING, FormSplit.HELDOUT

# Every family has training and held-out forms, so a held-out figure tests a new phrasing of a
# construction the scorer has seen, not a construction it never met.
NEGATION_FORMS: tuple[NegationForm, ...] = (
    # determiner: "no X"
    NegationForm("no_bare", "determiner", "{a}", "no {x}", T),
    NegationForm("there_is_no", "determiner", "there is {a}.", "there is no {x}.", T),
    NegationForm("image_with_no", "determiner", "an image with {a}.", "an image with no {x}.", T),
    NegationForm("photo_of_no", "determiner", "a photo of {a}.", "a photo of no {x}.", H),
    NegationForm("picture_with_no", "determiner", "a picture with {a}.", "a picture with no {x}.", H),
    # "not a X"
    NegationForm("not_bare", "not", "{a}", "not {a}", T),
    NegationForm("photo_of_not", "not", "a photo of {a}.", "a photo of not {a}.", T),
    NegationForm("not_a_photo_of", "not", "a photo of {a}.", "not a photo of {a}.", H),
    # preposition: "without X"
    NegationForm("photo_without", "without", "a photo with {a}.", "a photo without {a}.", T),
    NegationForm("scene_without", "without", "a scene with {a} in it.", "a scene without {a} in it.", T),
    NegationForm("picture_without", "without", "a picture with {a} in it.", "a picture without {a} in it.", H),
    # clause: "there is no X in ...", "... does not show X"
    NegationForm("no_x_in_photo", "clause", "there is {a} in this photo.", "there is no {x} in this photo.", H),
    NegationForm("does_not_show", "clause", "this photo shows {a}.", "this photo does not show {a}.", T),
    NegationForm("contains_no", "clause", "the image contains {a}.", "the image contains no {x}.", T),
    # a contraction in training ("doesn" + "'t"), so "isn't" is not the first "'t" the scorer meets
    NegationForm("doesnt_show", "clause", "this picture shows {a}.", "this picture doesn't show {a}.", T),
    NegationForm("cannot_see", "clause", "you can see {a} here.", "you cannot see {a} here.", H),
    # predicate: "X is absent / missing"
    NegationForm("is_absent", "absent", "{the} is present.", "{the} is absent.", T),
    NegationForm("is_not_here", "absent", "{the} is here.", "{the} is not here.", T),
    NegationForm("is_missing", "absent", "{the} is shown.", "{the} is missing.", H),
    # copula: "this is not / isn't X"
    NegationForm("this_is_not", "copula", "this is {a}.", "this is not {a}.", T),
    NegationForm("it_is_not", "copula", "it is {a}.", "it is not {a}.", T),
    NegationForm("this_isnt", "copula", "this is {a}.", "this isn't {a}.", H),
    # "lacking X", "free of X"
    NegationForm("lacking", "lacking", "a photo containing {a}.", "a photo lacking {a}.", T),
    NegationForm("devoid_of", "lacking", "an image with {a}.", "an image devoid of any {x}.", T),
    NegationForm("free_of", "lacking", "a picture with {a}.", "a picture free of any {x}.", H),
)

ATTRIBUTE_NEGATION_FORMS: tuple[AttributeNegationForm, ...] = (
    AttributeNegationForm("part_without", "attribute", "{a} with {a_part}", "{a} without {a_part}", T),
    AttributeNegationForm("part_no", "attribute", "{a} with {a_part}", "{a} with no {part}", T),
    AttributeNegationForm("part_less", "attribute", "{a} with {a_part}", "a {part}-less {x}", H),
    AttributeNegationForm("part_lacking", "attribute", "{a} that has {a_part}", "{a} that lacks {a_part}", H),
)

PARAPHRASE_FORMS: tuple[ParaphraseForm, ...] = (
    ParaphraseForm("photo_of", "noun", "a photo of {a}.", T),
    ParaphraseForm("picture_of", "noun", "a picture of {a}.", T),
    ParaphraseForm("snapshot_of", "noun", "a snapshot of {a}.", H),
    ParaphraseForm("image_showing", "verb", "an image showing {a}.", T),
    ParaphraseForm("photo_depicts", "verb", "this photo depicts {a}.", H),
    ParaphraseForm("in_a_photo", "postposed", "{a} in a photo.", T),
    ParaphraseForm("photographed", "postposed", "{a}, photographed.", H),
    ParaphraseForm("there_is", "existential", "there is {a}.", T),
    ParaphraseForm("we_see", "existential", "here we see {a}.", H),
)


def _slots(phrase: str) -> dict[str, str]:
    phrase = phrase.strip()
    return {"a": f"{indefinite(phrase)} {phrase}", "x": phrase, "the": f"the {phrase}"}


def indefinite(phrase: str) -> str:
    return "an" if phrase[:1].lower() in "aeiou" else "a"


def _sentence(text: str) -> str:
    # "the shirt is present." -> "The shirt ..." is not done: the text towers are trained on lower case.
    return re.sub(r"\s+", " ", text).strip()


def forms(split: FormSplit | None = None, family: str | None = None) -> tuple[NegationForm, ...]:
    """The negation forms of ``split`` and ``family`` (all when None), in their fixed order."""
    return tuple(
        f for f in NEGATION_FORMS if (split is None or f.split == split) and (family is None or f.family == family)
    )


def families() -> tuple[str, ...]:
    return tuple(dict.fromkeys(f.family for f in NEGATION_FORMS))


def form_named(name: str) -> NegationForm:
    for form in NEGATION_FORMS:
        if form.name == name:
            return form
    raise KeyError(f"no negation form {name!r}; known: {', '.join(f.name for f in NEGATION_FORMS)}")


def paraphrase_forms(split: FormSplit | None = None) -> tuple[ParaphraseForm, ...]:
    return tuple(f for f in PARAPHRASE_FORMS if split is None or f.split == split)


def attribute_forms(split: FormSplit | None = None) -> tuple[AttributeNegationForm, ...]:
    return tuple(f for f in ATTRIBUTE_NEGATION_FORMS if split is None or f.split == split)


def negation_words() -> tuple[str, ...]:
    """The words DCSM reads as one negation row (``clipcore.methods.dcsm.NEGATION_WORDS``)."""
    return NEGATION_WORDS


def pick(options: Sequence[NegationForm], rng: random.Random) -> NegationForm:
    return options[rng.randrange(len(options))]


def heldout_words() -> frozenset[str]:
    """Every word of a held-out form's templates (negation, attribute and paraphrase forms): what a
    composed training caption must never contain, so held-out phrasings stay unseen in training."""
    templates = [t for f in forms(FormSplit.HELDOUT) for t in (f.affirmative, f.negated)]
    templates += [t for f in attribute_forms(FormSplit.HELDOUT) for t in (f.affirmative, f.negated)]
    templates += [f.template for f in paraphrase_forms(FormSplit.HELDOUT)]
    words = {w for t in templates for w in re.findall(r"[a-z]+", re.sub(r"\{[a-z_]+\}", " ", t.lower()))}
    return frozenset(words)


def filler_words(vocabulary: Iterable[str], exclude: Iterable[str] = (), limit: int = 5000) -> tuple[str, ...]:
    """Up to ``limit`` alphabetic words of ``vocabulary`` (in its order: a BPE vocabulary lists
    frequent words first), none of them a held-out form's word, a functional word (a negation cue,
    "left", "small", ...) or one of ``exclude`` (the data's own content words: a filler must not
    name something that may be in the image)."""
    banned = heldout_words() | {w for ws in FUNCTIONAL_GROUPS.values() for w in ws} | {w.lower() for w in exclude}
    out: list[str] = []
    for word in vocabulary:
        if len(word) >= 2 and word.isascii() and word.isalpha() and word.islower() and word not in banned:
            out.append(word)
            if len(out) == limit:
                break
    return tuple(dict.fromkeys(out))


def tokenizer_fillers(exclude: Iterable[str] = ()) -> tuple[str, ...]:
    """``filler_words`` of the CLIP tokenizer's vocabulary (its whole words, most frequent first)."""
    return filler_words(_tokenizer_words(), exclude)


@functools.cache
def _tokenizer_words() -> tuple[str, ...]:
    from clipcore.models.clip_model import tokenizer_for

    return tuple(token[:-4] for token in tokenizer_for(77).encoder if token.endswith("</w>"))


# Where a composed caption gets filler words, and how many (drawn with equal chance from the
# tuple): before the sentence (up to 3, so a cue stands at every position from the first to the
# fourth word, where "you cannot see X" and "this isn't X" put theirs), right before the object
# phrase (between a cue and what it negates, as "see" in "you cannot see X") and after it.
_FILL_COUNTS = {"start": (0, 1, 1, 2, 3), "object": (0, 0, 1, 1, 2), "end": (0, 0, 1, 1, 2)}


def composed_pair(
    form: NegationForm,
    phrase: str,
    rng: random.Random,
    fillers: Sequence[str],
    p_plain: float = 0.3,
    p_drop_frame: float = 0.5,
) -> tuple[str, str]:
    """``form``'s (affirmative, negated) pair of ``phrase`` recomposed: with probability
    ``p_drop_frame`` without the frame words both captions open with ("this is not X." -> "not
    X."), and with the same random filler words put in both captions (``_FILL_COUNTS``); the plain
    pair with probability ``p_plain``. The cue and the object thereby stand at other positions,
    among words a scorer never met, so it learns to read them wherever they stand and whatever
    surrounds them, from the training forms' parts alone (``filler_words`` never gives a held-out
    form's word)."""
    if not fillers or rng.random() < p_plain:
        return form.pair(phrase)
    affirmative, negated = form.affirmative, form.negated
    if rng.random() < p_drop_frame:
        affirmative, negated = _without_shared_frame(affirmative, negated)
    counts = {slot: rng.choice(options) for slot, options in _FILL_COUNTS.items()}
    if not any(counts.values()):
        counts[rng.choice(tuple(_FILL_COUNTS))] = 1
    words = {slot: " ".join(rng.choice(fillers) for _ in range(n)) for slot, n in counts.items()}

    def fill(template: str) -> str:
        text = template.rstrip(".")
        if words["object"]:
            text = re.sub(r"\{(a|x|the)\}", lambda m: f"{words['object']} {m.group()}", text, count=1)
        end = "." if template.endswith(".") else ""
        return f"{words['start']} {text} {words['end']}".strip() + end

    slots = _slots(phrase)
    return _sentence(fill(affirmative).format(**slots)), _sentence(fill(negated).format(**slots))


def _without_shared_frame(affirmative: str, negated: str) -> tuple[str, str]:
    """Both templates without the words they open with alike (never a slot): "a photo of {a}." /
    "a photo of not {a}." -> "{a}." / "not {a}."."""
    a, n = affirmative.split(), negated.split()
    shared = 0
    while shared < min(len(a), len(n)) - 1 and a[shared] == n[shared] and "{" not in a[shared]:
        shared += 1
    return " ".join(a[shared:]), " ".join(n[shared:])


_NEGATED_OBJECT = [
    (form, re.compile("^" + re.escape(form.negated).replace(r"\{a\}", r"(?:an?) (?P<a>.+?)")
                      .replace(r"\{x\}", r"(?P<x>.+?)").replace(r"\{the\}", r"the (?P<the>.+?)") + "$"))
    for form in NEGATION_FORMS
]  # fmt: skip


def parse_negated(caption: str) -> tuple[str, str] | None:
    """(form name, object phrase) of a negated caption this grammar writes, else None: what a
    negated caption says is absent, read back (the grammar's tests check every form round-trips).
    Where two forms match ("there is no {x}." also matches "there is no shirt in this photo."),
    the one leaving the shortest phrase is the caption's form."""
    found = []
    for form, pattern in _NEGATED_OBJECT:
        match = pattern.match(caption)
        if match:
            phrase = next(v for v in match.groupdict().values() if v is not None)
            found.append((len(phrase), form.name, phrase))
    return min(found)[1:] if found else None
