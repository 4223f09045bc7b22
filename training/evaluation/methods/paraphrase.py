"""Paraphrase consistency over the paraphrase forms of ``training.generate.negation_grammar``.

For each phrase ("shirt", "red circle") the plain caption "a shirt" is the anchor; a paraphrase
form writes the same thing in other words ("a snapshot of a shirt."). A form's figure is the share
of phrases whose paraphrase is closer, by cosine through one text encoder, to its own phrase's
plain caption than to every other phrase's (a tie is a miss): a text encoder that reads the
paraphrase for what it says scores 1, one that reads only its template 0, one that guesses
1 / (number of phrases). Figures per form, per family (the mean of its forms), over the training
and the held-out forms (the mean, and the worst held-out form); the held-out forms are the ones no
training reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from training.generate.negation_grammar import FormSplit, ParaphraseForm, indefinite

Encode = Callable[[list[str]], np.ndarray]  # texts -> (N, D) L2-normalised embeddings


def anchor(phrase: str) -> str:
    """The plain caption of a phrase: "shirt" -> "a shirt"."""
    return f"{indefinite(phrase)} {phrase}"


def form_consistency(anchors: np.ndarray, paraphrases: np.ndarray) -> float:
    """Share of rows i with cos(paraphrase i, anchor i) > cos(paraphrase i, anchor j) for every j != i."""
    sims = paraphrases @ anchors.T
    n = len(sims)
    if n < 2:
        return float("nan")
    others = np.where(np.eye(n, dtype=bool), -np.inf, sims)
    return float(np.mean(np.diag(sims) > others.max(axis=1)))


def paraphrase_consistency(phrases: Sequence[str], encode: Encode, forms: Sequence[ParaphraseForm]) -> dict[str, float]:
    """``form.<name>``, ``family.<family>``, ``training``, ``heldout`` and ``heldout.worst`` of
    distinct ``phrases`` (two at least) read by ``encode``."""
    phrases = list(dict.fromkeys(phrases))
    anchors = encode([anchor(p) for p in phrases])
    by_form = {f.name: form_consistency(anchors, encode([f.render(p) for p in phrases])) for f in forms}
    out = {f"form.{name}": v for name, v in by_form.items()}
    groups: dict[str, list[str]] = {}
    for form in forms:
        groups.setdefault(f"family.{form.family}", []).append(form.name)
        groups.setdefault(form.split.value, []).append(form.name)
    out.update({group: float(np.mean([by_form[n] for n in names])) for group, names in groups.items()})
    held = [by_form[f.name] for f in forms if f.split == FormSplit.HELDOUT]
    if held:
        out["heldout.worst"] = float(min(held))
    return out


def headline(figures: Mapping[str, float]) -> dict[str, float]:
    """What a report table shows: the held-out forms (mean and worst), the training forms, and each
    family; per-form figures stay in the details."""
    keep = ["heldout", "heldout.worst", "training"] + [k for k in figures if k.startswith("family.")]
    return {k: figures[k] for k in keep if k in figures}


def flat_figures(by_encoder: Mapping[str, Mapping[str, float]], prefix: str = "paraphrase_forms.") -> dict[str, float]:
    """``paraphrase_forms.<encoder>.<figure>`` for the headline figures of every text encoder."""
    return {f"{prefix}{enc}.{k}": v for enc, figures in by_encoder.items() for k, v in headline(figures).items()}
