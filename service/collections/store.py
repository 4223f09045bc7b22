"""What every collection backend offers, and the backend a ``collections.url`` names.

Calls are synchronous (the routes run them in a worker thread) and take and return plain values:
the embedded backend (``embedded.py``: SQLite + FAISS) and the PostgreSQL + pgvector one
(``postgres.py``: the same calls in SQL) implement them alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import unquote, urlparse

import numpy as np

from clipcore.errors import ClipError, ErrorCode

# A metadata value and a filter value: JSON scalars (equality is exact, type included).
Scalar = str | int | float | bool
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
METADATA_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_POSTGRES_SCHEMES = ("postgresql", "postgres")


IndexKind = Literal["exact", "hnsw"]


@dataclass(frozen=True)
class IndexSpec:
    """How a collection's first stage searches: ``exact`` compares every vector; ``hnsw`` walks
    an HNSW graph of ``m`` links a node (``2 m`` on its ground layer), built with
    ``ef_construction`` candidates an insert and searched with ``ef_search`` (a request may set
    its own). The names and bounds are pgvector's."""

    kind: IndexKind = "exact"
    m: int = 32
    ef_construction: int = 128
    ef_search: int = 100

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "m": self.m, "ef_construction": self.ef_construction, "ef_search": self.ef_search}

    @classmethod
    def from_json(cls, value: object) -> IndexSpec:
        """As kept in a collection's info (a file from before indexes were chosen has none: exact)."""
        if not isinstance(value, dict):
            return cls()
        return cls(**value)


EXACT = IndexSpec()


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    model: str  # the served-set entry it was created on, as configured (``default@production``)
    version: str  # the version whose embeddings it holds (``v6``)
    dim: int
    dense: bool  # whether it stores DCSM image tokens (the version has a DCSM component)
    count: int
    created_at: str
    index: IndexSpec = EXACT


@dataclass(frozen=True)
class NewItem:
    id: str
    metadata: Mapping[str, Scalar]
    vector: np.ndarray  # (D,) L2-normalised image embedding
    dense: np.ndarray | None  # (1+P, D) DCSM image tokens, when the collection stores them
    image: str | None = None  # sha256 of the image's bytes, kept in the image files (re-embedding reads them)


@dataclass(frozen=True)
class StoredImage:
    id: str
    metadata: dict[str, Scalar]
    image: str | None  # sha256 of its bytes; None for an item added before images were kept


class JobLease(Protocol):
    """This server's right to run a collection's job (``CollectionStore.claim_job``): one holder at
    a time, among every server sharing the store."""

    def holds(self) -> bool:
        """Whether it is still held (checked before each batch: a lease lost, the job stops)."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class StoredHit:
    id: str
    metadata: dict[str, Scalar]
    cosine: float  # vector . query
    vector: np.ndarray


class CollectionStore(Protocol):
    def create(
        self, name: str, model: str, version: str, dim: int, dense: bool, index: IndexSpec | None = None
    ) -> CollectionInfo:
        """A new empty collection; ``collection_exists`` if the name is taken. ``index`` left out:
        the backend's default."""

    def list_all(self) -> list[CollectionInfo]: ...

    def info(self, name: str) -> CollectionInfo:
        """``unknown_collection`` if there is none of that name."""

    def drop(self, name: str) -> None: ...

    def upsert(self, name: str, items: Sequence[NewItem]) -> int:
        """Add items, replacing those whose id exists (an id twice in ``items``: the last one);
        returns how many items it holds now."""

    def remove(self, name: str, item_id: str) -> bool:
        """Whether the item was there."""

    def search(
        self, name: str, query: np.ndarray, k: int, where: Mapping[str, Scalar], ef_search: int | None = None
    ) -> list[StoredHit]:
        """The ``k`` items of largest ``vector . query`` among those whose metadata has every
        ``where`` key equal to its value, best first: exact, or through the collection's
        approximate index (``ef_search`` its breadth, left out: the collection's), whose scores
        are still the exact cosines of the items it found."""

    def dense_tokens(self, name: str, ids: Sequence[str]) -> list[np.ndarray]:
        """The stored DCSM image tokens of these items, in order."""

    # A re-embedding (``service.collections.jobs``) builds the new version's items beside the
    # collection, which keeps answering, and replaces them at once when complete.
    def stored_images(self, name: str) -> list[StoredImage]:
        """Every item's id, metadata and image digest, in the order they were added."""

    def stage(self, name: str, version: str, dim: int, dense: bool) -> None:
        """An empty staged copy of the collection for ``version`` (replacing one staged before)."""

    def upsert_staged(self, name: str, items: Sequence[NewItem]) -> int:
        """``upsert`` into the staged copy; returns how many items it holds."""

    def commit_staged(self, name: str) -> CollectionInfo:
        """Replaces the collection by its staged copy, atomically: a search sees the old version's
        items or the new one's, never some of each."""

    def discard_staged(self, name: str) -> None: ...

    def staged_images(self, name: str) -> tuple[str, list[StoredImage]] | None:
        """The staged copy's version and items (``stored_images`` of it), or None if there is none:
        a re-embedding taken up after a restart goes on from them."""

    # A running job's record (a re-embedding, an import), kept with the collection so that a
    # server that stopped (or was killed) takes it up again at start-up: ``commit_staged`` and
    # ``drop`` remove it.
    def save_job(self, name: str, job: Mapping[str, object] | None) -> None:
        """Keep ``job`` (JSON values) as the collection's running job, or remove it (None)."""

    def saved_jobs(self) -> dict[str, dict[str, object]]:
        """Every collection's kept job record, by collection name (cheap: no index is loaded)."""

    def saved_job(self, name: str) -> dict[str, object] | None:
        """The collection's kept job record, if it has one."""

    def claim_job(self, name: str) -> JobLease | None:
        """The lease to run the collection's job, or None while another server holds it. A server
        that dies loses it by itself (its database session ends): another takes the job up."""

    def close(self) -> None: ...


def check_name(name: str, field: str = "name") -> str:
    if not _NAME.match(name):
        raise ClipError(
            ErrorCode.bad_input,
            f"collection names are 1-64 characters of a-z, 0-9, '_' and '-', starting with a letter or digit; "
            f"got {name[:80]!r}",
            field,
        )
    return name


def unknown(name: str) -> ClipError:
    return ClipError(ErrorCode.unknown_collection, f"no collection named {name!r}", "name")


def collections_path(url: str) -> Path:
    """The folder of a ``file:`` URL: ``file:///var/lib/clip/collections`` (absolute) or
    ``file:collections`` (relative to the working directory)."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        raise ValueError(
            f"collections.url must be a file: URL (file:///var/lib/clip/collections) or a postgresql:// one; scheme "
            f"{parsed.scheme or '(none)'!r} is not supported"
        )
    if parsed.netloc not in ("", "localhost"):
        raise ValueError("collections.url: a file: URL names a local folder (file:///path), not a host")
    path = unquote(parsed.path)
    if not path:
        raise ValueError("collections.url: the file: URL names no folder")
    return Path(path)


def is_postgres(url: str) -> bool:
    return urlparse(url).scheme in _POSTGRES_SCHEMES


def check_url(url: str) -> None:
    """Refuse at start-up a ``collections.url`` no backend takes (``ValueError``)."""
    if is_postgres(url):
        from service.collections.postgres import parse_url

        parse_url(url)
    else:
        collections_path(url)


def open_collections(url: str) -> CollectionStore:
    """The backend ``url`` names (checked by the settings at start-up): ``file:`` the embedded
    store, ``postgresql://`` PostgreSQL with pgvector."""
    if is_postgres(url):
        from service.collections.postgres import PostgresCollections, parse_url

        return PostgresCollections(parse_url(url))
    from service.collections.embedded import EmbeddedCollections

    return EmbeddedCollections(collections_path(url))
