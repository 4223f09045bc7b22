"""Closed set of errors raised by the model store.

Callers (the service, the training publisher and the CLI) catch ``StoreError`` to
turn any store failure into one message; the subclasses let them map specific
failures to specific behaviour (e.g. refuse a corrupted version, keep serving).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model_store.gate import GateReport


class StoreError(Exception):
    """Base class of every error the model store raises on purpose."""


class InvalidName(StoreError, ValueError):
    """A model, version, alias or file name is not safe to use as a path segment."""


class InvalidManifest(StoreError, ValueError):
    """Manifest fields are missing, mistyped or inconsistent with the version."""


class ModelNotFound(StoreError, KeyError):
    """A model, version, alias or file does not exist in the store."""

    # KeyError.__str__ would wrap the message in quotes; keep it readable.
    __str__ = Exception.__str__


class InvalidStoreLocation(StoreError, ValueError):
    """A store location (``--store``, ``CLIP_STORE``) names no supported backend."""


class StoreUnavailable(StoreError, OSError):
    """The storage service could not be reached or refused the request (a bucket that does not
    exist, missing credentials, a network error). An ``OSError``: it may pass when retried."""


class VersionExists(StoreError):
    """A version with this name is already published; versions are immutable."""


class ChecksumMismatch(StoreError):
    """Files of a version are missing or differ from the digests in its manifest.

    ``problems`` maps each offending file name to a short reason so operators can
    see at once which blob is damaged.
    """

    def __init__(self, name: str, version: str, problems: Mapping[str, str]) -> None:
        self.name = name
        self.version = version
        self.problems = dict(problems)
        details = ", ".join(f"{f} ({why})" for f, why in sorted(self.problems.items()))
        super().__init__(f"{name}@{version} failed verification: {details}")


class VersionRefused(StoreError):
    """A version was refused at publish or promote: it depends on files outside it, or it cannot
    be loaded and run as its manifest describes (``reason`` says why)."""

    def __init__(self, ref: str, reason: str) -> None:
        self.ref = ref
        self.reason = reason
        super().__init__(f"refusing {ref}: {reason}")


class WriteConflict(StoreError):
    """A small blob (the alias table) changed between this writer's read and its write; nothing was
    written. Writers hold the model lock, so this means the lock was lost (an S3 lease that expired
    while its holder stalled) or someone wrote behind the store's back: read again and retry."""


class PreconditionFailed(StoreError):
    """An alias move found the alias other than its caller stated or assumed: not at the version
    ``--expect`` named, a canary already running (``--replace`` replaces it), or already rolled back
    by someone else. Checked under the model's lock against the table the move would replace, so
    nothing was written; the message says where the alias is and who moved it last."""


class GateRefused(StoreError):
    """The evaluation gate refused to move an alias: the candidate's figures regressed beyond
    tolerance, or it lacks figures the current target has. ``report`` holds the comparison for
    callers that print it."""

    def __init__(self, message: str, report: GateReport) -> None:
        self.report = report
        super().__init__(message)
