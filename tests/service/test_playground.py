"""The playground page at ``/``: served from the package with every file it references, nothing
from another host, public under API keys while the API calls it makes are not, off with a setting,
and absent from the API contract. (tests/service/test_playground_browser.py drives it in Chromium.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
PLAYGROUND = REPO / "service" / "static" / "playground"


def _references(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)


def test_the_page_and_every_file_it_references_are_served_by_the_service(base_url: str) -> None:
    page = httpx.get(f"{base_url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # Nothing may load from elsewhere: the browser enforces it too.
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    refs = [ref for ref in _references(page.text) if ref != "docs"]
    assert {"playground/app.js", "playground/style.css"} <= set(refs)
    for ref in refs:
        url = urljoin(f"{base_url}/", ref)
        assert urlsplit(url).netloc == urlsplit(base_url).netloc, f"the page loads {ref} from another host"
        fetched = httpx.get(url)
        assert fetched.status_code == 200 and fetched.content, f"{ref} -> {fetched.status_code}"
    script = httpx.get(f"{base_url}/playground/app.js").text
    assert "http://" not in script and "https://" not in script  # API calls are relative to the page


def test_every_example_the_page_offers_is_a_shapes_world_image_it_serves(base_url: str) -> None:
    script = (PLAYGROUND / "app.js").read_text(encoding="utf-8")
    offered = re.findall(r'\["([a-z_]+\.png)", "[^"]+"\]', script)
    html = (PLAYGROUND / "index.html").read_text(encoding="utf-8")
    preset = re.findall(r'data-example="([^"]+)"', html)
    assert len(offered) >= 5 and set(preset) <= set(offered)
    for name in offered:
        r = httpx.get(f"{base_url}/playground/examples/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == "image/png", name
        assert len(r.content) < 4096, f"{name} should stay tiny ({len(r.content)} bytes)"
        # The same file as the repository's examples/ (one set of pictures for docs and page).
        assert r.content == (REPO / "examples" / name).read_bytes(), name


def test_the_page_is_public_under_api_keys_but_its_api_calls_are_not(serve_app: Any, tiny_store: Path) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", api_keys=["k1"]) as running:
        for path in ("/", "/playground/app.js", "/playground/style.css", "/playground/examples/red.png"):
            assert httpx.get(f"{running.url}{path}").status_code == 200, path
        refused = httpx.get(f"{running.url}/models")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert httpx.get(f"{running.url}/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        # Static files only: the prefix gives no way round the key to an API route.
        assert httpx.get(f"{running.url}/playground/../models").status_code in (401, 404)


def test_the_setting_turns_the_page_off(serve_app: Any, tiny_store: Path) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", playground=False) as running:
        for path in ("/", "/playground/app.js"):
            r = httpx.get(f"{running.url}{path}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
        assert httpx.get(f"{running.url}/healthz").status_code == 200


def test_the_page_is_not_part_of_the_api_contract(base_url: str) -> None:
    paths = httpx.get(f"{base_url}/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/playground") for p in paths)


def test_example_images_are_small_shapes_world_pictures() -> None:
    files = sorted((REPO / "examples").glob("*.png"))
    assert len(files) >= 8
    for path in files:
        assert path.stat().st_size < 4096, path.name
        with Image.open(path) as im:
            assert im.size == (128, 128) and im.format == "PNG", path.name
