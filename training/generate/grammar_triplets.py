"""SemCLIP's caption triplets (original, paraphrase, negation) from the negation grammar's
TRAINING forms (``training.generate.negation_grammar``; docs/negation.md).

A caption is reduced to the phrase it says is there ("a photo of a shirt." -> "shirt"); a training
negation form, drawn from ``rng``, writes the original (its affirmative) and the negation (its
negated caption), so the two differ only in the negation; a training paraphrase form writes the
paraphrase, never the original's own text. A caption that names a part ("a coat with a hood",
"a coat without a hood") is negated by a training attribute-negation form instead: the object
stays in the image, the part does not. Held-out forms are never written here, so SemCLIP's
held-out figures ask phrasings its training never read. Pure: strings and a seeded rng in,
strings out.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from training.generate.negation_grammar import (
    FormSplit,
    attribute_forms,
    forms,
    indefinite,
    paraphrase_forms,
)

# What a caption says before the phrase: the fixed caption templates of captioned_images and of
# SemCLIP's earlier paraphrases, and a leading article.
_LEAD = re.compile(r"^(?:(?:a photo of|an image showing|a picture of|an image of)\s+)?(?:(?:an?|the)\s+)?", re.I)
_PART = re.compile(r"^(?P<noun>.+?) (?P<how>with|without) (?:an? )?(?P<part>[a-z][a-z -]*)$", re.I)


@dataclass(frozen=True)
class GrammarTriplet:
    original: str
    paraphrase: str
    negation: str
    form: str  # the negation (or attribute-negation) form that wrote original and negation


def caption_phrase(caption: str) -> str:
    """The phrase a caption says is there: its fixed lead ("a photo of", an article) and final
    full stop removed ("a photo of a red coat." -> "red coat")."""
    text = re.sub(r"\s+", " ", caption).strip().rstrip(".").strip()
    return _LEAD.sub("", text, count=1).strip() or text


def _paraphrase(phrase: str, original: str, rng: random.Random) -> str:
    options = [f.render(phrase) for f in paraphrase_forms(FormSplit.TRAINING)]
    options = [text for text in options if text != original] or options
    return options[rng.randrange(len(options))]


def object_triplet(phrase: str, rng: random.Random) -> GrammarTriplet:
    """ "there is ``phrase``" in a drawn training negation form, negated by it, and paraphrased."""
    training = forms(FormSplit.TRAINING)
    form = training[rng.randrange(len(training))]
    original, negated = form.pair(phrase)
    return GrammarTriplet(original, _paraphrase(phrase, original, rng), negated, form.name)


def attribute_triplet(noun: str, part: str, has_part: bool, rng: random.Random) -> GrammarTriplet:
    """``noun`` with (``has_part``) or without ``part``, negated by a drawn training attribute form:
    the caption true of the image is the original, the other side its negation."""
    training = attribute_forms(FormSplit.TRAINING)
    form = training[rng.randrange(len(training))]
    with_part, without_part = form.pair(noun, part)
    original, negation = (with_part, without_part) if has_part else (without_part, with_part)
    said = f"{noun} {'with' if has_part else 'without'} {indefinite(part)} {part}"
    return GrammarTriplet(original, _paraphrase(said, original, rng), negation, form.name)


def caption_triplet(caption: str, rng: random.Random) -> GrammarTriplet:
    """The triplet of a caption: an attribute negation when it names a part with "with" / "without",
    else an object negation of its whole phrase."""
    phrase = caption_phrase(caption)
    match = _PART.match(phrase)
    if match:
        return attribute_triplet(match["noun"], match["part"].strip(), match["how"].lower() == "with", rng)
    return object_triplet(phrase, rng)
