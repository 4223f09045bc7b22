"""Texts generated for a user's data: difference texts, hard-negative edits, comparatives from
templates and from an OpenAI-compatible endpoint (a stand-in server on 127.0.0.1 that also
answers junk, which must be filtered), cached so a rerun sends nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training_job.fake_llm import fake_llm_server
from training.datasets.records import LabelRecord
from training.datasets.source import ImageRef, Item, Place
from training.generate.comparatives import LLMGenerator, TemplateGenerator, build_library, confused_label_pairs
from training.generate.differences import difference_texts, pairs_from_labels
from training.generate.llm import MIN_CHARS, ChatClient, LLMError, clean_comparative
from training.generate.negatives import (
    attribute_words,
    flip_relation,
    functional_groups_for,
    hard_negatives,
    swap_attributes,
    toggle_negation,
)

LABELS = {"coat": {"sleeves": "long", "colour": "grey"}, "shirt": {"sleeves": "short", "colour": "grey"}, "bag": {}}


def test_difference_texts_name_labels_and_differing_attributes_in_both_orders() -> None:
    assert difference_texts("coat", "shirt", LABELS) == [
        "The first image shows a coat, while the second shows a shirt.",
        "The first image has long sleeves, while the second has short sleeves.",  # colour is the same: no text
    ]
    assert difference_texts("bag", "coat", LABELS) == ["The first image shows a bag, while the second shows a coat."]
    items = [Item(LabelRecord(image=f"{i}.png", label=lab), Place("x.jsonl", i), (ImageRef(f"{i}.png"),))
             for i, lab in enumerate(["coat", "shirt", "bag", "coat"])]  # fmt: skip
    pairs = pairs_from_labels(items, LABELS, n_pairs=10, seed=1)
    assert len(pairs) == 20
    for forward, backward in zip(pairs[::2], pairs[1::2]):
        assert (forward.first, forward.second) == (backward.second, backward.first)  # both orders
        assert forward.first.record.label != forward.second.record.label  # type: ignore[union-attr]
        assert forward.difference.startswith("The first image") and ", while the second" in forward.difference
    with pytest.raises(ValueError, match="two labels"):
        pairs_from_labels(items[:1], LABELS, 3)


def test_hard_negative_edits() -> None:
    words = attribute_words(LABELS)
    assert {"long", "short", "grey", "red"} <= words
    assert swap_attributes("a red coat next to a blue bag", words) == "a blue coat next to a red bag"
    assert swap_attributes("a red coat next to a red bag", words) is None  # nothing to swap
    assert flip_relation("a cup to the left of a plate") == "a cup to the right of a plate"
    assert flip_relation("a cup on a plate") is None
    assert toggle_negation("a coat without a hood") == "a coat with a hood"
    assert toggle_negation("a coat with a hood") == "a coat without a hood"
    assert toggle_negation("a dog") == "no dog"
    assert toggle_negation("there is not a cat") == "there is a cat"
    negatives = hard_negatives("a red cup above a blue plate", words)
    assert negatives == {
        "swap": "a blue cup above a red plate",
        "relation": "a red cup below a blue plate",
        "negation": "no red cup above a blue plate",
    }
    groups = functional_groups_for(["a cat inside a box", "a dog behind a fence"])
    assert groups["inside"] == ("inside", "in") and groups["behind"] == ("behind",) and "left" in groups
    assert "near" not in groups


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        ("The first shows a long coat with a belt and large pockets, while the second shows a short shirt.", True),
        (' A: "The first shows a long coat with a belt and large pockets, while the second shows a shirt."', True),
        ("The first shows a long coat with a belt and pockets, while the second shows a shirt.\nQ: next one", True),
        ("The first shows a coat.\nQ: How does a photo of a long coat with a belt differ from a shirt?", False),
        ("```\nThe first shows a long coat with a belt and large pockets, while the second a shirt\n```", False),
        ("<b>The first shows a long coat with a belt and large pockets</b>, while the second shows a shirt.", False),
        ("The first shows a long coat — with a belt and large pockets, while the second shows a short shirt.", False),
        ("The first shows a coat, while the second shows a shirt.", False),  # under 60 characters
        ("I hope this helps! The first shows a long coat with a belt, while the second shows a shirt.", False),
        ("#2: The first shows a long coat with a belt and large pockets, while the second shows a shirt.", False),
    ],
)
def test_llm_answers_are_filtered(answer: str, kept: bool) -> None:
    cleaned = clean_comparative(answer)
    assert (cleaned is not None) == kept, cleaned
    if cleaned is not None:
        assert len(cleaned) >= MIN_CHARS and cleaned.startswith("The first") and "Q:" not in cleaned


def test_llm_generator_against_a_local_server_filters_junk_retries_and_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local-test")
    with fake_llm_server() as (url, fake):
        client = ChatClient(url, "stand-in", tmp_path / "cache", api_key_env="TEST_LLM_KEY", backoff_s=0.01)
        library = build_library([("coat", "shirt")], LLMGenerator(client, samples=8))
        assert fake.requests[0]["_authorization"] == "Bearer sk-local-test"
        sent = len(fake.requests)
        assert sent == 2 * 8 + 1  # both directions, 8 samples each, plus the retried 503
        texts = [c["text"] for c in library]
        assert texts and all(clean_comparative(t) == t for t in texts)
        assert {(c["a"], c["b"]) for c in library} == {("coat", "shirt"), ("shirt", "coat")}
        assert not any("```" in t or "<" in t or not t.isascii() or "Q:" in t or "I hope" in t for t in texts)
        assert len(texts) < 16  # junk answers were dropped, duplicates merged
        # A rerun answers from the disk cache: nothing is sent.
        again = build_library([("coat", "shirt")], LLMGenerator(ChatClient(url, "stand-in", tmp_path / "cache"), 8))
        assert again == library and len(fake.requests) == sent


def test_an_endpoint_that_keeps_failing_is_a_clear_error(tmp_path: Path) -> None:
    client = ChatClient("http://127.0.0.1:9/v1", "none", tmp_path, retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(LLMError, match="failed 2 times"):
        client.complete("Q: hello")


def test_template_comparatives_and_confused_pairs() -> None:
    labels = ["coat", "shirt", "bag"]
    y_true = [0, 0, 0, 1, 1, 1, 2, 2]
    y_pred = [1, 1, 0, 0, 1, 1, 2, 0]
    assert confused_label_pairs(y_true, y_pred, labels, k=2) == [("coat", "shirt", 3), ("coat", "bag", 1)]
    library = build_library([("coat", "shirt"), ("coat", "bag")], TemplateGenerator(LABELS))
    assert {"a": "coat", "b": "shirt", "source": "template",
            "text": "The first image shows a coat with long sleeves, while the second shows a shirt with short sleeves."
            } in library  # fmt: skip
    assert {"a": "bag", "b": "coat", "source": "template",
            "text": "The first image shows a bag, while the second shows a coat."} in library  # fmt: skip
    assert len(library) == 4
