"""Canary routing within one served alias: whose requests a canary version answers.

The alias entry the model manager watches (``model_store.aliases.AliasEntry``) may give a canary
version a weighted share of the requests; ``model_store.routing.route`` picks the version from a
stable hash of the caller's key, so one caller stays on one version. The key is the request's
``X-Canary-Key`` header, else a digest of its API key (the key itself is neither kept, logged
nor exported), else none: such requests are routed at random at the same odds.

Which loaded version answers a key is the role table's job (``service.runtime.roles``).
"""

from __future__ import annotations

import hashlib

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
