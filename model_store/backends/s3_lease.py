"""An exclusive lock held as one object in a bucket, with a lease that a heartbeat renews.

S3 has no ``flock``; conditional writes give the same mutual exclusion. A writer takes the
lock by creating the lock object with ``If-None-Match: *`` (the server refuses a second
creator with 412), renews it five times per lease with ``If-Match: <its ETag>``, and releases it
with a conditional delete. The object names its holder: host and pid, and on Linux the boot, PID
namespace and start time of its process, with the lease it keeps.

A waiter takes the lock over, with ``If-Match`` on the holder's ETag so that only one waiter can
win, as soon as the holder is proven gone:

* its process ran on this machine, in this PID namespace, and no longer exists (a writer killed
  by SIGKILL or the OOM killer, a crashed job on the same node): at once;
* else once its lease ran out: the object's ``LastModified`` (set by the server) is older than
  the lease the holder declared, five missed renewals.

``break_existing`` (``model-store rollback --break-lock``) takes the lock from the holder it finds
without waiting: for an emergency while a holder on another machine is stuck, or died less than a
lease ago. That holder learns it at its next renewal (``lost``), and the alias table's conditional
write refuses what it may still try to write over a newer table.

This relies on the server honouring conditional ``PutObject``/``DeleteObject`` (AWS S3, SeaweedFS,
MinIO do) and on clocks within a few seconds of the server's (NTP), against a lease of 20 s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from model_store.errors import StoreError

log = logging.getLogger("model_store.s3")

DEFAULT_LEASE_S = 20.0
RENEWALS_PER_LEASE = 5
DEFAULT_WAIT_S = 600.0
MAX_DECLARED_LEASE_S = 3600.0  # a holder's declared lease above this is not believed: ours is used
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Error codes meaning "someone else's write won the condition": wait and try again.
CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _process_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks after boot) of process ``pid`` (``/proc/<pid>/stat``)."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)
    except (IndexError, ValueError):
        return None


def process_identity() -> dict[str, Any]:
    """Who this process is, as a lock object records it: precise enough, on Linux, for a waiter on
    the same machine and in the same PID namespace to tell whether the process still runs."""
    pid = os.getpid()
    identity: dict[str, Any] = {"host": socket.gethostname(), "pid": pid}
    try:
        namespace: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    boot, stat = _read_text(BOOT_ID), _process_stat(pid)
    if boot and namespace and stat is not None:
        identity.update(boot=boot, pid_namespace=namespace, started=stat[1])
    return identity


def holder_gone(holder: Mapping[str, Any], mine: Mapping[str, Any] | None = None) -> bool:
    """Whether the process that wrote the lock body ``holder`` is provably dead: it ran on this
    machine since its last boot, in this PID namespace, and its pid is free, a zombie, or another
    process's (started at another time). False whenever that cannot be told."""
    mine = process_identity() if mine is None else mine
    if "started" not in mine or any(holder.get(k) != mine[k] for k in ("host", "boot", "pid_namespace")):
        return False
    pid, started = holder.get("pid"), holder.get("started")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(started, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it exists
        pass
    stat = _process_stat(pid)
    if stat is None:  # it exists, but /proc does not show it (hidepid): cannot tell
        return False
    state, now_started = stat
    return state in ("Z", "X") or now_started != started


def _declared_lease(holder: Mapping[str, Any], default: float) -> float:
    value = holder.get("lease_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if 0 < value <= MAX_DECLARED_LEASE_S:
            return float(value)
    return default


class ObjectLease:
    """One acquisition of the lock object ``key`` in ``bucket``; use as a context manager."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        lease_s: float = DEFAULT_LEASE_S,
        wait_s: float = DEFAULT_WAIT_S,
        break_existing: bool = False,
    ) -> None:
        self.client, self.bucket, self.key = client, bucket, key
        self.lease_s, self.wait_s = lease_s, wait_s
        self.break_existing = break_existing
        self.identity = process_identity()
        self.owner = f"{self.identity['host']}:{self.identity['pid']}:{secrets.token_hex(6)}"
        self.etag: str | None = None
        self.lost = False
        self._breaking: str | None = None  # the owner whose lock ``break_existing`` takes
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._etag_lock = threading.Lock()

    def _body(self) -> bytes:
        return json.dumps(
            {"owner": self.owner, "lease_s": self.lease_s, "renewed_at": time.time(), **self.identity}
        ).encode()

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
        # Held by someone: take it over only if they are gone (or we were asked to break it).
        try:
            held = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if error_code(exc) in MISSING_CODES:
                return False  # released meanwhile: retry the create at once
            raise
        body = held["Body"]
        try:
            raw = body.read()
        finally:
            body.close()
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = None
        holder = holder if isinstance(holder, dict) else {}
        age = time.time() - held["LastModified"].timestamp()
        why = self._takeover_reason(holder, age)
        if why is None:
            return False
        try:
            self.etag = self._put(IfMatch=held["ETag"])
        except ClientError as exc:
            if error_code(exc) in CONFLICT_CODES | MISSING_CODES:
                return False  # renewed, released or taken over by another waiter first
            raise
        owner = holder.get("owner", "an unknown holder")
        log.warning("took over lock s3://%s/%s from %s: %s", self.bucket, self.key, owner, why)
        return True

    def _takeover_reason(self, holder: Mapping[str, Any], age: float) -> str | None:
        """Why the lock ``holder`` holds, last renewed ``age`` seconds ago, may be taken; None: wait."""
        lease_s = _declared_lease(holder, self.lease_s)
        if age > lease_s:
            return f"its lease ran out {age - lease_s:.0f}s ago"
        if holder_gone(holder, self.identity):
            return f"its process {holder.get('pid')} on this machine is gone"
        if self.break_existing:
            owner = str(holder.get("owner", ""))
            if self._breaking is None:
                self._breaking = owner  # the holder found: a later one (another breaker) is waited for
            if owner == self._breaking:
                return f"broken on request (last renewed {age:.0f}s ago)"
        return None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / RENEWALS_PER_LEASE):
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
            except Exception as exc:  # a network error: most of the lease is left
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
