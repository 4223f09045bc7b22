"""open_clip's BPE tokenizer with bounded work and memory per text, whatever the text is.

open_clip's ``SimpleTokenizer`` cleans and byte-pair-encodes the whole text before anyone cuts
it to the context, its BPE loop costs time quadratic in a word's length (one 2,000-letter word:
~0.1-0.5 s), and its word cache keeps every distinct word forever. Served texts come from anyone,
so ``BoundedTokenizer`` bounds all three without changing the tokens of any text that fits:

- the raw text is cut to ``CHARS_PER_POSITION`` characters per context position before cleaning
  (twice what the longest vocabulary token can cover: only whitespace or HTML entities could make
  a longer text fit);
- words are merged by ``merge_word``, open_clip's merge order in O(n log n) instead of O(n^2);
- a word that cannot fit the positions left, whatever its merges, is merged only as far as needed
  to fill them (``BoundedTokenizer.mergeable``), so no word costs more than the context holds;
- encoding stops once the tokens overflow the context (``context_length - 1`` tokens are kept,
  so callers still see the overflow as before and open_clip's ``__call__`` cuts as it always did);
- the word cache holds at most ``cache_words`` words of at most ``CACHED_WORD_CHARS`` (oldest
  dropped first); longer words are merged again when seen again.

Every text within the character budget that fits the context tokenizes exactly as with open_clip's
own tokenizer, whatever its words. ``encode_with_cut`` also says whether anything was dropped, so
the service can report such a text as truncated.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Mapping

from open_clip.tokenizer import SimpleTokenizer

CHARS_PER_POSITION = 64
CACHED_WORD_CHARS = 64
# Windows of this many symbols that occur inside no vocabulary token: each holds a piece boundary.
BOUNDARY_WINDOW = 3
DEFAULT_CACHE_WORDS = 50_000
WORD_END = "</w>"


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


def merge_word(ranks: Mapping[tuple[str, str], int], word: str) -> str:
    """The BPE pieces of ``word`` (byte-mapped, no spaces), space-separated, the last one ending
    in ``</w>``: exactly open_clip's ``SimpleTokenizer.bpe`` without its cache.

    open_clip merges, again and again, every occurrence of the adjacent pair of lowest rank, left
    to right. A pair a merge creates always ranks after the merge that made its new piece, so
    taking single pairs from a heap by (rank, position) performs the same merges in the same
    order, in O(n log n): each merge updates a linked list and pushes at most two new pairs.
    """
    pieces = [*word[:-1], word[-1] + WORD_END]
    nxt = [*range(1, len(pieces)), -1]
    prev = list(range(-1, len(pieces) - 1))
    heap = [(r, i) for i in range(len(pieces) - 1) if (r := ranks.get((pieces[i], pieces[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = nxt[i]
        # Stale entries: piece i was merged into its left neighbour, or its pair has changed.
        if not pieces[i] or j == -1 or ranks.get((pieces[i], pieces[j])) != rank:
            continue
        pieces[i], pieces[j] = pieces[i] + pieces[j], ""
        nxt[i] = k = nxt[j]
        if k != -1:
            prev[k] = i
            if (r := ranks.get((pieces[i], pieces[k]))) is not None:
                heapq.heappush(heap, (r, i))
        if (p := prev[i]) != -1 and (r := ranks.get((pieces[p], pieces[i]))) is not None:
            heapq.heappush(heap, (r, p))
    return " ".join(piece for piece in pieces if piece)


class BoundedTokenizer(SimpleTokenizer):
    cache: dict[str, str]

    def __init__(self, context_length: int, cache_words: int = DEFAULT_CACHE_WORDS) -> None:
        super().__init__(context_length=context_length)
        self.cache = BoundedCache(cache_words + len(self.cache), pinned=self.cache)
        self.max_tokens = context_length - 1  # one past what fits beside the start and end tokens
        self.max_chars = CHARS_PER_POSITION * context_length
        pieces = [piece.removesuffix(WORD_END) for piece in self.encoder]
        # A word of n byte symbols is at least n / longest_token tokens.
        self.longest_token = max(map(len, pieces))
        self.byte_symbols = str.maketrans({chr(b): symbol for b, symbol in self.byte_encoder.items()})
        n = BOUNDARY_WINDOW
        self.inner_windows = frozenset(p[i : i + n] for p in pieces for i in range(len(p) - n + 1))
        # Cache writes evict; one lock keeps two threads from evicting at once (lookups are single
        # dict reads, atomic under the GIL).
        self._lock = threading.Lock()

    def bpe(self, token: str) -> str:
        merged = self.cache.get(token)
        if merged is None:
            merged = merge_word(self.bpe_ranks, token)
            if len(token) <= CACHED_WORD_CHARS:  # longer "words" are rare and not worth their memory
                with self._lock:
                    self.cache[token] = merged
        return merged

    def encode_with_cut(self, text: str) -> tuple[list[int], bool]:
        """Token ids (at most ``context_length - 1``) and whether any of the text was dropped
        (characters past the budget, or tokens past the context)."""
        cut = False
        if len(text) > self.max_chars:
            cut = not text[self.max_chars :].isspace()
            text = text[: self.max_chars]
        ids: list[int] = []
        for match in self.pat.finditer(self.clean_fn(text)):
            room = self.max_tokens - len(ids)
            # One BPE symbol per byte; past (room + 1) tokens' worth of them nothing can be kept.
            word = match.group().encode("utf-8")[: (room + 1) * self.longest_token]
            symbols = word.decode("latin-1").translate(self.byte_symbols)
            ids.extend(self.encoder[piece] for piece in self.bpe(self.mergeable(symbols, room)).split(" "))
            if len(ids) >= self.max_tokens:
                return ids[: self.max_tokens], True
        return ids, cut

    def mergeable(self, symbols: str, room: int) -> str:
        """``symbols`` (one word), or the part of it worth merging when it is more than ``room``
        tokens whatever the merges: up to where that is certain, plus one token's worth, so the
        tokens kept are (nearly always) those of the whole word. Costs O(len) at most."""
        if len(symbols) <= CACHED_WORD_CHARS:
            return symbols
        limit = room * self.longest_token  # longer: more than room tokens
        n, inner = BOUNDARY_WINDOW, self.inner_windows
        boundaries, i = 0, 0
        while i + n <= min(len(symbols), limit):
            if symbols[i : i + n] in inner:
                i += 1
                continue
            boundaries += 1  # the next window must not share this one's boundaries
            if boundaries >= room:  # room + 1 pieces at least
                return symbols[: i + n + self.longest_token]
            i += n - 1
        return symbols if len(symbols) <= limit else symbols[: limit + self.longest_token]

    def encode(self, text: str) -> list[int]:
        return self.encode_with_cut(text)[0]

    def truncated(self, text: str) -> bool:
        """Whether ``text`` loses anything on its way into the context."""
        ids, cut = self.encode_with_cut(text)
        return cut or len(ids) + 2 > self.context_length
