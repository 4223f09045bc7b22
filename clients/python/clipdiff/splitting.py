"""Splitting work larger than the server's limits into requests it accepts.

A server refuses (413) a request with more items than its limits (``GET /limits``) or a body
larger than ``max_body_bytes``. The client cuts such work into consecutive chunks that each fit,
sends them one after another and merges the answers in input order, so a caller never needs to
know the limits. Each chunk is an ordinary request: a cached item stays cached, and a chunk
that fails raises as a single request would.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["body_bounds", "chunk_bounds", "json_size"]


def json_size(value: Any) -> int:
    """Bytes ``value`` takes in a request body: the transport sends compact, ASCII-escaped JSON,
    so this is exact."""
    return len(json.dumps(value, separators=(",", ":")))


def body_bounds(
    body: dict[str, Any], key: str, items: Sequence[Any], max_items: int | None, max_body_bytes: int | None
) -> list[tuple[int, int]]:
    """Chunks of ``items`` such that ``{**body, key: items[a:b]}`` holds at most ``max_items``
    items and at most ``max_body_bytes`` bytes; one empty chunk for no items (the server then
    answers as it does for an empty list)."""
    max_bytes = None
    if max_body_bytes is not None:
        # Each item costs its own bytes and the comma after it; the last one has none, hence + 1.
        max_bytes = max(1, max_body_bytes - json_size({**body, key: []}) + 1)
    return chunk_bounds([json_size(x) + 1 for x in items], max_items, max_bytes) or [(0, 0)]


def chunk_bounds(sizes: Sequence[int], max_items: int | None, max_bytes: int | None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(len(sizes))`` in order, each chunk at most
    ``max_items`` long and, where possible, at most ``max_bytes`` in total size.

    An item larger than ``max_bytes`` alone still gets its own chunk (the server's 413 then
    names it).
    """
    count = len(sizes)
    if count == 0:
        return []
    limit_items = max_items or count
    bounds: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        full = i - start >= limit_items or (max_bytes is not None and total + size > max_bytes and i > start)
        if full:
            bounds.append((start, i))
            start, total = i, 0
        total += size
    bounds.append((start, count))
    return bounds
