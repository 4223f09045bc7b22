"""Security headers through a real uvicorn server: every answer says ``nosniff`` and may not be
framed; every HTML page has a Content-Security-Policy that lets it load only this server's files
(tests/service/test_playground_browser.py checks in Chromium that the pages still work under it)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

PAGES = ["/", "/playground/index.html", "/docs", "/redoc"]
# One file under each static mount.
STATIC = ["/docs/assets/swagger-ui.css", "/redoc/assets/redoc.standalone.js", "/playground/app.js"]


@pytest.fixture(scope="module")
def running(serve_app: Any, tiny_store: Path) -> Iterator[Any]:
    with serve_app(store=str(tiny_store), model="tiny@production") as server:
        yield server


@pytest.fixture(scope="module")
def client(running: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.url, timeout=30) as c:
        yield c


def _policy(header: str) -> dict[str, list[str]]:
    directives = (d.split() for d in header.split(";") if d.strip())
    return {name: sources for name, *sources in directives}


def _inline_scripts(html: str) -> list[str]:
    return re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)


@pytest.mark.parametrize("page", PAGES)
def test_every_html_page_has_a_policy_of_its_own_files_and_cannot_be_framed(client: httpx.Client, page: str) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    policy = _policy(r.headers["content-security-policy"])
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["default-src"] == ["'self'"] and policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]
    allowed = re.compile(r"'self'|'none'|'unsafe-inline'|'sha256-[A-Za-z0-9+/=]+'|data:|blob:")
    for name, sources in policy.items():
        assert all(allowed.fullmatch(s) for s in sources), f"{page}: {name} {sources} allows another host"
    # Scripts: this server's files, and inline ones only by hash (never 'unsafe-inline' or eval).
    scripts = policy.get("script-src", policy["default-src"])
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
    for script in _inline_scripts(r.text):
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in scripts, f"{page} has an inline script its policy blocks"


def test_every_answer_says_nosniff_and_no_framing(client: httpx.Client, make_image: Any) -> None:
    answers = [client.get(path) for path in ["/healthz", "/readyz", "/models", "/limits", "/metrics", "/openapi.json"]]
    answers += [client.get(path) for path in STATIC]
    answers += [
        client.get("/nowhere"),  # 404
        client.post("/healthz"),  # 405
        client.post("/embed", content=b"{", headers={"Content-Type": "application/json"}),  # 422
        client.post("/embed", json={"images": [make_image()]}),  # 200
    ]
    assert {r.status_code for r in answers} == {200, 404, 405, 422}
    for r in answers:
        assert r.headers["x-content-type-options"] == "nosniff", r.request.url
        assert r.headers["x-frame-options"] == "DENY", r.request.url
