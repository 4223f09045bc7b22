"""Blob I/O contract for the model store.

The store speaks in ``/``-separated keys relative to its root
(``clip/versions/v3/model.safetensors``); a backend maps keys to storage. Only
durability and atomicity primitives live here, never registry logic, so an
object-store backend can be added without touching ``ModelStore``:

* ``put`` writes a blob durably (it is only ever used inside a private staging
  prefix, so it need not be atomic);
* ``put_atomic`` replaces a small blob so readers see the old or the new content;
  ``read_tagged`` / ``put_atomic_if`` do the same only if nobody replaced it since it was read
  (a compare-and-swap: what keeps a writer whose lock was lost from overwriting the alias table);
* ``commit_dir`` publishes a fully staged prefix in one step and refuses to
  overwrite an existing one (versions are immutable);
* ``delete_tree`` hides a committed prefix from readers before removing it;
* ``lock`` serialises writers of one model (alias updates, version commits); a dead holder's lock
  is taken over, and ``break_existing`` takes a live one's for emergencies where possible.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

COMMIT_MARKER = "manifest.json"  # the blob whose presence makes a committed prefix (a version) visible
TRASH_PREFIX = ".trash-"  # a committed folder being deleted from a local disk is renamed to this first


class Readable(Protocol):
    """Anything with ``read(size)``: open files, ``BytesIO``, hashing wrappers."""

    def read(self, size: int = -1, /) -> bytes: ...


@runtime_checkable
class StorageBackend(Protocol):
    """Minimal storage operations the model store needs."""

    def is_file(self, key: str) -> bool:
        """Whether a blob exists at ``key`` (one request on object storage)."""
        ...

    def is_dir(self, key: str) -> bool:
        """Whether ``key`` is a prefix (directory) rather than a blob."""
        ...

    def list_dir(self, key: str) -> list[str]:
        """Names of the direct children of prefix ``key`` (``""`` is the root; empty if absent)."""
        ...

    def mtime(self, key: str) -> float:
        """Last modification time (POSIX seconds) of ``key``; of a prefix, its most recent write."""
        ...

    def open_read(self, key: str) -> AbstractContextManager[BinaryIO]:
        """Open a blob for streaming reads; raises ``FileNotFoundError`` if absent."""
        ...

    def read_bytes(self, key: str) -> bytes:
        """Whole content of a small blob; raises ``FileNotFoundError`` if absent."""
        ...

    def put(self, key: str, stream: Readable) -> int:
        """Durably write ``stream`` to ``key``, creating parents; return bytes written."""
        ...

    def put_atomic(self, key: str, data: bytes) -> None:
        """Durably replace ``key`` with ``data`` so no reader sees a partial blob."""
        ...

    def read_tagged(self, key: str) -> tuple[bytes, str]:
        """Content of a small blob and a tag that changes whenever the blob is replaced (an ETag);
        raises ``FileNotFoundError`` if absent."""
        ...

    def put_atomic_if(self, key: str, data: bytes, tag: str | None) -> None:
        """``put_atomic`` only if ``key`` still carries ``tag`` (``None``: only if it does not exist);
        otherwise raise ``WriteConflict`` and write nothing."""
        ...

    def commit_dir(self, src: str, dst: str) -> None:
        """Atomically move prefix ``src`` to ``dst``; ``FileExistsError`` if ``dst`` exists."""
        ...

    def delete_tree(self, key: str) -> None:
        """Remove ``key`` and everything under it; missing keys are ignored. A committed prefix
        (one holding ``COMMIT_MARKER``) disappears for readers before anything else goes, so
        nobody loads a half-deleted version; what an interruption leaves is invisible (a
        ``TRASH_PREFIX`` folder, or files without their marker) and the store's ``gc`` clears it."""
        ...

    def lock(self, key: str, break_existing: bool = False) -> AbstractContextManager[None]:
        """Exclusive, blocking, inter-process lock named by ``key``. A holder that died releases it
        (at once where its death can be told, else when its lease runs out); ``break_existing``
        takes it from a live holder where the backend can (for emergencies: the holder's later
        conditional writes fail instead of overwriting)."""
        ...

    def local_path(self, key: str) -> Path:
        """Local filesystem path of ``key`` for loaders that need one (e.g. safetensors mmap)."""
        ...


def iter_chunks(stream: Readable, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """Yield ``stream`` in fixed-size chunks so large weights are never held in memory."""
    while chunk := stream.read(chunk_size):
        yield chunk
