"""Local-filesystem storage backend (also used for shared volumes in Kubernetes).

Atomicity comes from ``rename(2)`` within one filesystem; durability from
fsyncing files before renaming them and directories after, so a crash leaves
either the old state or the new one, never a torn version or alias table.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from model_store.backends.base import COMMIT_MARKER, TRASH_PREFIX, Readable, iter_chunks
from model_store.errors import WriteConflict


def fsync_dir(path: Path) -> None:
    """Persist directory entries (creations, renames) of ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBackend:
    """``StorageBackend`` over a directory tree rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        # Names are validated by the store; this is a second line of defence.
        parts = PurePosixPath(key).parts
        if not key or key.startswith("/") or any(p in ("..", ".") for p in parts):
            raise ValueError(f"unsafe storage key {key!r}")
        return self.root.joinpath(*parts)

    def is_file(self, key: str) -> bool:
        return self._path(key).is_file()

    def is_dir(self, key: str) -> bool:
        return self._path(key).is_dir()

    def list_dir(self, key: str) -> list[str]:
        path = self._path(key) if key else self.root
        try:
            return sorted(entry.name for entry in path.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def mtime(self, key: str) -> float:
        path = self._path(key)
        stamp = path.stat().st_mtime
        if path.is_dir():
            # A folder's own mtime only moves when entries are added to it, not while a file in it
            # (or in a subfolder) is written: its most recent write is the newest stamp under it,
            # as for a prefix on object storage.
            for sub in path.rglob("*"):
                try:
                    stamp = max(stamp, sub.lstat().st_mtime)
                except FileNotFoundError:  # removed meanwhile
                    continue
        return stamp

    @contextmanager
    def open_read(self, key: str) -> Iterator[BinaryIO]:
        with self._path(key).open("rb") as fh:
            yield fh

    def read_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def put(self, key: str, stream: Readable) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with path.open("xb") as out:
            for chunk in iter_chunks(stream):
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        return written

    def put_atomic(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
        try:
            with tmp.open("xb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)

    def _tag(self, path: Path) -> str | None:
        # A replace is a rename of a new file, so the inode changes even within one mtime tick.
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"

    def read_tagged(self, key: str) -> tuple[bytes, str]:
        path = self._path(key)
        with path.open("rb") as fh:  # the tag of the file that was read, even if replaced meanwhile
            st = os.fstat(fh.fileno())
            return fh.read(), f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"

    def put_atomic_if(self, key: str, data: bytes, tag: str | None) -> None:
        # Check-then-rename is only safe because callers hold the model's flock, which (unlike an S3
        # lease) cannot be lost while held; the check catches writers that bypass the lock.
        if self._tag(self._path(key)) != tag:
            raise WriteConflict(f"{key} changed since it was read; nothing was written")
        self.put_atomic(key, data)

    def commit_dir(self, src: str, dst: str) -> None:
        src_path, dst_path = self._path(src), self._path(dst)
        # rename(2) silently replaces an *empty* target dir, so check explicitly;
        # callers hold the model lock, which makes check-then-rename safe.
        if dst_path.exists():
            raise FileExistsError(dst)
        for sub in [src_path, *(p for p in src_path.rglob("*") if p.is_dir())]:
            fsync_dir(sub)
        dst_path.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src_path, dst_path)
        fsync_dir(dst_path.parent)
        if src_path.parent != dst_path.parent:
            fsync_dir(src_path.parent)

    def delete_tree(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir() and not path.is_symlink():
            if (path / COMMIT_MARKER).is_file():  # one rename hides it; rmtree is file by file
                hidden = path.with_name(f"{TRASH_PREFIX}{path.name}-{secrets.token_hex(4)}")
                os.rename(path, hidden)
                fsync_dir(path.parent)
                path = hidden
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    @contextmanager
    def lock(self, key: str, break_existing: bool = False) -> Iterator[None]:
        # flock: the kernel releases a holder's lock when its process dies (even by SIGKILL), so a
        # dead writer never blocks the next. A live holder's cannot be broken: ``break_existing``
        # waits for it like any writer.
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            # Closing the descriptor releases the flock.
            os.close(fd)

    def local_path(self, key: str) -> Path:
        return self._path(key) if key else self.root
