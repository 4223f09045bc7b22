"""The in-memory vector indexes of an embedded collection: exact (FAISS flat) or HNSW.

Both are keyed by the SQLite row key of each item (``embedded.py``) and answer the same calls.
A key is never reused (SQLite's AUTOINCREMENT): a replaced item gets a new key, so an index entry
whose key is still in SQLite holds that row's vector, which is what lets a saved HNSW graph be
brought up to date from SQLite after a crash (``HnswIndex.load``).

HNSW is FAISS's ``IndexHNSWFlat`` (inner product on the unit vectors): it keeps the float32
vectors themselves, so the scores it returns are the exact cosines of its candidates; only which
candidates it finds is approximate. FAISS's graph cannot remove an entry, so removed and replaced
keys are tombstones, skipped inside the walk by an ``IDSelector``, and the graph is built anew
without them once they pass ``REBUILD_SHARE`` of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Protocol

import faiss
import numpy as np

from service.collections.store import IndexSpec

# A filter that keeps at most this many items, or under EXACT_FILTER_SHARE of the graph, is
# searched exactly over those items: a walk restricted to a small share of the graph visits about
# ef_search / share nodes to find its candidates (its cost grows, its recall falls). Above them
# the walk is cheaper: at 99,000 real embeddings a filter keeping a tenth cost 13 CPU ms a search
# exactly over its 9,900 items against 0.07 ms for FAISS's filtered walk at recall 0.974
# (docs/benchmarks.md); the bounds between were not tuned further.
EXACT_FILTER_BELOW = 2_000
EXACT_FILTER_SHARE = 0.01
# The graph is rebuilt once tombstones pass this share of its entries (and ``REBUILD_MIN`` of
# them): every tombstone is a node a walk still visits and then skips.
REBUILD_SHARE = 0.25
REBUILD_MIN = 1_000

Hits = list[tuple[int, float]]  # (row key, cosine), best first


class VectorIndex(Protocol):
    @property
    def count(self) -> int:
        """Live items."""

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None: ...

    def remove(self, keys: Iterable[int]) -> None: ...

    def search(self, query: np.ndarray, k: int, among: Collection[int] | None, ef_search: int | None) -> Hits:
        """The ``k`` live items of largest ``vector . query`` (only keys in ``among`` when given)."""


class ExactIndex:
    """Every vector compared (FAISS ``IndexFlatIP``), removal in place."""

    def __init__(self, dim: int) -> None:
        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    @property
    def count(self) -> int:
        return int(self.index.ntotal)

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        self.index.add_with_ids(vectors, keys)

    def remove(self, keys: Iterable[int]) -> None:
        self.index.remove_ids(np.fromiter(keys, dtype=np.int64))  # type: ignore[arg-type]

    def search(self, query: np.ndarray, k: int, among: Collection[int] | None, ef_search: int | None) -> Hits:
        params = None
        if among is not None:
            params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(np.fromiter(among, dtype=np.int64)))  # type: ignore[call-arg]
        return _searched(self.index, query, min(k, self.count), params)


class HnswIndex:
    def __init__(self, dim: int, spec: IndexSpec, index: faiss.IndexIDMap2 | None = None) -> None:
        self.dim, self.spec = dim, spec
        if index is None:
            graph = faiss.IndexHNSWFlat(dim, spec.m, faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efConstruction = spec.ef_construction
            index = faiss.IndexIDMap2(graph)
        self.index = index
        self.graph = faiss.downcast_index(index.index)
        self.dead: set[int] = set()
        # Set by every add or removal, cleared by a save: whether the file is behind.
        self.changed = False

    @property
    def count(self) -> int:
        return int(self.index.ntotal) - len(self.dead)

    def keys(self) -> np.ndarray:
        """Every key in the graph, tombstones included, in insertion order."""
        return faiss.vector_to_array(self.index.id_map)

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        self.index.add_with_ids(vectors, keys)
        self.changed = True

    def remove(self, keys: Iterable[int]) -> None:
        self.dead.update(keys)
        self.changed = True

    def needs_rebuild(self) -> bool:
        return len(self.dead) >= max(REBUILD_MIN, REBUILD_SHARE * self.index.ntotal)

    def rebuilt(self) -> HnswIndex:
        """A new graph of the live entries only (built on every core: minutes at a million)."""
        keys = self.keys()
        live = ~np.isin(keys, np.fromiter(self.dead, dtype=np.int64))
        vectors = self.graph.reconstruct_n(0, int(self.index.ntotal))[live]
        fresh = HnswIndex(self.dim, self.spec)
        with all_cores():
            fresh.add(keys[live], vectors)
        return fresh

    def search(self, query: np.ndarray, k: int, among: Collection[int] | None, ef_search: int | None) -> Hits:
        if among is not None and len(among) <= max(EXACT_FILTER_BELOW, EXACT_FILTER_SHARE * self.count):
            return self._exact_among(query, k, among)
        selector: faiss.IDSelector | None
        bitmap = None  # held while the search runs: the selector reads it in place
        if among is not None:
            # A bitmap over the row keys: building FAISS's hashed IDSelectorBatch of 100,000 keys
            # cost 5.2 CPU ms a search, the bitmap 0.3 ms.
            keys = np.fromiter(among, dtype=np.int64)
            members = np.zeros(int(keys.max()) + 1, dtype=bool)
            members[keys] = True
            bitmap = np.packbits(members, bitorder="little")
            selector = faiss.IDSelectorBitmap(bitmap)  # type: ignore[call-arg,arg-type]
        elif self.dead:
            selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(np.fromiter(self.dead, dtype=np.int64)))
        else:
            selector = None
        k = min(k, self.count if among is None else len(among))
        # The walk keeps ef_search candidates: fewer than k could not fill a page.
        ef = max(ef_search or self.spec.ef_search, k)
        params = faiss.SearchParametersHNSW(efSearch=ef, sel=selector)  # type: ignore[attr-defined]
        hits = _searched(self.index, query, k, params)
        del bitmap
        return hits

    def _exact_among(self, query: np.ndarray, k: int, among: Collection[int]) -> Hits:
        keys = np.fromiter(among, dtype=np.int64)
        if len(keys) == 0 or k <= 0:
            return []
        scores = self.index.reconstruct_batch(keys) @ np.asarray(query, dtype=np.float32)
        top = np.argsort(-scores, kind="stable")[:k]
        return [(int(keys[i]), float(scores[i])) for i in top]

    # ------------------------------------------------------------------ the file
    def save(self, path: Path) -> None:
        """Writes the graph (tombstoned entries included: the next load finds them gone from
        SQLite and tombstones them again), atomically."""
        partial = path.with_suffix(".partial")
        faiss.write_index(self.index, str(partial))
        partial.replace(path)
        self.changed = False

    @classmethod
    def load(
        cls,
        path: Path,
        dim: int,
        spec: IndexSpec,
        stored: np.ndarray,
        vectors_of: Callable[[np.ndarray], np.ndarray],
    ) -> HnswIndex:
        """The graph saved at ``path`` brought up to date with the ``stored`` row keys (the items
        SQLite holds; ``vectors_of`` reads their vectors): keys it lacks are added, keys no longer
        stored are tombstones. Without a readable file, or with one built with other knobs, a new
        graph of every stored item (on every core)."""
        index = None
        if path.exists():
            try:
                read = faiss.read_index(str(path))
            except RuntimeError:  # cut short or damaged: built anew from SQLite
                read = None
            if isinstance(read, faiss.IndexIDMap2) and _fits(read, dim, spec):
                index = read
        out = cls(dim, spec, index)
        held = out.keys()
        missing = np.setdiff1d(stored, held, assume_unique=True)
        out.dead = set(np.setdiff1d(held, stored, assume_unique=True).tolist())
        with all_cores():
            for start in range(0, len(missing), 10_000):
                chunk = missing[start : start + 10_000]
                out.add(chunk, vectors_of(chunk))
        out.changed = len(missing) > 0 or index is None
        return out


def _fits(index: faiss.IndexIDMap2, dim: int, spec: IndexSpec) -> bool:
    if index.d != dim:
        return False
    graph = faiss.downcast_index(index.index)
    return (
        isinstance(graph, faiss.IndexHNSWFlat)
        and graph.metric_type == faiss.METRIC_INNER_PRODUCT
        and graph.hnsw.efConstruction == spec.ef_construction
        # FAISS keeps 2 m links a node on the ground layer, m on the ones above.
        and graph.hnsw.nb_neighbors(1) == spec.m  # type: ignore[attr-defined]
    )


def _searched(index: faiss.Index, query: np.ndarray, k: int, params: faiss.SearchParameters | None) -> Hits:
    if k <= 0:
        return []
    q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
    scores, found = index.search(q, k, params=params)
    return [(int(key), float(s)) for key, s in zip(found[0], scores[0], strict=True) if key >= 0]


class all_cores:  # noqa: N801 - used as a ``with`` statement
    """FAISS on every core for a bulk build (its OpenMP setting is per thread), then back to one
    (``EmbeddedCollections._use``: a single query gains nothing from more)."""

    def __enter__(self) -> None:
        faiss.omp_set_num_threads(os.cpu_count() or 1)

    def __exit__(self, *exc: object) -> None:
        faiss.omp_set_num_threads(1)
