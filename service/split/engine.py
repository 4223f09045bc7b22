"""The engine process (``workers`` > 1): the whole application on a private unix socket.

It is the single-process application (every route, the served set, canary and shadow, hot swaps,
caches, batchers, towers and its own /metrics) behind ``EngineGate``, which takes the images the
front-ends decoded (``service.split.wire``), answers the preprocessing table front-ends decode by,
and stamps every answer with that table's digest so front-ends notice a change.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from service.asgi_body import read_body, replayed
from service.split.pixel_ring import SharedPixels
from service.split.wire import (
    FRONT_END_HEADER,
    GENERATION_HEADER,
    PREDECODED,
    PREDECODED_HEADER,
    SPECS_PATH,
    MalformedFrame,
    bundle_spec,
    unpack,
)

log = logging.getLogger("service")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PREDECODED = PREDECODED_HEADER.encode()
_FRONT_END = FRONT_END_HEADER.encode()


class SpecTable:
    """The preprocessing specs of the loaded versions, and a digest that changes with them."""

    def __init__(self, models: Any) -> None:
        self.models = models
        self._key: tuple[int, ...] = ()
        self._table: dict[str, Any] = {"default": None, "specs": []}
        self.generation = b"0"

    def current(self) -> dict[str, Any]:
        runtimes = [(i, runtime) for i, entry in enumerate(self.models.entries) for runtime in entry.table.loaded()]
        key = tuple(id(runtime) for _, runtime in runtimes)
        if key != self._key:  # a version came or went: a few microseconds per answer otherwise
            default = self.models.default.current
            self._table = {
                "default": bundle_spec(default.bundle) if default is not None else None,
                "specs": sorted({bundle_spec(runtime.bundle) for _, runtime in runtimes}),
            }
            self.generation = str(zlib.crc32(json.dumps(self._table, sort_keys=True).encode())).encode()
            self._key = key
        return self._table


class EngineGate:
    """ASGI wrapper of the engine's application (see the module docstring)."""

    def __init__(self, app: Any, models: Any) -> None:
        self.app = app
        self.table = SpecTable(models)
        self.rings = SharedPixels()  # the front-ends' shared memory, for requests with large pixels

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        table = self.table

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                table.current()
                message["headers"] = [*message.get("headers", []), (GENERATION_HEADER.encode(), table.generation)]
            await send(message)

        if scope["path"] == SPECS_PATH and any(k == _FRONT_END for k, _ in scope["headers"]):
            body = json.dumps(table.current()).encode()
            await stamped({"type": "http.response.start", "status": 200,
                           "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        manifest_length = next((v for k, v in scope["headers"] if k == _PREDECODED), None)
        if manifest_length is None:
            await self.app(scope, receive, stamped)
            return
        body = await read_body(receive)
        try:
            request_json, images = unpack(body, int(manifest_length), self.rings)
        except (MalformedFrame, ValueError) as exc:
            log.error("a front-end sent %s", exc)
            await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": str(exc).encode()})
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in (_PREDECODED, b"content-length")]
        headers.append((b"content-length", str(len(request_json)).encode()))
        token = PREDECODED.set(images)
        try:
            await self.app({**scope, "headers": headers}, replayed(request_json, receive), stamped)
        finally:
            PREDECODED.reset(token)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> None:
    """``python -m service.split.engine SOCKET [service flags...]`` (started by the supervisor)."""
    from service.__main__ import leave_out_gpu_compiler
    from service.split.supervisor import child_settings

    socket_path, settings = argv[0], child_settings(argv[1:])
    leave_out_gpu_compiler(settings.device)
    from service import http_server
    from service.app import create_app

    app = create_app(settings)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    http_server.run_served(
        EngineGate(app, app.state.services.models),
        settings,
        keep_alive_s=max(settings.keep_alive_s, 3600.0),  # front-ends keep their connections
        uds=socket_path,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
