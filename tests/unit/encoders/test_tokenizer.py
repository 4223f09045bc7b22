"""The bounded tokenizer: open_clip's tokens for every text that fits, bounded work and memory for any text."""

from __future__ import annotations

import random
import string

import pytest
import torch
from open_clip.tokenizer import SimpleTokenizer

from clipcore.models.tokenizer import CACHED_WORD_CHARS, CHARS_PER_POSITION, BoundedTokenizer, merge_word

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


def _long_words_that_fit(context_length: int) -> list[str]:
    """Texts with a word of over 64 bytes (what was cut before) that still fit the context."""
    theirs = SimpleTokenizer(context_length=context_length)
    texts = ["so funny " + "ha" * 40, "the #" + "thinkbigsundaywithmarsha" * 3 + " poster", "a" * 70]
    for unit in ("blackandwhitephotography", "🙂" * 8, "ab", "x"):
        # As many repeats as fit: the longest such words (up to 24 letters per token).
        repeats = 1
        while len(theirs.encode("a " + unit * (repeats + 1))) + 2 <= context_length:
            repeats += 1
        texts.append("a " + unit * repeats)
    return [t for t in texts if max(len(word.encode()) for word in t.split()) > 64]  # bytes: BPE symbols


@pytest.mark.parametrize("context_length", [32, 77])
def test_long_words_that_fit_tokenize_as_open_clip_does(context_length: int) -> None:
    ours, theirs = BoundedTokenizer(context_length), SimpleTokenizer(context_length=context_length)
    texts = _long_words_that_fit(context_length)
    assert len(texts) >= 5
    for text in texts:
        full = theirs.encode(text)
        assert len(full) + 2 <= context_length, text
        assert ours.encode_with_cut(text) == (full, False), text
        assert not ours.truncated(text)


def test_merges_are_open_clips_for_any_word() -> None:
    theirs = SimpleTokenizer()
    pieces = sorted(k.removesuffix("</w>") for k in theirs.encoder)
    rng = random.Random(2)
    symbols = list(theirs.byte_encoder.values())
    words = [*rng.sample(pieces, 2000), "a", "ab", "aaaa" * 50, "hahaha" * 100]
    words += [rng.choice(pieces) * rng.randint(2, 8) for _ in range(500)]
    words += [rng.choice(pieces) + rng.choice(pieces) for _ in range(1000)]
    words += ["".join(rng.choices(rng.choice([symbols, "aab", string.ascii_lowercase]), k=rng.randint(1, 300)))
              for _ in range(1000)]  # fmt: skip
    for word in words:
        theirs.cache = {}  # open_clip's own merges, not a cached answer
        assert merge_word(theirs.bpe_ranks, word) == theirs.bpe(word), word


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


@pytest.mark.parametrize("context_length", [32, 77])
def test_huge_words_and_texts_cost_bounded_work_and_are_reported_cut(context_length: int) -> None:
    tok = CountingTokenizer(context_length)
    theirs = SimpleTokenizer(context_length=context_length)
    rng = random.Random(0)
    # Merging is O(n log n) in what reaches it; what reaches it is bounded by the context whatever
    # the text: at most one token's worth past what overflows it.
    most = (context_length + 1) * tok.longest_token
    for word in ("".join(rng.choices(string.ascii_lowercase, k=2000)), "x" * 2000, "🙂" * 2000, "ab" * 1000):
        tok.bpe_inputs.clear()
        ids, cut = tok.encode_with_cut(word)
        assert sum(map(len, tok.bpe_inputs)) <= most, word[:10]
        assert cut and len(ids) == context_length - 1 and tok.truncated(word)
        assert ids == theirs.encode(word)[: context_length - 1]  # still open_clip's first tokens
    tok.bpe_inputs.clear()
    letters = "".join(rng.choices(string.ascii_lowercase, k=2000))
    tok.encode_with_cut(letters)
    # A word that is plainly too long (random letters: ~2 per token) is merged only about as far
    # as the context holds, not to the longest token's bound.
    assert sum(map(len, tok.bpe_inputs)) <= 4 * context_length + tok.longest_token
    body = " ".join("".join(rng.choices(string.ascii_lowercase, k=2000)) for _ in range(100))  # 200 KB
    tok.bpe_inputs.clear()
    tok.cleaned = 0
    assert tok.truncated(body)
    assert tok.cleaned <= CHARS_PER_POSITION * context_length
    assert sum(map(len, tok.bpe_inputs)) <= most
    # Trailing whitespace past the character budget drops nothing.
    assert tok.encode_with_cut("a red circle" + " " * 10_000) == (SimpleTokenizer().encode("a red circle"), False)


def test_the_word_cache_is_bounded() -> None:
    tok = BoundedTokenizer(77, cache_words=1000)
    rng = random.Random(1)
    for _ in range(5000):
        tok.encode("".join(rng.choices(string.ascii_lowercase, k=8)))
    specials = len(SimpleTokenizer().cache)
    assert len(tok.cache) <= 1000 + specials
    tok.encode("x" * (CACHED_WORD_CHARS + 1))  # long words are merged again when seen again, not kept
    assert all(len(word) <= CACHED_WORD_CHARS for word in tok.cache)
    assert tok.encode("<start_of_text>") == SimpleTokenizer().encode("<start_of_text>")
