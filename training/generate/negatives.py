"""Hard negatives of a user's captions by rule-based edits, for DCSM and SemCLIP.

A hard negative is a caption that is false of the image and differs from the true one by one small
edit, the kind plain cosine cannot see (docs/design.md: binding, relations, negation):

- ``swap``: the attribute words of two objects trade places ("a red coat and a blue hat" ->
  "a blue coat and a red hat");
- ``relation``: a relation word becomes its opposite ("left of" -> "right of", "above" -> "below");
- ``negation``: a negation is added or removed ("with a hood" <-> "without a hood", "a dog" ->
  "no dog");
- ``paraphrase`` (a positive, not a negative): the same meaning in another template, which
  SemCLIP pulls together with the original.

Attribute words come from a built-in list of colours and sizes plus every attribute value of the
user's label set. Each edit returns None when it does not apply, so callers keep only real edits.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from clipcore.methods.dcsm import FUNCTIONAL_GROUPS

COLOURS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink", "brown", "black", "white",
           "grey", "gray", "beige", "navy")  # fmt: skip
SIZES = ("small", "large", "big", "tiny", "little", "huge", "short", "long", "tall")
OPPOSITES = {
    "left": "right", "right": "left", "above": "below", "below": "above", "over": "under", "under": "over",
    "beneath": "above", "inside": "outside", "outside": "inside", "before": "after", "after": "before",
    "front": "behind", "behind": "in front of", "top": "bottom", "bottom": "top",
}  # fmt: skip
# Words that carry no visual content but structure, beyond DCSM's defaults: scorer rows for them
# are worth learning when the user's captions use them.
RELATION_GROUPS: dict[str, tuple[str, ...]] = {
    "inside": ("inside", "in"),
    "outside": ("outside",),
    "front": ("front",),
    "behind": ("behind",),
    "near": ("near", "beside", "next"),
    "with": ("with",),
}
_WORD = re.compile(r"[A-Za-z]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def attribute_words(labels: Mapping[str, Mapping[str, str]] = {}) -> set[str]:
    words = set(COLOURS) | set(SIZES)
    for attrs in labels.values():
        for value in attrs.values():
            words.update(_words(value))
    return words


def swap_attributes(caption: str, attributes: Iterable[str]) -> str | None:
    """Swap the first two different attribute words (whole words, case kept as written)."""
    known = set(attributes)
    spans = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(caption) if m.group().lower() in known]
    for i, (s1, e1, w1) in enumerate(spans):
        for s2, e2, w2 in spans[i + 1 :]:
            if w1.lower() != w2.lower():
                return caption[:s1] + w2 + caption[e1:s2] + w1 + caption[e2:]
    return None


def flip_relation(caption: str) -> str | None:
    """Replace the first relation word by its opposite."""
    for match in _WORD.finditer(caption):
        word = match.group().lower()
        if word in OPPOSITES:
            return caption[: match.start()] + OPPOSITES[word] + caption[match.end() :]
    return None


def toggle_negation(caption: str) -> str | None:
    """Remove a negation if there is one ("without" -> "with", "no X" -> "a X", "not " dropped),
    else negate the first "with" or the leading article."""
    rules: Sequence[tuple[str, Callable[[re.Match[str]], str]]] = (
        (r"\bwithout\b", lambda m: "with"),
        (r"\bwith\b", lambda m: "without"),
        (r"\bnot\s+", lambda m: ""),
        (r"\bno\b", lambda m: "a"),
        (r"^(an?|the)\b", lambda m: "no"),
    )
    for pattern, repl in rules:
        edited, n = re.subn(pattern, repl, caption, count=1, flags=re.IGNORECASE)
        if n:
            return edited
    return None


PARAPHRASE_TEMPLATES = ("a photo of {}", "an image showing {}", "a picture of {}", "{} in a photo")


def paraphrase(caption: str, rng: random.Random) -> str:
    core = re.sub(r"^(a photo of|an image showing|a picture of)\s+", "", caption.strip().rstrip("."), flags=re.I)
    return rng.choice(PARAPHRASE_TEMPLATES).format(core)


def hard_negatives(caption: str, attributes: Iterable[str]) -> dict[str, str]:
    """Every applicable edit of ``caption``: ``{"swap"|"relation"|"negation": text}``."""
    edits = {
        "swap": swap_attributes(caption, attributes),
        "relation": flip_relation(caption),
        "negation": toggle_negation(caption),
    }
    return {kind: text for kind, text in edits.items() if text is not None and text != caption}


def functional_groups_for(captions: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """DCSM's functional-word groups, extended by the relation groups the captions use."""
    used = {w for caption in captions for w in _words(caption)}
    groups = dict(FUNCTIONAL_GROUPS)
    for name, words in RELATION_GROUPS.items():
        if name not in groups and used & set(words):
            groups[name] = words
    return groups
