"""Which version answers a request on an alias entry: pure functions for servers.

A canary takes ``weight`` percent of the requests by a stable hash of the caller's key into
[0, 100): the same key always lands on the same version, so one caller does not flip between
two models from one request to the next. The hash is salted with the canary's version, so each
new canary starts with a different set of callers (nobody is always first), while raising the
weight of a running one keeps every caller it already had. Requests without a key are routed
at random with the same odds.
"""

from __future__ import annotations

import hashlib
import random

from model_store.aliases import AliasEntry

_SPAN = float(1 << 64)


def key_point(salt: str, key: str | bytes) -> float:
    """Stable position of ``key`` in [0, 100) (sha256, so it is the same in every process)."""
    raw = key.encode() if isinstance(key, str) else key
    digest = hashlib.sha256(salt.encode() + b"\x00" + raw).digest()
    return int.from_bytes(digest[:8], "big") / _SPAN * 100.0


def route(entry: AliasEntry, key: str | bytes | None = None, rng: random.Random | None = None) -> str:
    """The version that answers a request on ``entry`` from the caller ``key`` (None: at random,
    drawn from ``rng`` or the ``random`` module)."""
    canary = entry.canary
    if canary is None:
        return entry.version
    point = key_point(canary.version, key) if key is not None else (rng or random).random() * 100.0
    return canary.version if point < canary.weight else entry.version


def shadow_target(entry: AliasEntry, rng: random.Random | None = None) -> str | None:
    """The version to re-run this request on after answering it, or None (sampled at the shadow's
    fraction; a server drops shadow work first under load)."""
    shadow = entry.shadow
    if shadow is None or (rng or random).random() >= shadow.fraction:
        return None
    return shadow.version
