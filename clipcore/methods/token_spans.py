"""Locating words inside tokenized text (pure; ids in, positions out).

BPE splits some words into several tokens ("cyan" -> two ids), so words are matched as id
sequences. A match must start after a word boundary: the previous token ends a word (its
text ends with ``</w>``) or is the start token, which the caller encodes in ``word_end``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def find_word_spans(
    token_ids: Sequence[int], words: Mapping[str, Sequence[int]], word_start_ok: Sequence[bool] | None = None
) -> list[tuple[int, int, str]]:
    """Non-overlapping ``(start, end, word)`` spans (end exclusive), left to right.

    ``words`` maps each word to its token-id sequence; longer words win on overlap (so
    "but not" is found before "not"). ``word_start_ok[i]`` says whether a word may start at
    position ``i`` (None: anywhere).
    """
    ordered = sorted(words.items(), key=lambda kv: -len(kv[1]))
    spans: list[tuple[int, int, str]] = []
    taken = [False] * len(token_ids)
    for word, ids in ordered:
        n = len(ids)
        if n == 0:
            continue
        for i in range(len(token_ids) - n + 1):
            if any(taken[i : i + n]) or list(token_ids[i : i + n]) != list(ids):
                continue
            if word_start_ok is not None and not word_start_ok[i]:
                continue
            spans.append((i, i + n, word))
            for j in range(i, i + n):
                taken[j] = True
    return sorted(spans)
