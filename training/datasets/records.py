"""The records of a user's dataset: what each kind holds (docs/data.md).

Four kinds, one JSON object per line of a JSONL file (image paths relative to that file):

- ``caption``: ``{"image", "caption"}`` (base training, SemCLIP, YUKINO);
- ``label``: ``{"image", "label", "attributes"?: {name: value}}`` (zero-shot evaluation,
  comparatives, generated difference texts and hard negatives);
- ``pair``: ``{"image_a", "image_b", "difference"}`` where the difference text says how image a
  differs from image b ("The first ..., while the second ...") (PC-CLIP);
- ``negatives``: ``{"image", "caption", "negatives": [...]}``: captions that are false of the
  image, each a small edit of the true one (DCSM, SemCLIP).

A record may name its kind (``"kind": "pair"``); without it the kind follows from the fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)]
ImagePath = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4096)]
Kind = Literal["caption", "label", "pair", "negatives"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Kind


class CaptionRecord(_Record):
    kind: Literal["caption"] = "caption"
    image: ImagePath
    caption: Text


class LabelRecord(_Record):
    kind: Literal["label"] = "label"
    image: ImagePath
    label: Text
    attributes: dict[str, Text] = Field(default_factory=dict)


class PairRecord(_Record):
    kind: Literal["pair"] = "pair"
    image_a: ImagePath
    image_b: ImagePath
    difference: Text


class NegativesRecord(_Record):
    kind: Literal["negatives"] = "negatives"
    image: ImagePath
    caption: Text
    negatives: list[Text] = Field(min_length=1, max_length=64)


Record = CaptionRecord | LabelRecord | PairRecord | NegativesRecord
RECORD_TYPES: dict[str, type[_Record]] = {
    "caption": CaptionRecord,
    "label": LabelRecord,
    "pair": PairRecord,
    "negatives": NegativesRecord,
}
# The field that tells each kind apart when a record does not name its kind.
_KIND_BY_FIELD = (("image_a", "pair"), ("negatives", "negatives"), ("label", "label"), ("caption", "caption"))


def infer_kind(obj: dict[str, Any]) -> str | None:
    """The record's ``kind``, or the one its fields imply; None when neither says."""
    if "kind" in obj:
        return str(obj["kind"])
    return next((kind for field, kind in _KIND_BY_FIELD if field in obj), None)


def image_fields(record: Record) -> tuple[str, ...]:
    """The image paths a record refers to, in field order."""
    if isinstance(record, PairRecord):
        return (record.image_a, record.image_b)
    return (record.image,)
