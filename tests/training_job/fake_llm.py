"""A stand-in OpenAI-compatible chat server on 127.0.0.1 that answers with good texts and junk.

It fails the first request with 503 (clients must retry) and then cycles through scripted answers:
a clean comparative, one followed by a next "Q:", code, markup, non-ASCII text, a too-short one,
and a note after the sentence. Every request is counted, so tests can check what was sent.

Run on its own (docs/tutorial.md) to try ``clip-train comparatives --generator llm`` without a model:

    .venv/bin/python -m tests.training_job.fake_llm --port 8001
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GOOD = "The first shows a {a} with long sleeves and a heavy collar, while the second shows a {b} with a light fabric."
ANSWERS = [
    GOOD,
    GOOD + "\nQ: How does a photo of a hat differ from a photo of a cap?\nA: The first ...",
    "```python\nprint('The first shows a {a}, while the second shows a {b} and some more words here')\n```",
    "<p>The first shows a {a} with buttons down the front, while the second shows a {b}.</p>",
    "The first shows a {a} with a collar ✨, while the second shows a {b} without one at all, clearly.",
    "The first is a {a}.",
    GOOD + " Note: these are only typical differences.",
    "**The first** shows a {a} with a zip, while the second shows a {b} that is pulled over the head."
    " I hope this helps!",
]


class FakeLLM:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_first = True
        self.lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append(body)
            if self.fail_first:
                self.fail_first = False
                return 503, {"error": {"message": "overloaded"}}
            n = len(self.requests)
        prompt = body["messages"][-1]["content"]
        last_q = prompt.rsplit("Q: How does a photo of ", 1)[1]
        a, b = (part.split(" ", 1)[1] for part in last_q.split("?")[0].split(" differ from a photo of "))
        text = ANSWERS[n % len(ANSWERS)].format(a=a, b=b)
        return 200, {"object": "chat.completion", "model": body.get("model"),
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}  # fmt: skip


@contextmanager
def fake_llm_server(port: int = 0) -> Iterator[tuple[str, FakeLLM]]:
    fake = FakeLLM()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            body["_authorization"] = self.headers.get("authorization")
            status, payload = fake.answer(body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", fake
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    import argparse
    import time

    parser = argparse.ArgumentParser(description="A stand-in OpenAI-compatible chat server on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=8001)
    port = parser.parse_args().port
    with fake_llm_server(port) as (url, served):
        print(f"serving {url} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print(f"{len(served.requests)} request(s) answered")
