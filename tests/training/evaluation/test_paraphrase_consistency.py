"""Paraphrase consistency: an encoder that reads what a paraphrase says scores 1, one that reads
only the template (every paraphrase alike) 0, ties counted as losses; figures come per form, per
family, for the training and held-out forms and the worst held-out form; the user-data table
names the rows and sets a finetuned encoder's row against the base encoder's."""

from __future__ import annotations

import numpy as np
import pytest

from training.evaluation.methods.paraphrase import anchor, form_consistency, headline, paraphrase_consistency
from training.evaluation.userdata.figures import describe
from training.generate.negation_grammar import PARAPHRASE_FORMS, FormSplit, paraphrase_forms

PHRASES = ["shirt", "coat", "ankle boot", "red circle", "bag"]


def _by_phrase(texts: list[str]) -> np.ndarray:
    """Each text's embedding is its phrase's one-hot (the phrase found inside it): perfect reading."""
    rows = [[float(anchor(p) in t or p in t) for p in PHRASES] for t in texts]
    out = np.array(rows)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _by_template(texts: list[str]) -> np.ndarray:
    return np.ones((len(texts), 3)) / np.sqrt(3)


def test_an_encoder_that_reads_the_phrase_scores_one_and_one_that_reads_the_template_zero() -> None:
    right = paraphrase_consistency(PHRASES, _by_phrase, PARAPHRASE_FORMS)
    blind = paraphrase_consistency(PHRASES, _by_template, PARAPHRASE_FORMS)
    assert {k for k in right if k.startswith("form.")} == {f"form.{f.name}" for f in PARAPHRASE_FORMS}
    assert all(v == 1.0 for v in right.values()) and all(v == 0.0 for v in blind.values())
    assert {"training", "heldout", "heldout.worst", "family.noun", "family.verb"} <= set(right)


def test_the_held_out_figures_are_the_held_out_forms_mean_and_minimum() -> None:
    held = {f.name for f in paraphrase_forms(FormSplit.HELDOUT)}
    rng = np.random.default_rng(0)
    random_vectors: dict[str, np.ndarray] = {}

    def encode(texts: list[str]) -> np.ndarray:
        for t in texts:
            random_vectors.setdefault(t, rng.normal(size=16))
        out = np.stack([random_vectors[t] for t in texts])
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    figures = paraphrase_consistency(PHRASES, encode, PARAPHRASE_FORMS)
    per_form = [figures[f"form.{name}"] for name in held]
    assert figures["heldout"] == pytest.approx(np.mean(per_form)) and figures["heldout.worst"] == min(per_form)
    assert set(headline(figures)) == {"heldout", "heldout.worst", "training"} | {
        k for k in figures if k.startswith("family.")}  # fmt: skip


def test_one_phrase_has_no_other_to_be_closer_than() -> None:
    assert np.isnan(form_consistency(np.ones((1, 2)), np.ones((1, 2))))


def test_the_user_data_rows_are_named_and_a_finetuned_encoder_is_set_against_the_base() -> None:
    row = describe("paraphrase_forms.semclip.heldout")
    assert row.family == "paraphrase, by phrasing (docs/negation.md)" and row.chance is None
    assert row.needs == "text_encoder:semclip" and row.replaces == "paraphrase_forms.base.heldout"
    assert describe("paraphrase_forms.base.family.noun").replaces is None
    assert describe("negation_forms.pcclip.heldout.both").replaces == "negation_forms.base.heldout.both"
    dcsm = describe("negation_forms.dcsm.heldout.both")  # DCSM against cosine on the same photos
    assert (dcsm.replaces, dcsm.versus) == ("negation_forms.base.heldout.both", "cosine")
