"""Texts of any size cost bounded work and memory: the 200 KB /embed of 2,000-letter words answers
like any batch, reports every text truncated, and the service keeps digests, not texts."""

from __future__ import annotations

import random
import string
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def _words(n: int, letters: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_lowercase, k=letters)) for _ in range(n)]


def test_a_body_of_huge_words_is_answered_and_reported_truncated(tiny_store: Path, serve_app: Any) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production") as running:
        with httpx.Client(base_url=running.url, timeout=120) as client:
            client.post("/embed", json={"texts": ["warm up"]}).raise_for_status()
            t0 = time.perf_counter()
            normal = [" ".join(_words(40, 5, seed=100 + i)) for i in range(100)]  # ordinary words, a full context
            client.post("/embed", json={"texts": normal}).raise_for_status()
            baseline = time.perf_counter() - t0
            huge = _words(100, 2000, seed=1)  # ~200 KB: held the model thread ~36 s before the bound
            concurrent: list[float] = []

            def small_requests() -> None:
                with httpx.Client(base_url=running.url, timeout=120) as other:
                    for k in range(5):
                        t0 = time.perf_counter()
                        other.post("/embed", json={"texts": [f"a red circle number {k}"]}).raise_for_status()
                        concurrent.append(time.perf_counter() - t0)

            side = threading.Thread(target=small_requests)
            t0 = time.perf_counter()
            side.start()
            r = client.post("/embed", json={"texts": huge})
            elapsed = time.perf_counter() - t0
            side.join()
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["truncated"] == [True] * 100 and len(body["embeddings"]) == 100
            latencies = ", ".join(f"{s * 1000:.0f}" for s in concurrent)
            print(f"100 texts of 40 ordinary words: {baseline * 1000:.0f} ms; 200 KB of 2,000-letter words: "
                  f"{elapsed * 1000:.0f} ms, concurrent small requests {latencies} ms")  # fmt: skip
            # Answered again from the cache, the texts are still reported truncated.
            again = client.post("/embed", json={"texts": huge[:3]}).json()
            assert again["truncated"] == [True] * 3
            fits = client.post("/embed", json={"texts": ["a red circle", "x" * 1000, "so funny " + "ha" * 40]}).json()
            assert fits["truncated"] == [False, True, False]  # a long word that fits is not cut
        memo = running.services.pipeline._truncation
        assert memo and all(len(digest) == 64 and len(huge[0]) > 64 for _, digest in memo)  # digests only
