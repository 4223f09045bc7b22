"""Canary routing within one served alias: whose requests a canary version answers.

The alias entry the model manager watches (``model_store.aliases.AliasEntry``) may give a canary
version a weighted share of the requests; ``model_store.routing.route`` picks the version from a
stable hash of the caller's key, so one caller stays on one version. The key is the request's
``X-Canary-Key`` header, else a digest of its API key (the key itself is neither kept, logged
nor exported), else none: such requests are routed at random at the same odds.

Canary and shadow versions load beside the primary like a hot swap does (checksums, warm-up,
parity gate); ``SideLoad`` remembers, per role, a version that was refused (not tried again until
the alias names another one) or that may load later (retried with backoff).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

CANARY_KEY_HEADER = "X-Canary-Key"
# Domain separation: the digest that routes a key is not its plain sha256, which other systems may keep.
_API_KEY_SALT = b"clip-service api key\x00"


def caller_key(canary_key: str | None, authorization: str | None) -> bytes | None:
    """Who a request comes from, for routing: its ``X-Canary-Key``, else the sha256 of the bearer
    token of its ``Authorization`` header, else None (routed at random)."""
    if canary_key:
        return canary_key.encode("utf-8")
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        return hashlib.sha256(_API_KEY_SALT + token.encode("utf-8")).digest()
    return None


@dataclass
class SideLoad:
    """Load state of the version a side role (canary, shadow) names."""

    refused: str | None = None  # failed in a way that stays true of it (versions are immutable)
    retry: str | None = None  # failed in a way that may pass: tried again at retry_at
    failures: int = 0
    retry_at: float = 0.0

    def waits(self, version: str, now: float) -> bool:
        """Whether loading ``version`` now would be pointless (refused) or premature (backing off)."""
        return version == self.refused or (version == self.retry and now < self.retry_at)

    def refuse(self, version: str) -> None:
        self.refused, self.retry, self.failures = version, None, 0

    def failed(self, version: str) -> int:
        """Count a failure of ``version`` that may pass (the caller sets ``retry_at``); returns
        the failures in a row."""
        self.failures = self.failures + 1 if version == self.retry else 1
        self.retry = version
        return self.failures

    def loaded(self) -> None:
        self.refused, self.retry, self.failures = None, None, 0
