"""Content-addressed local cache of store blobs, keyed by their sha256.

An object-store backend reads weights through it: a blob is downloaded once per
machine, its digest checked while it streams in, and only then admitted under
``blobs/<sha256>``, so a restarted pod (or a second process on the same node)
finds its weights without another download. Admission is a ``rename(2)`` of a
fully written, fsynced file, so concurrent fillers of the same digest are safe:
the last one wins with identical bytes. Nothing is ever evicted; bound the
directory with the volume that holds it (an ``emptyDir`` with a ``sizeLimit``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from pathlib import Path

from model_store.backends.base import Readable, iter_chunks

SHA256_HEX_LENGTH = 64


def is_sha256(value: str) -> bool:
    return len(value) == SHA256_HEX_LENGTH and all(c in "0123456789abcdef" for c in value)


class BlobCache:
    """``blobs/<sha256>`` files under ``root``; ``hits``/``fills`` count lookups that found or fetched one."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.tmp = self.root / "tmp"
        self.hits = 0
        self.fills = 0
        self.rejected = 0
        self._counter_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BlobCache({str(self.root)!r})"

    def temp_path(self) -> Path:
        """A fresh path on the cache's filesystem (so admitting it is a rename)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        return self.tmp / f"{secrets.token_hex(8)}.part"

    def get(self, sha256: str) -> Path | None:
        """Path of the cached blob with this digest, counting a hit, or None."""
        if not is_sha256(sha256):
            return None
        path = self.blobs / sha256
        if not path.is_file():
            return None
        with self._counter_lock:
            self.hits += 1
        return path

    def download(self, stream: Readable) -> tuple[Path, str]:
        """Write ``stream`` to a temporary file (fsynced); return it and its sha256."""
        path = self.temp_path()
        digest = hashlib.sha256()
        try:
            with path.open("xb") as out:
                for chunk in iter_chunks(stream):
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path, digest.hexdigest()

    def admit(self, temp: Path, claimed: str, actual: str) -> Path | None:
        """Move a downloaded file in as ``blobs/<claimed>`` if its digest matches; else leave it.

        Returns the cached path, or None when the content does not match its claim (the
        caller still owns ``temp`` then, and may read it to report the mismatch).
        """
        if not is_sha256(claimed) or claimed != actual:
            with self._counter_lock:
                self.rejected += 1
            return None
        self.blobs.mkdir(parents=True, exist_ok=True)
        target = self.blobs / claimed
        temp.chmod(0o444)  # local trees hard-link these: a stray write must not corrupt the cache
        os.replace(temp, target)
        with self._counter_lock:
            self.fills += 1
        return target
