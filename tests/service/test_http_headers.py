"""Security headers and HEAD through a real uvicorn server: every answer says ``nosniff`` and may not
be framed; every HTML page has a Content-Security-Policy that lets it load only this server's files
(tests/service/test_playground_browser.py checks in Chromium that the pages still work under it);
``HEAD`` answers on every ``GET`` route with the ``GET`` answer's status and headers, no body."""

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


def test_an_unexpected_error_says_nosniff_too(serve_app: Any, tiny_store: Path) -> None:
    # Starlette renders a 500 outside every middleware of the app.
    def with_a_failing_route(app: Any) -> Any:
        async def fail() -> None:
            raise RuntimeError("a bug")

        app.add_api_route("/fail", fail)
        return app

    with serve_app(store=str(tiny_store), model="tiny@production", wrap=with_a_failing_route) as server:
        r = httpx.get(f"{server.url}/fail")
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"


def _get_paths(running: Any) -> list[str]:
    """Every GET route of the app (path parameters filled in), and a file of each static mount."""
    paths = []
    routes = list(running.app.routes)
    while routes:
        route = routes.pop(0)
        if hasattr(route, "original_router"):  # FastAPI keeps an included router whole
            routes += route.original_router.routes
        elif "GET" in (getattr(route, "methods", None) or ()):
            paths.append(route.path.replace("{name}", "tiny"))
    assert "{" not in "".join(paths), paths  # a new path parameter: give it a value above
    return paths + STATIC


def test_head_answers_every_get_route_with_its_headers_and_no_body(running: Any, client: httpx.Client) -> None:
    paths = _get_paths(running)
    assert {"/", "/healthz", "/readyz", "/models", "/models/tiny", "/docs"} <= set(paths)
    assert client.put("/collections/tiny", json={}).status_code in (201, 409)  # GET /collections/tiny answers
    for path in paths:
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, (path, head.status_code)
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path != "/metrics":  # its counters move between the two requests
            assert head.headers["content-length"] == got.headers["content-length"], path
        assert head.headers["x-content-type-options"] == "nosniff", path
    # A route without GET has no HEAD either; metrics see a HEAD as a HEAD, on its route.
    assert client.head("/embed").status_code == 405
    assert client.head("/nowhere").status_code == 404
    metrics = client.get("/metrics").text
    assert re.search(r'clip_http_requests_total\{[^}]*method="HEAD"[^}]*route="/healthz"', metrics) or re.search(
        r'clip_http_requests_total\{[^}]*route="/healthz"[^}]*method="HEAD"', metrics
    )


def test_head_needs_a_key_where_get_does(serve_app: Any, tiny_store: Path) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", api_keys=["k1"]) as server:
        assert httpx.head(f"{server.url}/models").status_code == 401
        assert httpx.head(f"{server.url}/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        assert httpx.head(f"{server.url}/healthz").status_code == 200  # public, like its GET
