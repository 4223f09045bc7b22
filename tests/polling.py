"""Waiting for a server to reach a state (shared by the tests that poll /models, /metrics or logs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "the condition") -> None:
    """Poll ``condition`` every 50 ms until it is truthy; fail the test after ``timeout`` seconds,
    naming ``what`` it waited for (a bound, not a timing assertion: only a state never reached fails)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def wait_ready(url: str, timeout: float = 60.0) -> None:
    """Until the server at ``url`` answers ``/readyz`` with 200."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready within {timeout}s")
