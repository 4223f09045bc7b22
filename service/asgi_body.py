"""Reading and replaying an ASGI request body: the front-ends, the engine and the middleware that
read a body before the application does (and hand it on unchanged) share these.

Plain typing aliases rather than Starlette's: a front-end process imports no web framework.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


def is_json(scope: Scope) -> bool:
    """Whether the request says its body is JSON (``application/json``, parameters aside)."""
    kind = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    return kind.split(b";", 1)[0].strip().lower() == b"application/json"


async def stream_body(receive: Receive) -> AsyncIterator[bytes]:
    """The body's chunks as they come; ends early when the client goes away."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def read_body(receive: Receive) -> bytes:
    return b"".join([chunk async for chunk in stream_body(receive)])


def replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole once, then whatever ``receive`` gives (only a
    disconnect can follow a body)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
