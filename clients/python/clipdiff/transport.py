"""Request sending with bounded retries, shared by the sync and async clients.

Only failures that say "try again later" are retried: 429 (queue full, honouring
``Retry-After``), 503 (model not ready) and failures to connect. Every other answer, including
every other 4xx, is final, and a read timeout is not retried because the server may still be
doing the work.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from clipdiff.errors import ConnectionFailed, error_from_response, parse_retry_after

__all__ = ["Call", "RetryPolicy", "send_async", "send_sync"]

RETRY_STATUSES = frozenset({429, 503})
# The request never reached the server, so sending it again cannot do the work twice.
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: attempt ``n`` waits about ``backoff * 2**n`` seconds."""

    max_retries: int = 3
    backoff: float = 0.2
    max_backoff: float = 10.0
    # A server asking for a longer pause than this gets it capped, so a caller never hangs
    # for minutes on one header.
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.backoff < 0:
            raise ValueError("backoff must be >= 0")

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        base = min(self.max_backoff, self.backoff * (2**retry))
        # "Equal jitter": at least half the base, so clients that failed together spread out
        # without any of them retrying immediately.
        return base / 2 + random.uniform(0, base / 2)


@dataclass
class Call:
    """One API call: what to send and how to turn the JSON answer into a result."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, str] = field(default_factory=dict)
    raw: bool = False  # the answer is the body's bytes (a PNG), not JSON; errors are JSON either way


def _retry_after(response: httpx.Response) -> float | None:
    return parse_retry_after(response.headers.get("retry-after"))


def _encode(call: Call) -> tuple[bytes | None, dict[str, str]]:
    if call.json is None:
        return None, {}
    body = json.dumps(call.json, separators=(",", ":")).encode()
    return body, {"content-type": "application/json"}


def _where(client: httpx.Client | httpx.AsyncClient, call: Call) -> str:
    return f"{call.method} {client.base_url.join(call.path)}"


def _unreachable(client: httpx.Client | httpx.AsyncClient, call: Call, exc: Exception, tries: int) -> ConnectionFailed:
    reason = str(exc) or type(exc).__name__
    return ConnectionFailed(
        None,
        "connection_error",
        f"no answer from {client.base_url} after {tries} attempt(s) ({reason}); check that the service is running "
        "there and that base_url names its host and port",
        url=_where(client, call),
    )


def _final(response: httpx.Response, raw: bool) -> Any:
    if response.status_code >= 400:
        where = f"{response.request.method} {response.request.url}"
        raise error_from_response(response.status_code, response.content, response.headers, url=where)
    if raw:
        return response.content
    if not response.content:
        return None
    return response.json()


def send_sync(client: httpx.Client, call: Call, policy: RetryPolicy) -> Any:
    """Send ``call`` and return the decoded JSON body (the bytes for a ``raw`` call); raise a
    ``ClipServiceError`` on failure."""
    body, headers = _encode(call)
    retry = 0
    while True:
        try:
            response = client.request(call.method, call.path, content=body, headers=headers, params=dict(call.params))
        except RETRY_EXCEPTIONS as exc:
            if retry >= policy.max_retries:
                raise _unreachable(client, call, exc, retry + 1) from exc
            time.sleep(policy.delay(retry))
            retry += 1
            continue
        if response.status_code in RETRY_STATUSES and retry < policy.max_retries:
            time.sleep(policy.delay(retry, _retry_after(response)))
            retry += 1
            continue
        return _final(response, call.raw)


async def send_async(client: httpx.AsyncClient, call: Call, policy: RetryPolicy) -> Any:
    """Async twin of :func:`send_sync` (same retry rules, non-blocking sleeps)."""
    body, headers = _encode(call)
    retry = 0
    while True:
        try:
            response = await client.request(
                call.method, call.path, content=body, headers=headers, params=dict(call.params)
            )
        except RETRY_EXCEPTIONS as exc:
            if retry >= policy.max_retries:
                raise _unreachable(client, call, exc, retry + 1) from exc
            await asyncio.sleep(policy.delay(retry))
            retry += 1
            continue
        if response.status_code in RETRY_STATUSES and retry < policy.max_retries:
            await asyncio.sleep(policy.delay(retry, _retry_after(response)))
            retry += 1
            continue
        return _final(response, call.raw)
