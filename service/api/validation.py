"""Checks that depend on settings or on several fields at once (400 / 413, never 422).

The models catch wrong types and shapes (422); what passes them but still cannot be served is
refused here, before any decoding or encoding: empty or duplicate lists (400), empty or blank
texts (400), templates without exactly one ``{}`` (400), texts that are not Unicode (400), labels
named where the request has no such label (400), and anything over a configured limit (413).
The OpenAPI schema states the first three as well (minItems, uniqueItems, the patterns of
``service.api.schemas``); their answer stays the documented 400 with the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clipcore.methods.zero_shot import DEFAULT_TEMPLATES
from service.api.errors import bad_input, too_large
from service.api.schemas import (
    NON_BLANK,
    ClassifyRequest,
    DenseRequest,
    EmbedRequest,
    HeatmapRequest,
    RankPairRequest,
    RankRequest,
)
from service.config import Limits


def _amount(n: int, what: str) -> str:
    """``none``, ``one text``, ``3 texts`` (``what`` is the plural)."""
    if n == 0:
        return "none"
    return f"one {what.removesuffix('s')}" if n == 1 else f"{n} {what}"


def check_count(items: Sequence[Any], field: str, low: int, high: int, what: str) -> None:
    if len(items) < low:
        raise bad_input(f"{field} needs at least {_amount(low, what)}, got {_amount(len(items), what)}", field)
    if len(items) > high:
        raise too_large(f"{field} has {len(items)} {what}; this server accepts at most {high}", field)


def check_text(text: str, field: str, limits: Limits) -> None:
    if NON_BLANK.search(text) is None:  # the schema's pattern: not empty, not only whitespace
        raise bad_input("text must not be empty", field)
    if len(text) > limits.max_text_chars:
        raise too_large(f"text is {len(text)} characters; at most {limits.max_text_chars}", field)
    if not is_unicode(text):
        raise bad_input(
            "text holds an unpaired surrogate (a lone \\ud800-\\udfff escape), which is not Unicode text", field
        )


def is_unicode(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form. JSON lets a client send half of a surrogate pair
    (``"\\ud800"``) alone; such a string fails wherever it is encoded (digests, tokenizer)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_classify(req: ClassifyRequest, limits: Limits) -> None:
    check_count(req.images, "images", 1, limits.max_images, "images")
    check_count(req.labels, "labels", 2, limits.max_labels, "labels")
    seen: set[str] = set()
    for i, label in enumerate(req.labels):
        check_text(label, f"labels.{i}", limits)
        if label in seen:
            raise bad_input(f"label {label!r} is given twice", f"labels.{i}")
        seen.add(label)
    if req.templates is not None:
        check_count(req.templates, "templates", 1, limits.max_prompts_per_label, "templates")
        for i, template in enumerate(req.templates):
            check_text(template, f"templates.{i}", limits)
            if template.count("{}") != 1:
                raise bad_input("each template must contain exactly one {} (where the label goes)", f"templates.{i}")
    for label, descriptions in (req.descriptions or {}).items():
        if label not in seen:
            raise bad_input(f"descriptions for {label!r}, which is not among the labels", f"descriptions.{label}")
        check_count(descriptions, f"descriptions.{label}", 0, limits.max_prompts_per_label, "descriptions")
        for i, text in enumerate(descriptions):
            check_text(text, f"descriptions.{label}.{i}", limits)
    if req.comparatives is not None:
        check_count(req.comparatives, "comparatives", 1, limits.max_comparatives, "comparatives")
        for i, comp in enumerate(req.comparatives):
            for side in ("a", "b"):
                if getattr(comp, side) not in seen:
                    raise bad_input(
                        f"comparative label {getattr(comp, side)!r} is not among the labels", f"comparatives.{i}.{side}"
                    )
            if comp.a == comp.b:
                raise bad_input("a comparative must contrast two different labels", f"comparatives.{i}")
            check_text(comp.text, f"comparatives.{i}.text", limits)
    total = len(req.labels) * len(req.templates if req.templates is not None else DEFAULT_TEMPLATES)
    total += sum(len(d) for d in (req.descriptions or {}).values())
    if total > limits.max_labels * limits.max_prompts_per_label:
        raise too_large(f"{total} prompts in one request is more than this server accepts")


def check_rank_pair(req: RankPairRequest, limits: Limits) -> None:
    if req.pairs is None:
        assert req.difference is not None
        check_text(req.difference, "difference", limits)
        return
    check_count(req.pairs, "pairs", 1, limits.max_pairs, "pairs")
    for i, pair in enumerate(req.pairs):
        check_text(pair.difference, f"pairs.{i}.difference", limits)


def check_rank(req: RankRequest, limits: Limits) -> None:
    check_count(req.images, "images", 2, limits.max_images, "images")
    check_text(req.difference, "difference", limits)


def check_embed(req: EmbedRequest, limits: Limits) -> None:
    if req.texts is not None:
        check_count(req.texts, "texts", 1, limits.max_texts, "texts")
        for i, text in enumerate(req.texts):
            check_text(text, f"texts.{i}", limits)
    else:
        assert req.images is not None
        check_count(req.images, "images", 1, limits.max_images, "images")


def check_dense(req: DenseRequest, limits: Limits) -> None:
    check_count(req.texts, "texts", 1, limits.max_texts, "texts")
    for i, text in enumerate(req.texts):
        check_text(text, f"texts.{i}", limits)


def check_heatmap(req: HeatmapRequest, limits: Limits) -> None:
    check_text(req.text, "text", limits)
    if req.image.sha256 is not None:
        # The heatmap draws the picture itself; a reference only names cached features.
        raise bad_input("the heatmap draws the image: send it as 'data' (or 'url'), not as a reference", "image.sha256")
