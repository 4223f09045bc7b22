"""A front-end process (``workers`` > 1): the public HTTP server, relaying to the engine.

Every request goes to the engine over its unix socket and every answer comes back unchanged
(status, headers, body), so each endpoint behaves as in a single process by construction. What a
front-end does itself is the per-request host work that would otherwise hold the engine's one GIL:
the HTTP parsing, and for the image routes' JSON bodies the base64 and image decoding
(``service.split.predecode``). ``/metrics`` is the engine's exposition followed by the front-ends'
own counters (prometheus-client's multiprocess mode: one scrape, whichever front-end answers).
No model and no torch here: a front-end starts in a second and holds tens of MiB.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, generate_latest, multiprocess

from service.asgi_body import is_json, read_body, stream_body
from service.config import Settings
from service.split.channel import EngineChannel, EngineUnavailable, UnsendableHead
from service.split.pixel_ring import PixelLease, PixelRing
from service.split.predecode import IMAGE_ROUTES, Rewritten, rewrite
from service.split.wire import FRONT_END_HEADER, GENERATION_HEADER, PREDECODED_HEADER, SPECS_PATH

log = logging.getLogger("service")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Headers of one hop, not of the request or answer: each side of the front-end has its own.
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"expect",
                  b"proxy-connection", b"content-length"})  # fmt: skip
# Never from a client: pixels for a digest of its choosing, or a look at the engine's internals.
_CLIENT_DROPS = _HOP | {PREDECODED_HEADER.encode(), FRONT_END_HEADER.encode()}
_GENERATION = GENERATION_HEADER.encode()
_ENGINE_DROPS = _HOP | {_GENERATION}
# Bodies up to this size are decoded on the event loop; larger ones (several or large images) in
# the decode threads, so one large request does not stall the others' relaying.
INLINE_BODY_BYTES = 64 * 1024
_UNREACHABLE = json.dumps(
    {"error": {"code": "not_ready", "message": "the engine process is not answering; retry", "field": None}}
).encode()


class FrontEnd:
    """The front-end's ASGI application."""

    def __init__(self, settings: Settings, engine_socket: str) -> None:
        self.settings = settings
        self.engine_socket = engine_socket
        self.client: httpx.AsyncClient | None = None  # for streamed request bodies
        self.channel = EngineChannel(engine_socket)  # for whole ones: lighter (service.split.channel)
        self.table: dict[str, Any] | None = None
        self.ring = PixelRing.open()  # pixels of large images by shared memory (service.split.pixel_ring)
        self.generation: str | None = None
        self.decode_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.batching.decode_workers, thread_name_prefix="decode"
        )
        shared = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        self.registry = None if shared else CollectorRegistry()
        self.requests = Counter(
            "clip_frontend_requests_total",
            "Requests a front-end process relayed to the engine (workers > 1), by what it did with the body: "
            "predecoded (its images sent as pixels), as_sent, or engine_unreachable (answered 503 itself).",
            ["outcome"],
            registry=self.registry,
        )
        self._relayed: dict[str, Any] = {}  # each outcome's series, looked up on its first use only
        self.images = Counter(
            "clip_frontend_predecoded_images_total",
            "Images a front-end process decoded to model-input pixels before relaying their request.",
            registry=self.registry,
        )

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._relay(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.client = httpx.AsyncClient(
                    transport=httpx.AsyncHTTPTransport(uds=self.engine_socket),
                    base_url="http://engine",
                    # The engine bounds each request's own time; idle connections expire here
                    # before the engine would close them, so none is closed under a request.
                    timeout=httpx.Timeout(None),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=60),
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                self.channel.close()
                self.decode_pool.shutdown(wait=False, cancel_futures=True)
                if self.ring is not None:
                    self.ring.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers, length = _client_headers(scope["headers"])
        content: bytes | AsyncIterator[bytes] = b""
        outcome = "as_sent"
        shared: PixelLease | None = None
        if scope["method"] == "POST" and length is not None and length.isdigit():
            if scope["path"] in IMAGE_ROUTES and int(length) <= self.settings.limits.max_body_bytes and is_json(scope):
                body = await read_body(receive)
                rewritten = await self._predecode(scope["path"], body)
                if rewritten is not None:
                    content, shared = rewritten.body, rewritten.shared
                    headers.append((PREDECODED_HEADER.encode(), str(rewritten.manifest_length).encode()))
                    self.images.inc(rewritten.images)
                    outcome = "predecoded"
                else:
                    content = body
            else:
                content = stream_body(receive)  # the engine reads (or refuses) it as it always has
                headers.append((b"content-length", length))
        elif scope["method"] not in ("GET", "HEAD", "OPTIONS", "DELETE"):
            content = stream_body(receive)
        target = scope["raw_path"].decode("latin-1") + (f"?{scope['query_string'].decode('latin-1')}"
                                                         if scope["query_string"] else "")  # fmt: skip
        await self._forward(scope, target, headers, content, outcome, send)
        # The engine has read the pixels once it answered (or could not: it was not there). A relay
        # cancelled mid-way (a shutdown) keeps its region: the engine may not have read it yet.
        if shared is not None:
            shared.release()

    async def _predecode(self, path: str, body: bytes) -> Rewritten | None:
        if self.table is None:
            await self._read_table()
        table, settings, ring = self.table, self.settings, self.ring
        if len(body) <= INLINE_BODY_BYTES:
            return rewrite(path, body, table, settings, ring)
        decoding = self.decode_pool.submit(rewrite, path, body, table, settings, ring)
        try:
            return await asyncio.wrap_future(decoding)
        except asyncio.CancelledError:
            decoding.add_done_callback(_release_unsent)  # the client left while its images decoded
            raise

    async def _read_table(self) -> None:
        assert self.client is not None
        try:
            response = await self.client.get(SPECS_PATH, headers={FRONT_END_HEADER: "1"})
            self.table = response.json()
            self.generation = response.headers.get(GENERATION_HEADER)
        except (httpx.HTTPError, ValueError):
            self.table = None  # the engine answers the request itself, or says it is not there

    async def _forward(
        self,
        scope: Scope,
        target: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes],
        outcome: str,
        send: Send,
    ) -> None:
        if isinstance(content, bytes):
            try:
                status, answer, body = await self.channel.request(scope["method"], target, headers, content)
            except UnsendableHead:
                pass  # a head HTTP's grammar refuses, though uvicorn read it: relayed by httpx below
            except EngineUnavailable:
                await self._unreachable(send)
                return
            else:
                self._count(outcome)
                answer, generation, length = _engine_headers(answer)
                self._note_generation(generation)
                if scope["method"] == "HEAD" and length is not None:  # the length of the GET's body
                    await send({"type": "http.response.start", "status": status,
                                "headers": [*answer, (b"content-length", length)]})  # fmt: skip
                    await send({"type": "http.response.body", "body": b""})
                    return
                if scope["path"] == "/metrics" and status == 200:
                    body += self._own_metrics()
                await _answer(send, status, body, answer)
                return
        assert self.client is not None
        request = self.client.build_request(scope["method"], target, headers=headers, content=content)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TransportError:
            await self._unreachable(send)
            return
        self._count(outcome)
        try:
            self._note_generation(response.headers.get(GENERATION_HEADER))
            answer = [(k, v) for k, v in response.headers.raw if k.lower() not in _ENGINE_DROPS]
            if scope["path"] == "/metrics" and response.status_code == 200:
                body = await response.aread() + self._own_metrics()
                await _answer(send, 200, body, answer)
                return
            if "content-length" in response.headers:
                answer.append((b"content-length", response.headers["content-length"].encode()))
            await send({"type": "http.response.start", "status": response.status_code, "headers": answer})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    def _count(self, outcome: str) -> None:
        series = self._relayed.get(outcome)
        if series is None:  # ``labels()`` checks and locks on every call: once per outcome
            series = self._relayed[outcome] = self.requests.labels(outcome=outcome)
        series.inc()

    def _note_generation(self, generation: str | None) -> None:
        if generation != self.generation:  # the engine's loaded versions changed: re-read their specs
            self.table, self.generation = None, generation

    async def _unreachable(self, send: Send) -> None:
        self._count("engine_unreachable")
        await _answer(send, 503, _UNREACHABLE, [(b"content-type", b"application/json"), (b"retry-after", b"1")])

    def _own_metrics(self) -> bytes:
        if self.registry is not None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)


def _release_unsent(decoding: concurrent.futures.Future[Rewritten | None]) -> None:
    if not decoding.cancelled() and decoding.exception() is None:
        rewritten = decoding.result()
        if rewritten is not None and rewritten.shared is not None:
            rewritten.shared.release()


def _client_headers(raw: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
    """The client's headers to relay, and its content-length (the first), in one pass."""
    headers, length = [], None
    for name, value in raw:
        if name not in _CLIENT_DROPS:
            headers.append((name, value))
        elif name == b"content-length" and length is None:
            length = value
    return headers, length


def _engine_headers(raw: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], str | None, bytes | None]:
    """The engine's answer headers to relay (names lower-cased), its generation and its
    content-length, in one pass."""
    headers, generation, length = [], None, None
    for name, value in raw:
        if name not in _ENGINE_DROPS:
            headers.append((name, value))
        elif name == _GENERATION and generation is None:
            generation = value.decode()
        elif name == b"content-length" and length is None:
            length = value
    return headers, generation, length


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """``headers`` without a content-length (every caller dropped it with the other hop headers)."""
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> None:
    """``python -m service.split.frontend SOCKET PORT [service flags...]`` (started by the supervisor)."""
    import uvicorn

    from service.http_server import guarded_protocol
    from service.split.supervisor import child_settings, reuse_port_socket

    socket_path, port, settings = argv[0], int(argv[1]), child_settings(argv[2:])
    listener = reuse_port_socket(settings.host, port)
    listener.listen(2048)
    config = uvicorn.Config(
        FrontEnd(settings, socket_path),
        http=guarded_protocol(  # type: ignore[arg-type]
            settings.max_header_bytes, settings.header_timeout_s, settings.body_idle_timeout_s, settings.body_timeout_s
        ),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=int(max(1, settings.keep_alive_s)),
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        log_level=settings.log_level,
        access_log=False,  # the engine logs one structured line per request
        server_header=False,  # the engine's date and server headers are relayed
        date_header=False,
    )
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    main(sys.argv[1:])
