"""What a negated text query asks to see and what it asks not to see, read back from its words.

A cosine first stage embeds "a red circle without a blue square" as one vector, which sits near
images of blue squares as much as near red circles: the negation pulls in the very items it
excludes, and a dense re-rank of that pool starts from the wrong candidates. Split into the shown
part ("a red circle") and the absent part ("a blue square"), the first stage can ask for the one
and away from the other (``clipcore.methods.retrieval.negation_aware_query``), and the re-rank
reads the whole text as written.

The cues are the negations of docs/negation.md and of the shapes world's "X without Y", "X but not
Y", "X and no Y", "X with Y absent", "the X is missing". Pure: strings in, strings out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NegatedQuery", "split_negation"]

# Longest first, so "but not" is one cue and not "but" + "not".
_CUES = (
    "but not", "and not", "and no", "without", "lacking", "that lacks", "lacks",
    "devoid of any", "devoid of", "free of any", "free of", "does not show", "doesn't show",
    "do not show", "don't show", "cannot see", "can't see", "can not see", "is not", "isn't",
    "are not", "aren't", "not", "no",
)  # fmt: skip
# Not before a hyphen: "a no-iron shirt" negates nothing.
_CUE = re.compile(r"\b(?:" + "|".join(re.escape(c).replace(r"\ ", r"\s+") for c in _CUES) + r")\b(?!-)", re.IGNORECASE)
# "the shirt is missing", "a red circle with a blue square absent": the absent part comes first.
_PREDICATE = re.compile(
    r"^(?:(?P<shown>.+?)\s+with\s+)?(?P<absent>.+?)\s+(?:(?:is|are)\s+)?"
    r"(?:absent|missing|not\s+(?:here|present|shown))\W*$",
    re.IGNORECASE,
)
# Words that frame a caption without saying what is in the image: a shown part made of these alone
# ("there is", "a photo of", "this photo") asks for nothing.
_FRAME_WORDS = frozenset(
    "a an the any this that it its there here is are be of with in on photo photograph image picture "
    "scene snapshot shows show showing contains containing has have you can see we and but which".split()
)
_TRAILING_FRAME = re.compile(r"(?:\s+(?:in\s+(?:this|the)\s+(?:photo|image|picture|scene)|in\s+it|here))+$", re.I)
_CONJUNCTION = re.compile(r"\s*(?:[,;]|\b(?:and|but|while|whereas)\b)\s*", re.IGNORECASE)
_EDGE = re.compile(r"^[\s,;:.!?]+|[\s,;:.!?]+$")


@dataclass(frozen=True)
class NegatedQuery:
    shown: str | None  # what the query asks to see; None when it asks only for an absence
    absent: str  # what it asks not to see


def _clean(part: str) -> str:
    return _EDGE.sub("", _TRAILING_FRAME.sub("", _EDGE.sub("", part)))


def _says_something(part: str) -> bool:
    return any(w not in _FRAME_WORDS for w in re.findall(r"[a-z0-9']+", part.lower()))


def split_negation(text: str) -> NegatedQuery | None:
    """The shown and absent parts of a negated query, or None when the text negates nothing (or
    nothing can be read as absent). The first negation cue splits the text; what follows it is
    the absent part, up to the end or to a conjunction ("and", "but", a comma) whose conjunct is
    shown again (a second negation stays in the part it falls in)."""
    body = text.strip()
    match = _PREDICATE.match(body)
    if match:
        shown, absent = match.group("shown") or "", match.group("absent")
    else:
        cue = _CUE.search(body)
        if cue is None:
            return None
        shown, absent = body[: cue.start()], body[cue.end() :]
        # "with no collar and a plain front": the negation ends where another conjunct begins.
        joined = _CONJUNCTION.search(absent)
        if joined:
            shown, absent = f"{shown.rstrip()} {absent[joined.end() :]}", absent[: joined.start()]
    absent = _clean(absent)
    if not _says_something(absent):
        return None
    shown = re.sub(r"(?:\s+(?:but|and|that|which|while|,))+$", "", _clean(shown), flags=re.I)
    return NegatedQuery(shown if _says_something(shown) else None, absent)
