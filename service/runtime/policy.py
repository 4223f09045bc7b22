"""One policy for a version that failed to load: refuse it, or try it again after a backoff.

A hot swap of the primary, a canary or shadow loaded beside it and the first load of an entry
loaded on request all follow it (``LoadAttempts`` per role, ``Quarantine`` for an entry that holds
nothing): a failure that may pass as the version is (an unreadable file, a version not there yet,
no memory) is tried again after ``backoff_s`` (the watch interval, doubling with each failure in a
row); any other is refused until the alias names another version (versions are immutable).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from clipcore.backends.base import BackendError
from model_store import ChecksumMismatch, InvalidManifest, ModelNotFound

__all__ = ["MAX_BACKOFF_S", "LoadAttempts", "Quarantine", "backoff_s", "failure_reason", "may_pass"]

# Load failures that may pass: the version is tried again later rather than refused.
TRANSIENT_LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, MemoryError, ModelNotFound)
MAX_BACKOFF_S = 300.0


def may_pass(exc: BaseException) -> bool:
    """Whether a version that failed to load may load later as it is: its files could not be read
    (a flaky mount), were not there yet, or memory ran out. Wrong checksums, an invalid manifest, a
    failed warm-up or parity gate stay true of an immutable version: it is refused instead."""
    if isinstance(exc, ChecksumMismatch):
        return all(why == "missing" or why.startswith("unreadable") for why in exc.problems.values())
    return isinstance(exc, TRANSIENT_LOAD_ERRORS)


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of ``clip_model_load_failures_total``: a few words, never a message."""
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, ModelNotFound):
        return "not_found"
    if isinstance(exc, ChecksumMismatch):
        return "unreadable" if may_pass(exc) else "checksum"
    if isinstance(exc, InvalidManifest):
        return "manifest"
    if isinstance(exc, BackendError):
        return "gate"
    if isinstance(exc, OSError):
        return "unreadable"
    return "other"  # a failed warm-up among others: the log says which


def backoff_s(interval_s: float, failures: int) -> float:
    """Wait before the next try after ``failures`` failures in a row: the interval, doubling."""
    return min(interval_s * 2 ** max(failures - 1, 0), max(interval_s, MAX_BACKOFF_S))


@dataclass
class LoadAttempts:
    """The load state of the version one role (primary, canary, shadow) names: refused, or backing off."""

    refused: str | None = None  # failed in a way that stays true of it (versions are immutable)
    retry: str | None = None  # failed in a way that may pass: tried again at retry_at
    failures: int = 0
    retry_at: float = 0.0

    def waits(self, version: str, now: float | None = None) -> bool:
        """Whether loading ``version`` now would be pointless (refused) or premature (backing off)."""
        now = time.monotonic() if now is None else now
        return version == self.refused or (version == self.retry and now < self.retry_at)

    def failed(self, version: str, exc: BaseException, interval_s: float, now: float | None = None) -> float | None:
        """Count a failed load of ``version``: the seconds until it is tried again, or None when it
        is refused."""
        if not may_pass(exc):
            self.refused, self.retry, self.failures = version, None, 0
            return None
        self.failures = self.failures + 1 if version == self.retry else 1
        self.retry = version
        delay = backoff_s(interval_s, self.failures)
        self.retry_at = (time.monotonic() if now is None else now) + delay
        return delay

    def loaded(self) -> None:
        self.refused, self.retry, self.failures, self.retry_at = None, None, 0, 0.0


@dataclass(frozen=True)
class Quarantine:
    """Why an entry loaded on request serves nothing, and until when no request tries again.

    From a failed load until a load succeeds (or, refused, its alias names another version)."""

    version: str | None  # the version whose load failed; None when the ref could not be resolved
    reason: str  # for callers: no paths (the log has the error)
    refused: bool  # may not pass as it is: not loaded again until the alias names another version
    failures: int  # failed loads of this version in a row
    until: float  # monotonic: no load (refused: no read of the alias) before it

    @classmethod
    def after(cls, previous: Quarantine | None, version: str | None, exc: BaseException, reason: str,
              interval_s: float) -> Quarantine:  # fmt: skip
        """The quarantine after a failed load of ``version`` (the policy of ``LoadAttempts``; a
        refused version's alias is read again after one interval)."""
        failures = previous.failures + 1 if previous is not None and previous.version == version else 1
        refused = version is not None and not may_pass(exc)
        delay = interval_s if refused else backoff_s(interval_s, failures)
        return cls(version, reason, refused, failures, time.monotonic() + delay)

    def left_s(self, now: float | None = None) -> float:
        return max(0.0, self.until - (time.monotonic() if now is None else now))

    def until_epoch(self) -> float:
        """``until`` as Unix time, for /models."""
        return time.time() + (self.until - time.monotonic())

    def describe(self, ref: str) -> str:
        """The 503 message for a request naming the entry ``ref``."""
        if self.refused:
            return (
                f"model {ref} is quarantined ({self.reason}): version {self.version} is refused until its alias "
                "names another version; the server log says why"
            )
        left = max(1, math.ceil(self.left_s()))
        times = f", {self.failures} failed loads in a row" if self.failures > 1 else ""
        return (
            f"model {ref} is quarantined ({self.reason}{times}): not tried again for {left}s; the server log says why"
        )
