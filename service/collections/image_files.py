"""The bytes of every image a collection holds, kept so that a new model version can embed them again.

One file per distinct image of a collection, named by the SHA-256 of its bytes
(``<folder>/<collection>.images/ab/abcdef...``): adding the same picture twice (under two ids,
or again) keeps one file. A file is written whole (a temporary name, then a rename), before the
item that names it is stored, so an item never names a missing file. Files no item names any more
(its item removed or replaced) are deleted when the collection is re-embedded or dropped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from clipcore.errors import ClipError, ErrorCode
from service.collections.store import check_name


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ImageFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _folder(self, name: str) -> Path:
        return self.root / f"{check_name(name)}.images"

    def _file(self, name: str, sha256: str) -> Path:
        return self._folder(name) / sha256[:2] / sha256

    def put(self, name: str, images: Iterable[bytes]) -> list[str]:
        """Keeps each image's bytes (once per distinct image); returns their digests, in order."""
        out = []
        try:
            for data in images:
                sha = digest(data)
                path = self._file(name, sha)
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".part-", delete=False) as tmp:
                        tmp.write(data)
                    os.replace(tmp.name, path)
                out.append(sha)
        except OSError as exc:
            raise ClipError(
                ErrorCode.not_ready, f"the collection image folder {str(self.root)!r} cannot be written: {exc}"
            ) from exc
        return out

    def get(self, name: str, sha256: str) -> bytes:
        try:
            return self._file(name, sha256).read_bytes()
        except FileNotFoundError:
            raise ClipError(
                ErrorCode.not_found, f"collection {name!r} lost the bytes of image {sha256} (its file is missing)"
            ) from None

    def keep_only(self, name: str, wanted: set[str]) -> int:
        """Deletes the files of images no item names; returns how many."""
        folder = self._folder(name)
        removed = 0
        if folder.is_dir():
            for path in folder.glob("*/*"):
                if path.name not in wanted:
                    path.unlink(missing_ok=True)
                    removed += 1
        return removed

    def drop(self, name: str) -> None:
        shutil.rmtree(self._folder(name), ignore_errors=True)
