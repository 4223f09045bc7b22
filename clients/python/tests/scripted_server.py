"""A real HTTP server on 127.0.0.1 that answers from a script and records what it received.

The client is tested over real sockets (no mock transport), so timeouts, headers, connection
reuse and retries behave as they do against the service.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


class _Server(ThreadingHTTPServer):
    # The default backlog of 5 makes the kernel drop connects of concurrent tests (1 s resend).
    request_queue_size = 128
    daemon_threads = True


class ScriptedServer:
    """Answers each path with its queued replies in order; the last reply repeats."""

    def __init__(self, port: int = 0) -> None:
        self.replies: dict[str, deque[Reply]] = {}
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", port), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll interval keeps shutdown (once per test) fast.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def script(self, path: str, *replies: Reply) -> None:
        with self.lock:
            self.replies[path] = deque(replies)

    def hits(self, path: str) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def _next(self, path: str) -> Reply:
        with self.lock:
            queue = self.replies.get(path)
            if not queue:
                return Reply(404, {"error": {"code": "not_found", "message": f"no route {path}", "field": None}})
            return queue.popleft() if len(queue) > 1 else queue[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                seen = Seen(self.command, parts.path, parse_qs(parts.query),
                            {k.lower(): v for k, v in self.headers.items()}, body)  # fmt: skip
                with server.lock:
                    server.requests.append(seen)
                reply = server._next(parts.path)
                if reply.delay:
                    threading.Event().wait(reply.delay)
                payload = b"" if reply.body is None else (
                    reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                )  # fmt: skip
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _serve
            do_POST = _serve

        return Handler

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def envelope(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}
