"""open_clip's BPE tokenizer with bounded work and memory per text, whatever the text is.

open_clip's ``SimpleTokenizer.encode`` cleans and byte-pair-encodes the whole text before anyone
cuts it to the context, and BPE costs more than linearly in a word's length (one 2,000-letter
word: ~0.1-0.5 s); its word cache also keeps every distinct word forever. Served texts come from
anyone, so ``BoundedTokenizer`` bounds both:

- the raw text is cut to ``CHARS_PER_POSITION`` characters per context position before cleaning
  (a text that fits the context is far shorter: every token is at most 32 characters);
- a word (a run of letters, or of punctuation) is cut to ``MAX_WORD_CHARS`` before BPE (longer
  "words" are not language; the longest English word has 45 letters);
- encoding stops once the tokens overflow the context (``context_length - 1`` tokens are kept,
  so callers still see the overflow as before and open_clip's ``__call__`` cuts as it always did);
- the word cache holds at most ``cache_words`` entries (oldest dropped first).

Every text that fits the context and has no word over ``MAX_WORD_CHARS`` tokenizes exactly as with
open_clip's own tokenizer. ``encode_with_cut`` also says whether anything was dropped, so the
service can report such a text as truncated.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from open_clip.tokenizer import SimpleTokenizer

MAX_WORD_CHARS = 64
CHARS_PER_POSITION = 64
DEFAULT_CACHE_WORDS = 50_000


class BoundedCache(OrderedDict[str, str]):
    """A dict that forgets its oldest entries beyond ``max_items``, except the ``pinned`` ones
    (the special tokens open_clip seeds its cache with: they must always map to themselves)."""

    def __init__(self, max_items: int, pinned: dict[str, str]) -> None:
        self.max_items, self.pinned = max(max_items, len(pinned) + 1), frozenset(pinned)
        super().__init__(pinned)

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        while len(self) > self.max_items:
            oldest = next(iter(self))
            if oldest in self.pinned:
                self.move_to_end(oldest)
            else:
                del self[oldest]


class BoundedTokenizer(SimpleTokenizer):
    cache: dict[str, str]

    def __init__(self, context_length: int, cache_words: int = DEFAULT_CACHE_WORDS) -> None:
        super().__init__(context_length=context_length)
        self.cache = BoundedCache(cache_words + len(self.cache), pinned=self.cache)
        self.max_tokens = context_length - 1  # one past what fits beside the start and end tokens
        self.max_chars = CHARS_PER_POSITION * context_length
        # bpe() reads and writes the shared cache; one lock keeps eviction from racing a lookup
        # (BPE is pure Python, so it never ran in parallel anyway).
        self._lock = threading.Lock()

    def bpe(self, token: str) -> str:
        with self._lock:
            return str(super().bpe(token))

    def encode_with_cut(self, text: str) -> tuple[list[int], bool]:
        """Token ids (at most ``context_length - 1``) and whether any of the text was dropped
        (characters past the budget, a word past ``MAX_WORD_CHARS``, or tokens past the context)."""
        cut = False
        if len(text) > self.max_chars:
            cut = not text[self.max_chars :].isspace()
            text = text[: self.max_chars]
        ids: list[int] = []
        for match in self.pat.finditer(self.clean_fn(text)):
            word = match.group()
            if len(word) > MAX_WORD_CHARS:
                word, cut = word[:MAX_WORD_CHARS], True
            chars = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
            ids.extend(self.encoder[piece] for piece in self.bpe(chars).split(" "))
            if len(ids) >= self.max_tokens:
                return ids[: self.max_tokens], True
        return ids, cut

    def encode(self, text: str) -> list[int]:
        return self.encode_with_cut(text)[0]

    def truncated(self, text: str) -> bool:
        """Whether ``text`` loses anything on its way into the context."""
        ids, cut = self.encode_with_cut(text)
        return cut or len(ids) + 2 > self.context_length
