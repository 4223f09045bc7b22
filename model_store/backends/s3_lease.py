"""An exclusive lock held as one object in a bucket, with a lease that a heartbeat renews.

S3 has no ``flock``; conditional writes give the same mutual exclusion. A writer takes the
lock by creating the lock object with ``If-None-Match: *`` (the server refuses a second
creator with 412), renews it every third of the lease with ``If-Match: <its ETag>``, and
releases it with a conditional delete. A holder that died stops renewing: once the object's
``LastModified`` (set by the server) is older than the lease, a waiter takes it over with
``If-Match`` on the stale ETag, so only one waiter can win even then. This relies on the
server honouring conditional ``PutObject``/``DeleteObject`` (AWS S3, SeaweedFS, MinIO do)
and on clocks within a few seconds of the server's (NTP), against a lease of a minute.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import socket
import threading
import time
from typing import Any

from botocore.exceptions import ClientError

from model_store.errors import StoreError

log = logging.getLogger("model_store.s3")

DEFAULT_LEASE_S = 60.0
DEFAULT_WAIT_S = 600.0
# Error codes meaning "someone else's write won the condition": wait and try again.
CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class ObjectLease:
    """One acquisition of the lock object ``key`` in ``bucket``; use as a context manager."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        lease_s: float = DEFAULT_LEASE_S,
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.client, self.bucket, self.key = client, bucket, key
        self.lease_s, self.wait_s = lease_s, wait_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
        self.etag: str | None = None
        self.lost = False
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._etag_lock = threading.Lock()

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "lease_s": self.lease_s, "renewed_at": time.time()}).encode()

    def _put(self, **condition: str) -> str:
        response = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(), **condition)
        return str(response["ETag"])

    def __enter__(self) -> ObjectLease:
        deadline = time.monotonic() + self.wait_s
        delay = 0.02
        while True:
            if self._try_acquire():
                break
            if time.monotonic() > deadline:
                raise StoreError(f"timed out after {self.wait_s:.0f}s waiting for lock s3://{self.bucket}/{self.key}")
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)
        self._heartbeat = threading.Thread(target=self._renew_loop, name=f"lease:{self.key}", daemon=True)
        self._heartbeat.start()
        return self

    def _try_acquire(self) -> bool:
        try:
            self.etag = self._put(IfNoneMatch="*")
            return True
        except ClientError as exc:
            if error_code(exc) not in CONFLICT_CODES:
                raise
        # Held by someone: take it over only if their lease ran out.
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if error_code(exc) in MISSING_CODES:
                return False  # released meanwhile: retry the create at once
            raise
        age = time.time() - head["LastModified"].timestamp()
        if age <= self.lease_s:
            return False
        try:
            self.etag = self._put(IfMatch=head["ETag"])
        except ClientError as exc:
            if error_code(exc) in CONFLICT_CODES | MISSING_CODES:
                return False  # another waiter took it over first
            raise
        log.warning("took over lock s3://%s/%s whose lease expired %.0fs ago", self.bucket, self.key, age)
        return True

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with self._etag_lock:
                    assert self.etag is not None
                    self.etag = self._put(IfMatch=self.etag)
            except ClientError as exc:
                if error_code(exc) in CONFLICT_CODES | MISSING_CODES:
                    self.lost = True
                    log.error("lost lock s3://%s/%s: another writer took it over", self.bucket, self.key)
                    return
                log.warning("renewing lock s3://%s/%s failed (%s); retrying", self.bucket, self.key, error_code(exc))
            except Exception as exc:  # a network error: the lease still has two thirds left
                log.warning("renewing lock s3://%s/%s failed (%s); retrying", self.bucket, self.key, exc)

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        with self._etag_lock:
            etag = self.etag
        if self.lost:
            if exc_info[0] is None:
                raise StoreError(f"lost lock s3://{self.bucket}/{self.key} while holding it; check the result")
            return
        if etag is None:
            return
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag)
        except ClientError as exc:
            if error_code(exc) not in CONFLICT_CODES | MISSING_CODES:
                log.warning("releasing lock s3://%s/%s failed (%s)", self.bucket, self.key, error_code(exc))
