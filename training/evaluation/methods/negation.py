"""Two-sided negation figures over the forms of ``training.generate.negation_grammar``.

Every figure is measured on both sides of a form:

* **present**: an object the image shows; its affirmative caption must score above the negated one;
* **absent**: an object the image does not show; the negated caption must score above the
  affirmative one.

A form's two-sided accuracy is the mean of its two sides, so a scorer that merely lowers any
caption with a negation word (present 1, absent 0) scores 0.5, and so does one that ignores the
negation. Figures per form, per family (the mean of its forms), and over the training and the
held-out forms (the mean, and the worst form); a data source gives the images, the phrases and a
way to score (image, right caption, wrong caption) rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from clipcore.models.bundle import ModelBundle
from training.evaluation.methods.dcsm import bundle_wins, cosine_wins
from training.generate.negation_grammar import FormSplit, NegationForm

SIDES = ("present", "absent")


@dataclass(frozen=True)
class NegationRow:
    """One comparison: on image ``image``, ``right`` must score above ``wrong``."""

    image: int
    right: str
    wrong: str
    form: str
    side: str  # "present" | "absent"


def negation_rows(present: Sequence[str], absent: Sequence[str], forms: Sequence[NegationForm]) -> list[NegationRow]:
    """For image i, ``present[i]`` names an object it shows and ``absent[i]`` one it does not:
    one present and one absent row per form."""
    rows = []
    for i, (shown, missing) in enumerate(zip(present, absent, strict=True)):
        for form in forms:
            affirmative, negated = form.pair(shown)
            rows.append(NegationRow(i, affirmative, negated, form.name, "present"))
            affirmative, negated = form.pair(missing)
            rows.append(NegationRow(i, negated, affirmative, form.name, "absent"))
    return rows


def two_sided(rows: Sequence[NegationRow], wins: np.ndarray, forms: Sequence[NegationForm]) -> dict[str, float]:
    """Flat figures from per-row wins: ``form.<name>.<side>``, ``family.<family>.<side>``,
    ``<training|heldout>.<side>`` and ``heldout.worst`` (the held-out form with the lowest
    two-sided accuracy), where side is ``present``, ``absent`` or ``both`` (their mean)."""
    wins = np.asarray(wins, dtype=bool)
    by_form: dict[str, dict[str, float]] = {}
    for form in forms:
        sides = {}
        for side in SIDES:
            mask = np.array([r.form == form.name and r.side == side for r in rows])
            sides[side] = float(wins[mask].mean()) if mask.any() else float("nan")
        sides["both"] = (sides["present"] + sides["absent"]) / 2
        by_form[form.name] = sides
    out = {f"form.{name}.{side}": v for name, sides in by_form.items() for side, v in sides.items()}
    groups: dict[str, list[str]] = {}
    for form in forms:
        groups.setdefault(f"family.{form.family}", []).append(form.name)
        groups.setdefault(form.split.value, []).append(form.name)
    for group, names in groups.items():
        for side in (*SIDES, "both"):
            out[f"{group}.{side}"] = float(np.mean([by_form[n][side] for n in names]))
    held = [by_form[f.name]["both"] for f in forms if f.split == FormSplit.HELDOUT]
    if held:
        out["heldout.worst"] = float(min(held))
    return out


def headline(figures: Mapping[str, float]) -> dict[str, float]:
    """The figures a report table shows (per-form figures stay in the details): each family's
    two-sided accuracy, and the held-out forms' present, absent, two-sided and worst form."""
    keep = [k for k in figures if k.startswith("family.") and k.endswith(".both")]
    keep += [f"heldout.{s}" for s in (*SIDES, "both", "worst")] + ["training.both"]
    return {k: figures[k] for k in keep if k in figures}


def bundle_negation(
    bundle: ModelBundle,
    images: np.ndarray,
    present: Sequence[str],
    absent: Sequence[str],
    forms: Sequence[NegationForm],
    encoders: Sequence[str],
) -> dict[str, dict[str, float]]:
    """Two-sided figures (``two_sided``) per scorer: ``dcsm`` when the version has a scorer (what
    ``POST /score/dense`` answers) and plain cosine through each text encoder in ``encoders``.
    ``images``: (N, S, S, 3) as ``bundle.preprocess`` returns them."""
    rows = negation_rows(present, absent, forms)
    image_of = np.array([r.image for r in rows])
    rights, wrongs = [r.right for r in rows], [r.wrong for r in rows]
    pooled = np.concatenate([bundle.encode_images(images[i : i + 256]) for i in range(0, len(images), 256)])
    distinct = list(dict.fromkeys(rights + wrongs))
    out: dict[str, dict[str, float]] = {}
    for encoder in encoders:
        embedded = dict(zip(distinct, bundle.encode_texts(distinct, encoder), strict=True))
        wins = cosine_wins(pooled[image_of], np.stack([embedded[t] for t in rights]),
                           np.stack([embedded[t] for t in wrongs]))  # fmt: skip
        out[encoder] = two_sided(rows, wins, forms)
    if bundle.dcsm is not None:
        tokens = np.concatenate([bundle.encode_dense_images(images[i : i + 256]) for i in range(0, len(images), 256)])
        out["dcsm"] = two_sided(rows, bundle_wins(bundle, tokens, image_of, rights, wrongs), forms)
    return out


def flat_figures(by_scorer: Mapping[str, Mapping[str, float]], prefix: str = "negation_forms.") -> dict[str, float]:
    """``negation_forms.<scorer>.<figure>`` for the headline figures of every scorer."""
    return {f"{prefix}{scorer}.{k}": v for scorer, figures in by_scorer.items() for k, v in headline(figures).items()}
