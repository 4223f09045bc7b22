"""The bounded tokenizer: open_clip's tokens for every text that fits, bounded work and memory for any text."""

from __future__ import annotations

import random
import string

import pytest
import torch
from open_clip.tokenizer import SimpleTokenizer

from clipcore.models.tokenizer import CHARS_PER_POSITION, MAX_WORD_CHARS, BoundedTokenizer

TEXTS = [
    "a red circle to the left of a blue square",
    "The first image contains a larger shape, while the second contains a smaller shape.",
    "  Hello,\tWORLD!!  naïve café &amp; co. 1234567 ",
    "emoji 🙂🙂 and 中文 text",
    "",
    " ".join(["a yellow circle above an orange square"] * 12),  # overflows 77 tokens: cut as before
    "pneumonoultramicroscopicsilicovolcanoconiosis is the longest English word",
    "!" * 40 + " shouting",
]


@pytest.mark.parametrize("context_length", [32, 77])
def test_texts_that_fit_or_overflow_tokenize_as_open_clip_does(context_length: int) -> None:
    ours, theirs = BoundedTokenizer(context_length), SimpleTokenizer(context_length=context_length)
    assert torch.equal(ours(TEXTS), theirs(TEXTS))
    for text in TEXTS:
        full = theirs.encode(text)
        ids, cut = ours.encode_with_cut(text)
        if len(full) + 2 <= context_length:
            assert (ids, cut) == (full, False), text
            assert not ours.truncated(text)
        else:
            assert ids == full[: context_length - 1] and cut, text
            assert ours.truncated(text)


class CountingTokenizer(BoundedTokenizer):
    """Records what reaches BPE and the cleaner, the parts whose cost grows with the input."""

    def __init__(self, context_length: int, **kwargs: int) -> None:
        super().__init__(context_length, **kwargs)
        self.bpe_inputs: list[str] = []
        clean = self.clean_fn
        self.cleaned = 0

        def counting_clean(text: str) -> str:
            self.cleaned += len(text)
            return str(clean(text))

        self.clean_fn = counting_clean

    def bpe(self, token: str) -> str:
        self.bpe_inputs.append(token)
        return super().bpe(token)


def test_huge_words_and_texts_cost_bounded_work_and_are_reported_cut() -> None:
    tok = CountingTokenizer(77)
    rng = random.Random(0)
    word = "".join(rng.choices(string.ascii_lowercase, k=2000))
    ids, cut = tok.encode_with_cut(word)
    assert cut and 0 < len(ids) <= 76
    assert max(len(t) for t in tok.bpe_inputs) <= MAX_WORD_CHARS + 4  # + "</w>"-free byte mapping slack
    body = " ".join("".join(rng.choices(string.ascii_lowercase, k=2000)) for _ in range(100))  # 200 KB
    tok.bpe_inputs.clear()
    tok.cleaned = 0
    assert tok.truncated(body)
    assert tok.cleaned <= CHARS_PER_POSITION * 77
    assert sum(len(t) for t in tok.bpe_inputs) <= 76 * MAX_WORD_CHARS
    # A fitting text with one over-long word loses its tail: reported, never silently.
    ids, cut = tok.encode_with_cut("a " + "x" * (MAX_WORD_CHARS + 10))
    assert cut and tok.truncated("a " + "x" * (MAX_WORD_CHARS + 10))
    # Trailing whitespace past the character budget drops nothing.
    assert tok.encode_with_cut("a red circle" + " " * 10_000) == (SimpleTokenizer().encode("a red circle"), False)


def test_the_word_cache_is_bounded() -> None:
    tok = BoundedTokenizer(77, cache_words=1000)
    rng = random.Random(1)
    for _ in range(5000):
        tok.encode("".join(rng.choices(string.ascii_lowercase, k=8)))
    specials = len(SimpleTokenizer().cache)
    assert len(tok.cache) <= 1000 + specials
    assert tok.encode("<start_of_text>") == SimpleTokenizer().encode("<start_of_text>")
