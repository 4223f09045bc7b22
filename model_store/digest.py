"""SHA-256 helpers that stream, so multi-gigabyte weights never sit in memory."""

from __future__ import annotations

import hashlib

from model_store.backends.base import Readable, iter_chunks


class HashingReader:
    """File-like wrapper that hashes and counts everything read through it.

    Publishing hashes the *source* while the backend copies it, then re-reads the
    staged copy; comparing the two catches corruption introduced by the copy.
    """

    def __init__(self, stream: Readable) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.nbytes = 0

    def read(self, size: int = -1, /) -> bytes:
        chunk = self._stream.read(size)
        self._hash.update(chunk)
        self.nbytes += len(chunk)
        return chunk

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def sha256_stream(stream: Readable) -> tuple[str, int]:
    """Return ``(hex sha256, byte count)`` of the rest of ``stream``."""
    digest = hashlib.sha256()
    total = 0
    for chunk in iter_chunks(stream):
        digest.update(chunk)
        total += len(chunk)
    return digest.hexdigest(), total
