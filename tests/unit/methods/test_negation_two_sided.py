"""The two-sided negation metric: a scorer that only punishes negation words, or one that ignores
them, scores 0.5 on every form; one that reads the negation scores 1; figures group by family and
by the training / held-out split."""

from __future__ import annotations

import numpy as np

from clipcore.methods.dcsm import NEGATION_WORDS
from training.evaluation.methods.negation import headline, negation_rows, two_sided
from training.generate.negation_grammar import NEGATION_FORMS, FormSplit, families, parse_negated

PRESENT, ABSENT = ["shirt", "red circle", "bag"], ["coat", "blue square", "sandal"]
ROWS = negation_rows(PRESENT, ABSENT, NEGATION_FORMS)


def _negates(text: str) -> bool:
    return bool(set(text.replace("'", " ").rstrip(".").split()) & set(NEGATION_WORDS))


def test_a_scorer_that_punishes_negation_words_gets_one_half_everywhere() -> None:
    wins = np.array([not _negates(r.right) for r in ROWS])  # prefers whichever caption has no negation
    figures = two_sided(ROWS, wins, NEGATION_FORMS)
    assert figures["heldout.present"] == 1.0 and figures["heldout.absent"] == 0.0
    for key, value in figures.items():
        if key.endswith((".both", ".worst")):
            assert value == 0.5, key
    ignoring = two_sided(ROWS, np.zeros(len(ROWS), dtype=bool), NEGATION_FORMS)  # always the wrong caption
    assert ignoring["heldout.both"] == 0.0 and ignoring["training.both"] == 0.0


def test_a_scorer_that_reads_the_negation_scores_one_and_the_worst_form_is_found() -> None:
    def right_answer(row) -> bool:  # what the image at row.image shows, read through the grammar
        parsed = parse_negated(row.right)
        return parsed is None or parsed[1] not in PRESENT  # "no X" is right when X is not shown

    wins = np.array([right_answer(r) for r in ROWS])
    assert wins.all()
    broken = wins.copy()
    broken[[i for i, r in enumerate(ROWS) if r.form == "this_isnt" and r.side == "absent"]] = False
    figures = two_sided(ROWS, broken, NEGATION_FORMS)
    assert figures["form.this_isnt.both"] == 0.5 and figures["heldout.worst"] == 0.5
    assert figures["family.copula.absent"] == 2 / 3  # one of the family's three forms fails its absent side
    assert figures["training.both"] == 1.0
    held = [f for f in NEGATION_FORMS if f.split == FormSplit.HELDOUT]
    assert figures["heldout.both"] == (len(held) - 0.5) / len(held)
    shown = headline(figures)
    assert {f"family.{f}.both" for f in families()} <= set(shown)
    assert {"heldout.present", "heldout.absent", "heldout.both", "heldout.worst", "training.both"} <= set(shown)
    assert not any(k.startswith("form.") for k in shown)


def test_rows_ask_each_form_both_ways_on_every_image() -> None:
    assert len(ROWS) == 2 * len(PRESENT) * len(NEGATION_FORMS)
    first = [r for r in ROWS if r.image == 0 and r.form == "photo_of_no"]
    assert [(r.side, r.right, r.wrong) for r in first] == [
        ("present", "a photo of a shirt.", "a photo of no shirt."),
        ("absent", "a photo of no coat.", "a photo of a coat."),
    ]
