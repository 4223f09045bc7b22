"""Reading a negated query back into what it shows and what it excludes (the first stage of a DCSM
re-rank asks for the one and away from the other)."""

from __future__ import annotations

import numpy as np
import pytest

from clipcore.methods.common import l2_normalize
from clipcore.methods.negated_query import NegatedQuery, split_negation
from clipcore.methods.retrieval import first_stage_query, first_stage_texts
from training.generate.negation_grammar import NEGATION_FORMS


@pytest.mark.parametrize(
    ("text", "shown", "absent"),
    [
        ("a green cross without a purple circle", "a green cross", "a purple circle"),
        ("a photo of a blue diamond but not a green square.", "a photo of a blue diamond", "a green square"),
        ("an image with a red circle and no blue square.", "an image with a red circle", "blue square"),
        ("a purple circle with a yellow triangle absent", "a purple circle", "a yellow triangle"),
        ("a dress without sleeves", "a dress", "sleeves"),
        ("a red bag and no strap", "a red bag", "strap"),
        ("an item with long sleeves that is not a coat.", "an item with long sleeves", "a coat"),
        ("a photo of an item with no collar and a plain front.", "a photo of an item with a plain front", "collar"),
    ],
)
def test_a_shown_and_an_absent_part(text: str, shown: str, absent: str) -> None:
    assert split_negation(text) == NegatedQuery(shown, absent)


@pytest.mark.parametrize("form", NEGATION_FORMS, ids=lambda f: f.name)
def test_every_negation_form_of_the_grammar_names_its_object_absent_and_nothing_shown(form) -> None:  # noqa: ANN001
    affirmative, negated = form.pair("shirt")
    found = split_negation(negated)
    assert found is not None and found.shown is None
    assert found.absent.removeprefix("the ").removeprefix("a ").endswith("shirt")
    assert split_negation(affirmative) is None


@pytest.mark.parametrize(
    "text",
    ["a red circle to the left of a blue square", "a photo of a notebook.", "a no-iron shirt", "nothing here", "no"],
)
def test_texts_that_negate_nothing_are_read_as_they_are(text: str) -> None:
    assert split_negation(text) is None
    assert first_stage_texts(text) == [text]


def test_the_first_stage_query_is_the_shown_part_minus_the_absent_one() -> None:
    shown, absent = l2_normalize(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    text = "a red circle without a blue square"
    assert first_stage_texts(text) == ["a red circle", "a blue square"]
    query = first_stage_query(text, np.stack([shown, absent]))
    np.testing.assert_allclose(query, l2_normalize(shown - absent))
    # An image of the shown part alone now outranks one of both, and that one the absent part alone.
    images = l2_normalize(np.array([[1.0, 0.0, 0.2], [1.0, 1.0, 0.2], [0.0, 1.0, 0.2]]))
    assert np.argsort(-(images @ query)).tolist() == [0, 1, 2]
    nothing_shown = first_stage_query("this is not a shirt", absent[None])
    np.testing.assert_allclose(nothing_shown, -absent)
    plain = first_stage_query("a red circle", shown[None])
    np.testing.assert_allclose(plain, shown)
    with pytest.raises(ValueError, match="1 embeddings for the 2 first-stage texts"):
        first_stage_query(text, shown[None])
