"""/docs (Swagger UI) and /redoc (ReDoc) work offline: every script, style and icon they reference
is served by the service itself, and none points off the host; with API keys they stay public."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest


def _assets(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html) + re.findall(
        r"""url:\s*['"]([^'"]+)['"]""", html
    )


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_every_asset_of_the_reference_pages_is_served_locally(base_url: str, page: str) -> None:
    r = httpx.get(f"{base_url}{page}")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assets = _assets(r.text)
    assert len(assets) >= 2, assets  # at least a script and the schema or a style
    for ref in assets:
        url = urljoin(f"{base_url}{page}", ref)
        assert urlsplit(url).netloc == urlsplit(base_url).netloc, f"{page} loads {ref} from another host"
        fetched = httpx.get(url)
        assert fetched.status_code == 200 and fetched.content, f"{page}: {ref} -> {fetched.status_code}"
    if page == "/docs":
        assert "/docs/assets/swagger-ui-bundle.js" in assets
    else:
        assert "/redoc/assets/redoc.standalone.js" in assets and "fonts.googleapis" not in r.text


def test_the_pages_and_their_assets_need_no_key(serve_app: Any, tiny_store: Path) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", api_keys=["k"]) as running:
        for path in ("/docs", "/redoc", "/docs/assets/swagger-ui.css", "/redoc/assets/redoc.standalone.js"):
            assert httpx.get(f"{running.url}{path}").status_code == 200, path
        assert httpx.get(f"{running.url}/models").status_code == 401  # the API itself still needs one
