"""Two-level embedding cache: an in-process LRU in front of an optional shared Redis.

Keys always carry the exact model version (``emb:v1:default@v3:text:pcclip:<sha256>``), so a
model swap can never serve embeddings of another version, and no invalidation is needed.

Value format (``FORMAT_F16``), chosen so any reader can decode a value without knowing the model:
``tag (1 byte, 0x01) | ndim (1 byte) | ndim x uint32 little-endian dims | float16 LE data``.
float16 halves the memory and network cost; for L2-normalised embeddings the rounding error is
below 1e-3 per component. Values come back as read-only float32 arrays of the stored shape, and
the LRU holds the same float16-rounded values, so a result never depends on which layer hit.

Redis is an optimisation, never a dependency: every Redis error or timeout becomes a miss and is
counted. A circuit breaker then skips Redis for a pause (``retry_after_s``, doubling while it keeps
failing, at most a minute). It tells a slow machine from a dead server: a refused or reset
connection opens it at once, timeouts only after ``timeouts_to_open`` in a row (a loaded CPU
delays the event loop while Redis is healthy). After the pause Redis is probed and trusted again
only after ``successes_to_close`` successes in a row, so a restarting server does not flap.

Probes run on fresh sockets: when the pause ends, the idle pooled connections are dropped, since
after a restart (``kill -9``, a new pod on the same address) each of them is dead and would fail
once, which says nothing about the server. Only a round of probes that fails before any success
doubles the pause, so a Redis that comes back is used again one pause later, not several.

The shared Redis is one server, a master watched by Redis Sentinel (``redis+sentinel://``) or a
Redis Cluster (``redis+cluster://``); ``RedisLink`` (redis_link.py) holds the client of each.
The breaker treats each as one Redis. Sentinel: while the master is dead, and unknown until a
replica is promoted, commands fail and the breaker opens; a probe's fresh connections ask the
Sentinels where the master is, so the first probe after the promotion finds the new one.
Cluster: a batch spans the masters (keys hash to slots all over), one round trip per node; a
batch that meets a dead node fails as a whole and pauses the whole cluster, and a probe rereads
the slot map, so a restarted or failed-over node is found again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from clipcore.methods.common import quantize
from service.runtime.redis_link import RedisLink

if TYPE_CHECKING:
    from service.runtime.metrics import ServiceMetrics

__all__ = [
    "FORMAT_F16",
    "EmbeddingCache",
    "bytes_digest",
    "decode_value",
    "embedding_key",
    "encode_value",
    "quantize",
    "text_digest",
]

log = logging.getLogger(__name__)

KEY_PREFIX = "emb:v1"
FORMAT_F16 = 0x01
_MAX_NDIM = 8
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]+$")
# At most one Redis warning per interval: a dead Redis must not flood the logs per request.
RedisState = Literal["disabled", "up", "down", "probing"]
MAX_PAUSE_S = 60.0  # longest pause between probes of a Redis that keeps failing
_WARN_INTERVAL_S = 30.0


def text_digest(text: str) -> str:
    """sha256 hex of the exact UTF-8 text (no normalisation: the model sees the exact text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def bytes_digest(data: bytes) -> str:
    """sha256 hex of the image bytes as sent (what clients pass back as ``{"sha256": ...}``)."""
    return hashlib.sha256(data).hexdigest()


def embedding_key(model_ref: str, kind: str, variant: str, digest: str) -> str:
    """Cache key for one embedding; ``model_ref`` must be the resolved ``name@version``."""
    digest = digest.lower()
    if not _HEX64.match(digest):
        raise ValueError("digest must be a sha256 hex string")
    return embedding_key_prefix(model_ref, kind, variant) + digest


def embedding_key_prefix(model_ref: str, kind: str, variant: str) -> str:
    """What every ``embedding_key`` of these arguments starts with, checked once: a request's
    hundred prompts take ``prefix + text_digest(text)`` (a lowercase sha256 hex by construction)."""
    name, sep, version = model_ref.partition("@")
    if not sep or not name or not version or ":" in model_ref:
        raise ValueError(f"model_ref must be 'name@version' without ':', got {model_ref!r}")
    for label, part in (("kind", kind), ("variant", variant)):
        if not _TOKEN.match(part):
            raise ValueError(f"{label} must match [A-Za-z0-9_.-]+, got {part!r}")
    return f"{KEY_PREFIX}:{model_ref}:{kind}:{variant}:"


def _storable(array: np.ndarray) -> np.ndarray:
    arr = np.asarray(array)
    if arr.ndim > _MAX_NDIM:
        raise ValueError(f"at most {_MAX_NDIM} dimensions, got {arr.ndim}")
    return arr


def encode_value(array: np.ndarray) -> bytes:
    arr = _storable(array)
    header = struct.pack(f"<BB{arr.ndim}I", FORMAT_F16, arr.ndim, *arr.shape)
    return header + np.ascontiguousarray(arr, dtype="<f2").tobytes()


def stored_value(array: np.ndarray) -> np.ndarray:
    """``decode_value(encode_value(array))`` without the bytes between: the float16-rounded values
    as a read-only float32 array, what the LRU holds (the bytes are made only for Redis)."""
    return quantize(np.asarray(_storable(array), order="C"))  # C-ordered, as decoded bytes are


def decode_value(data: bytes) -> np.ndarray:
    """Inverse of ``encode_value``: a read-only float32 array; ValueError on a malformed value."""
    if len(data) < 2 or data[0] != FORMAT_F16:
        raise ValueError("unknown cache value format")
    ndim = data[1]
    if ndim > _MAX_NDIM:
        raise ValueError("bad ndim")
    head = 2 + 4 * ndim
    shape = struct.unpack_from(f"<{ndim}I", data, 2)
    count = math.prod(shape)  # not np.prod: a numpy reduction costs microseconds per cached value
    if len(data) != head + 2 * count:
        raise ValueError("cache value length does not match its shape")
    arr = np.frombuffer(data, dtype="<f2", count=count, offset=head).astype(np.float32)
    arr = arr.reshape(shape)
    arr.setflags(write=False)
    return arr


class EmbeddingCache:
    """LRU (bounded by items and bytes) in front of an optional Redis.

    The LRU is only touched from the event loop thread and no method awaits in the middle of
    an LRU update, so it needs no lock. Returned arrays are shared and read-only: copy before
    changing them.
    """

    def __init__(
        self,
        redis_url: str | None,
        *,
        ttl_s: int = 7 * 24 * 3600,
        lru_items: int = 50_000,
        timeout_s: float = 0.25,
        retry_after_s: float = 5.0,
        metrics: ServiceMetrics | None = None,
        lru_max_bytes: int = 512 * 1024 * 1024,
        timeouts_to_open: int = 3,
        successes_to_close: int = 3,
    ) -> None:
        self.ttl_s = int(ttl_s)
        self.lru_items = int(lru_items)
        self.lru_max_bytes = int(lru_max_bytes)
        self.timeout_s = float(timeout_s)
        self.retry_after_s = float(retry_after_s)
        self._metrics = metrics
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lru_bytes = 0
        self._redis: RedisLink | None = None
        self._state: RedisState = "disabled"
        self._down_until = 0.0
        # A dead server (refused, reset) opens the breaker at once; timeouts only after this many
        # in a row, since a loaded machine (or event loop) can be slow while Redis is healthy.
        self.timeouts_to_open = max(1, int(timeouts_to_open))
        # After the pause, Redis is probed ("probing") and trusted again only after this many
        # successes in a row: a restarting server (or a pool of stale connections) fails some.
        self.successes_to_close = max(1, int(successes_to_close))
        self._timeouts = 0
        self._successes = 0
        self._pause_s = self.retry_after_s  # doubles while probes keep failing, up to MAX_PAUSE_S
        self._down_since = 0.0
        self._dropping_sockets = False  # the pause is over and the pool is being emptied
        self.last_error: str | None = None
        self._last_warn = -_WARN_INTERVAL_S
        self._suppressed = 0
        if redis_url:
            self._redis = RedisLink(redis_url, self.timeout_s)
            self._state = "up"  # optimistic: the first failure opens the breaker

    # -- public -------------------------------------------------------------------------------

    @property
    def redis_state(self) -> RedisState:
        """ "disabled" (no URL), "up", "down" (breaker open: Redis skipped) or "probing" (trying
        Redis again after a pause, not yet trusted)."""
        return self._state

    def __len__(self) -> int:
        return len(self._lru)

    async def get_many(self, keys: Sequence[str]) -> list[np.ndarray | None]:
        """Values in key order, None for misses; LRU first, then one MGET for the rest.

        Each layer's time is observed in ``clip_cache_lookup_seconds``: the LRU pass always, Redis only
        when it was asked (its time includes decoding and an error or timeout).
        """
        started = time.perf_counter()
        out: list[np.ndarray | None] = [None] * len(keys)
        missing: list[int] = []
        for i, key in enumerate(keys):
            value = self._lru.get(key)
            if value is None:
                missing.append(i)
            else:
                self._lru.move_to_end(key)
                out[i] = value
        self._count("lru", "hit", len(keys) - len(missing))
        self._count("lru", "miss", len(missing))
        self._observe("lru", started)
        if not missing or not await self._redis_usable():
            return out
        assert self._redis is not None  # _redis_usable says so
        miss_keys = [keys[i] for i in missing]
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                raw = await self._redis.mget(miss_keys)  # in a cluster: one round trip per node
        except Exception as exc:  # any Redis or network failure degrades to misses
            self._on_error("get", exc, len(miss_keys))
            self._observe("redis", started)
            return out
        self._on_success()
        hits = 0
        for i, data in zip(missing, raw, strict=True):
            if data is None:
                continue
            try:
                value = decode_value(data)
            except ValueError:
                log.debug("ignoring malformed cache value for %s", keys[i])
                continue
            out[i] = value
            self._lru_set(keys[i], value)
            hits += 1
        self._count("redis", "hit", hits)
        self._count("redis", "miss", len(missing) - hits)
        self._observe("redis", started)
        return out

    async def put_many(self, items: Mapping[str, np.ndarray]) -> None:
        """Store values in the LRU and (one pipelined round trip of SET EX) in Redis."""
        if not items:
            return
        for key, array in items.items():
            self._lru_set(key, stored_value(array))
        if not await self._redis_usable():
            return
        encoded = {key: encode_value(array) for key, array in items.items()}  # only for Redis
        assert self._redis is not None  # _redis_usable says so
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self._redis.pipeline(transaction=False)  # in a cluster: one per node
                for key, data in encoded.items():
                    pipe.set(key, data, ex=self.ttl_s)
                await pipe.execute()
        except Exception as exc:
            self._on_error("put", exc, len(encoded))
            return
        self._on_success()

    async def ping(self) -> bool:
        """Probe Redis now, ignoring the breaker (for readiness/status); False when disabled."""
        if self._redis is None:
            return False
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._redis.ping()
        except Exception as exc:
            self._on_error("ping", exc, 0)
            return False
        self._on_success()
        return True

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self._redis.aclose()
            except Exception as exc:  # closing a dead connection must not fail shutdown
                log.debug("closing redis client: %s", exc)
            self._redis = None
            self._state = "disabled"

    def clear_lru(self) -> None:
        self._lru.clear()
        self._lru_bytes = 0

    # -- LRU ----------------------------------------------------------------------------------

    def _lru_set(self, key: str, value: np.ndarray) -> None:
        if value.nbytes > self.lru_max_bytes or self.lru_items <= 0:
            return
        old = self._lru.pop(key, None)
        if old is not None:
            self._lru_bytes -= old.nbytes
        self._lru[key] = value
        self._lru_bytes += value.nbytes
        while len(self._lru) > self.lru_items or self._lru_bytes > self.lru_max_bytes:
            _, evicted = self._lru.popitem(last=False)
            self._lru_bytes -= evicted.nbytes

    # -- Redis circuit breaker ----------------------------------------------------------------

    async def _redis_usable(self) -> bool:
        if self._redis is None:
            return False
        if self._state == "down":
            if self._dropping_sockets or time.monotonic() < self._down_until:
                return False  # breaker open: skip Redis
            # Requests arriving while the pool is emptied skip Redis too: one that took a pooled
            # socket before it is closed would fail for no fault of the server.
            self._dropping_sockets = True
            try:
                await self._drop_idle_connections()
            finally:
                self._dropping_sockets = False
            if self._redis is None:  # closed meanwhile
                return False
            self._state, self._successes = "probing", 0
        return True

    async def _drop_idle_connections(self) -> None:
        """Close the pool's idle sockets so the next commands connect afresh (connections in use
        are left to their commands)."""
        if self._redis is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._redis.drop_idle_connections()
        except Exception as exc:  # a dead socket may fail to close cleanly; it is dropped all the same
            log.debug("dropping idle redis connections: %s", exc)

    def _on_success(self) -> None:
        self._timeouts = 0
        if self._state == "probing":
            self._successes += 1
            if self._successes >= self.successes_to_close:
                log.info("redis cache reachable again after %.1fs", time.monotonic() - self._down_since)
                self._state, self._pause_s, self.last_error = "up", self.retry_after_s, None

    def _on_error(self, op: str, exc: BaseException, keys: int) -> None:
        self._count("redis", "error", max(keys, 1))
        # /models shows last_error: no password in it, whatever redis-py put in the message.
        detail = self._redis.scrub(str(exc)) if self._redis is not None else str(exc)
        self.last_error = f"{op}: {type(exc).__name__}: {detail}"[:300]
        timed_out = isinstance(exc, TimeoutError) or type(exc).__name__ == "TimeoutError"
        self._timeouts = self._timeouts + 1 if timed_out else 0
        if self._state == "up" and timed_out and self._timeouts < self.timeouts_to_open:
            return  # slow, not dead (yet): the request got misses, the breaker stays closed
        if self._state == "probing" and self._successes == 0:
            self._pause_s = min(2 * self._pause_s, MAX_PAUSE_S)  # still failing: wait longer
        # A failure after a success in this round (Redis answered, then a socket broke or it
        # restarted again) keeps the pause: the server is there, waiting longer would not help.
        was_up = self._state == "up"
        self._state, self._successes = "down", 0
        now = time.monotonic()
        if was_up:
            self._down_since = now
        self._down_until = now + self._pause_s
        if was_up or now - self._last_warn >= _WARN_INTERVAL_S:
            log.warning(
                "redis cache %s failed (%s: %s); skipping redis for %.1fs (%d errors suppressed)",
                op,
                type(exc).__name__,
                detail,
                self._pause_s,
                self._suppressed,
            )
            self._last_warn = now
            self._suppressed = 0
        else:
            self._suppressed += 1

    def _observe(self, layer: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.observe_cache_lookup(layer, time.perf_counter() - started)

    def _count(self, layer: str, result: str, n: int) -> None:
        if self._metrics is not None and n > 0:
            self._metrics.cache_event(layer, result, n)
