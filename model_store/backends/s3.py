"""S3-compatible object-store backend (AWS S3, SeaweedFS, MinIO) over boto3.

Keys map to ``<prefix>/<key>`` in one bucket. Object stores have no rename and no
directories, so the guarantees of ``LocalBackend`` are rebuilt from what S3 does promise
(read-after-write on every key, atomic whole-object PUTs, conditional writes):

* a committed prefix becomes visible through one marker object (``manifest.json``),
  copied last by ``commit_dir`` with ``If-None-Match: *``: readers key on it, so they
  see a version whole or not at all, and an existing version is never replaced. The
  source's marker is deleted first, so a version moved to the trash vanishes at once;
* ``put_atomic`` is one PUT (readers see the old or the new object); ``put_atomic_if`` is one
  PUT with ``If-Match`` on the ETag read (``If-None-Match: *`` for a new key), so a writer whose
  lease ran out while it stalled cannot overwrite what the lock's next holder wrote;
* ``lock`` is a leased lock object taken with conditional writes (``s3_lease``): taken over at once
  from a holder proven dead on this machine, else when its lease runs out, or on request.

Readers never rely on listings for correctness: whether a version exists is a HEAD of
its marker. Listings are used to enumerate (models, versions, a version's files) and
SeaweedFS may show a prefix whose objects are all gone, so a prefix counts only when an
object lies under it.

Every blob written carries its sha256 as user metadata; reads of such blobs go through a
``BlobCache`` on local disk, so weights are downloaded once per machine, digest-checked
on the way in. ``local_path`` materialises keys into a local tree of hard links into
that cache for loaders that need files (safetensors).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Concatenate, ParamSpec, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from model_store.backends.base import COMMIT_MARKER, Readable, iter_chunks
from model_store.backends.blob_cache import BlobCache
from model_store.backends.s3_lease import (
    CONFLICT_CODES,
    DEFAULT_LEASE_S,
    DEFAULT_WAIT_S,
    MISSING_CODES,
    ObjectLease,
    error_code,
)
from model_store.digest import HashingReader
from model_store.errors import StoreUnavailable, WriteConflict

log = logging.getLogger("model_store.s3")

SHA256_META = "sha256"
SPOOL_IN_MEMORY = 8 << 20  # blobs larger than this are spooled to disk before upload
DELETE_BATCH = 1000  # DeleteObjects limit

P = ParamSpec("P")
R = TypeVar("R")


def translated(method: Callable[Concatenate[S3Backend, P], R]) -> Callable[Concatenate[S3Backend, P], R]:
    """Turn S3 client failures into ``StoreUnavailable`` (an ``OSError``: it may pass), naming the
    store URL and the server's error code, never the endpoint's credentials."""

    @functools.wraps(method)
    def wrapper(self: S3Backend, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise StoreUnavailable(f"{self.url}: {error.get('Code')}: {error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc

    return wrapper


@contextmanager
def _opened(path: Path, owned: bool) -> Iterator[BinaryIO]:
    try:
        with path.open("rb") as fh:
            yield fh
    finally:
        if owned:
            path.unlink(missing_ok=True)


class S3Backend:
    """``StorageBackend`` over ``s3://bucket/prefix``; ``cache_dir`` holds the blob cache and local trees."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        cache_dir: str | os.PathLike[str],
        client: Any,
        lease_s: float = DEFAULT_LEASE_S,
        lock_wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        self.cache = BlobCache(cache_dir)
        self.trees = Path(cache_dir) / "trees" / bucket / (self.prefix or "_root")
        self.lease_s = lease_s
        self.lock_wait_s = lock_wait_s  # how long a writer waits for the lock before giving up

    def __repr__(self) -> str:  # no endpoint or credentials: this ends up in logs
        return f"S3Backend('{self.url}')"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    # ------------------------------------------------------------------ keys
    def _key(self, key: str) -> str:
        parts = PurePosixPath(key).parts
        if not key or key.startswith("/") or key.endswith("/") or any(p in ("..", ".") for p in parts):
            raise ValueError(f"unsafe storage key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _dir(self, key: str) -> str:
        """Object-key prefix of everything under ``key`` (``""`` is the store root)."""
        if not key:
            return f"{self.prefix}/" if self.prefix else ""
        return self._key(key) + "/"

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return head
        except ClientError as exc:
            if error_code(exc) in MISSING_CODES:
                return None
            raise

    def _objects(self, key: str) -> Iterator[dict[str, Any]]:
        """Every object under prefix ``key`` (recursive), as ``list_objects_v2`` entries."""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._dir(key)):
            yield from page.get("Contents", [])

    def _has_objects(self, full_prefix: str) -> bool:
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=full_prefix, MaxKeys=1)
        return bool(page.get("Contents"))

    def _relative(self, full_key: str) -> str:
        return full_key[len(self._dir("")) :]

    # ------------------------------------------------------------------ reading
    @translated
    def is_file(self, key: str) -> bool:
        return self._head(key) is not None

    @translated
    def is_dir(self, key: str) -> bool:
        return self._has_objects(self._dir(key))

    @translated
    def list_dir(self, key: str) -> list[str]:
        base = self._dir(key)
        names: set[str] = set()
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"):
            names.update(obj["Key"][len(base) :] for obj in page.get("Contents", []))
            for common in page.get("CommonPrefixes", []):
                # SeaweedFS keeps listing emptied "folders": count a prefix only with objects under it.
                if self._has_objects(common["Prefix"]):
                    names.add(common["Prefix"][len(base) :].rstrip("/"))
        names.discard("")
        return sorted(names)

    @translated
    def mtime(self, key: str) -> float:
        head = self._head(key)
        if head is not None:
            return float(head["LastModified"].timestamp())
        # A prefix: its most recent write (a staging area is stale once nothing was added for a while).
        stamps = [obj["LastModified"].timestamp() for obj in self._objects(key)]
        if not stamps:
            raise FileNotFoundError(key)
        return float(max(stamps))

    def _get(self, key: str) -> dict[str, Any]:
        try:
            response: dict[str, Any] = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return response
        except ClientError as exc:
            if error_code(exc) in MISSING_CODES:
                raise FileNotFoundError(key) from None
            raise

    @translated
    def read_bytes(self, key: str) -> bytes:
        body = self._get(key)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def open_read(self, key: str) -> AbstractContextManager[BinaryIO]:
        return _opened(*self._local_file(key))

    @translated
    def _local_file(self, key: str) -> tuple[Path, bool]:
        """The blob as a local file (from the cache when its digest is there) and whether it is temporary."""
        head = self._head(key)
        if head is None:
            raise FileNotFoundError(key)
        cached = self.cache.get(head.get("Metadata", {}).get(SHA256_META, ""))
        return (cached, False) if cached is not None else self._fetch(key)

    def _fetch(self, key: str) -> tuple[Path, bool]:
        """Download ``key``; return a local file and whether the caller owns (must delete) it.

        A blob whose content matches the sha256 it was written with is admitted to the cache;
        one that does not (replaced behind the store's back) is handed over as downloaded,
        so verification reports the mismatch instead of the cache hiding it.
        """
        response = self._get(key)
        claimed = response.get("Metadata", {}).get(SHA256_META, "")
        try:
            temp, actual = self.cache.download(response["Body"])
        finally:
            response["Body"].close()
        admitted = self.cache.admit(temp, claimed, actual)
        return (admitted, False) if admitted is not None else (temp, True)

    # ------------------------------------------------------------------ writing
    @translated
    def put(self, key: str, stream: Readable) -> int:
        # The digest must travel in the PUT's headers, so the blob is hashed before it is sent.
        self.cache.tmp.mkdir(parents=True, exist_ok=True)
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY, dir=str(self.cache.tmp)) as spool:
            reader = HashingReader(stream)
            for chunk in iter_chunks(reader):
                spool.write(chunk)
            spool.seek(0)
            self.client.upload_fileobj(
                spool,
                self.bucket,
                self._key(key),
                ExtraArgs={"Metadata": {SHA256_META: reader.hexdigest()}},
            )
        return reader.nbytes

    @translated
    def put_atomic(self, key: str, data: bytes) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=data, Metadata={SHA256_META: hashlib.sha256(data).hexdigest()}
        )

    @translated
    def read_tagged(self, key: str) -> tuple[bytes, str]:
        response = self._get(key)
        body = response["Body"]
        try:
            return bytes(body.read()), str(response["ETag"])
        finally:
            body.close()

    @translated
    def put_atomic_if(self, key: str, data: bytes, tag: str | None) -> None:
        condition = {"IfMatch": tag} if tag is not None else {"IfNoneMatch": "*"}
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                Metadata={SHA256_META: hashlib.sha256(data).hexdigest()},
                **condition,
            )
        except ClientError as exc:
            if error_code(exc) in CONFLICT_CODES | MISSING_CODES:  # MISSING: If-Match on a deleted key
                raise WriteConflict(f"{self.url}/{key} changed since it was read; nothing was written") from None
            raise

    def _copy(self, src_key: str, dst_key: str) -> None:
        # Server-side copy (multipart above the transfer threshold); user metadata travels along.
        self.client.copy({"Bucket": self.bucket, "Key": src_key}, self.bucket, dst_key)

    @translated
    def commit_dir(self, src: str, dst: str) -> None:
        # Callers hold the model lock, so nobody else commits to dst meanwhile.
        marker = f"{dst}/{COMMIT_MARKER}"
        if self._head(marker) is not None:
            raise FileExistsError(dst)
        # Objects under dst without a marker are leftovers of an interrupted commit: invisible,
        # so they may go.
        self.delete_tree(dst)
        objects = list(self._objects(src))
        if not objects:
            raise FileNotFoundError(src)
        src_marker = self._key(f"{src}/{COMMIT_MARKER}")
        src_base, dst_base = self._dir(src), self._dir(dst)
        has_marker = any(obj["Key"] == src_marker for obj in objects)
        if has_marker:  # the source disappears for readers before anything else changes
            marker_bytes = self.read_bytes(f"{src}/{COMMIT_MARKER}")
            marker_meta = self._head(f"{src}/{COMMIT_MARKER}") or {}
            self.client.delete_object(Bucket=self.bucket, Key=src_marker)
        for obj in objects:
            if obj["Key"] != src_marker:
                self._copy(obj["Key"], dst_base + obj["Key"][len(src_base) :])
        if has_marker:
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self._key(marker),
                    Body=marker_bytes,
                    Metadata=marker_meta.get("Metadata", {}),
                    IfNoneMatch="*",
                )
            except ClientError as exc:
                if error_code(exc) in {"PreconditionFailed", "412"}:
                    raise FileExistsError(dst) from None
                raise
        self.delete_tree(src)

    @translated
    def delete_tree(self, key: str) -> None:
        keys = [obj["Key"] for obj in self._objects(key)]
        if self._head(key) is not None:
            keys.append(self._key(key))
        marker = self._key(f"{key}/{COMMIT_MARKER}")
        if marker in keys:  # readers stop seeing a version before its files go
            keys.remove(marker)
            self.client.delete_object(Bucket=self.bucket, Key=marker)
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": k} for k in keys[start : start + DELETE_BATCH]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        self._abort_uploads(self._dir(key))

    def _abort_uploads(self, full_prefix: str) -> None:
        """Abort the multipart uploads under ``full_prefix`` that never completed: a writer killed
        in the middle of a large file leaves its parts stored (and billed) but in no listing.

        Best effort: a credential allowed to delete objects may lack
        ``s3:ListBucketMultipartUploads`` or ``s3:AbortMultipartUpload``, and that must not stop
        a delete (a bucket lifecycle rule can clear such parts instead)."""
        try:
            paginator = self.client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                for upload in page.get("Uploads", []):
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except ClientError as exc:
                        if error_code(exc) != "NoSuchUpload":  # completed or aborted meanwhile
                            raise
        except ClientError as exc:
            if error_code(exc) not in {"AccessDenied", "NotImplemented"}:
                raise
            log.warning("%s: incomplete uploads under %s left in place (%s)", self.url, full_prefix, error_code(exc))

    @contextmanager
    def lock(self, key: str, break_existing: bool = False) -> Iterator[None]:
        try:
            lease = ObjectLease(
                self.client, self.bucket, self._key(key), lease_s=self.lease_s, wait_s=self.lock_wait_s,
                break_existing=break_existing,
            )  # fmt: skip
            with lease:
                yield
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"{self.url}: lock {key}: {exc}") from exc

    # ------------------------------------------------------------------ local files
    @translated
    def local_path(self, key: str) -> Path:
        """A local copy of ``key`` (a blob or everything under a prefix), refreshed on each call.

        Files are hard links into the blob cache (blobs without a recorded digest are plain
        copies), so a version on a warm node materialises without downloading anything.
        ``""`` only names the tree root: the whole store is never copied.
        """
        if not key:
            self.trees.mkdir(parents=True, exist_ok=True)
            return self.trees
        target = self.trees.joinpath(*PurePosixPath(key).parts)
        objects = list(self._objects(key))  # a version folder: one listing, no HEAD of the folder's name
        if not objects and (head := self._head(key)) is not None:
            self._materialise(key, target, head)
            return target
        wanted: set[Path] = set()
        for obj in objects:
            relative = self._relative(obj["Key"])
            path = self.trees.joinpath(*PurePosixPath(relative).parts)
            self._materialise(relative, path)
            wanted.add(path)
        if target.is_dir():  # files removed from the store (annexes) leave the local copy too
            for path in target.rglob("*"):
                if path.is_file() and path not in wanted:
                    path.unlink()
        return target

    def _materialise(self, key: str, path: Path, head: dict[str, Any] | None = None) -> None:
        head = head or self._head(key)  # the digest that keys the cache is user metadata: not in a listing
        if head is None:
            raise FileNotFoundError(key)
        source = self.cache.get(head.get("Metadata", {}).get(SHA256_META, ""))
        owned = False
        if source is None:
            source, owned = self._fetch(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not owned and path.exists() and path.stat().st_ino == source.stat().st_ino:
            return
        temp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
        if owned:
            os.replace(source, temp)
        else:
            os.link(source, temp)
        os.replace(temp, path)
