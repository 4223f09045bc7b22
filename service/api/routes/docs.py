"""The API reference pages (Swagger UI at /docs, ReDoc at /redoc) with every asset served from the
package: they work on a machine without internet, and reveal nothing to a CDN.

Swagger UI's files (5.x: it reads the OpenAPI 3.1 document FastAPI writes; the 4.x bundle of the
``swagger-ui-bundle`` package said "Unable to render this definition") come from the
``fastapi-offline`` package; ReDoc's standalone script is vendored under ``service/static/redoc``
with its licence.

Each page has a Content-Security-Policy that lets it load only this server's files. Swagger UI's
page starts the bundle with an inline script, allowed by its hash (computed from the page itself,
so the policy follows the page FastAPI renders); ReDoc styles itself with ``<style>`` elements it
writes at run time (styled-components) and runs its search in a worker made from a ``blob:`` URL,
so its policy allows inline styles and blob: workers (no inline scripts).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

REDOC_DIR = Path(__file__).resolve().parents[2] / "static" / "redoc"
SWAGGER_UI_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
router = APIRouter(include_in_schema=False)

_COMMON_POLICY = "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"


def inline_script_hashes(html: str) -> list[str]:
    """CSP sources (``'sha256-...'``) for each inline ``<script>`` of ``html``."""
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    return [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts]


SWAGGER_HTML = bytes(
    get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="CLIP service API",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon.png",
    ).body
)
SWAGGER_POLICY = (
    f"default-src 'self'; script-src 'self' {' '.join(inline_script_hashes(SWAGGER_HTML.decode()))}; "
    f"img-src 'self' data:; {_COMMON_POLICY}"
)

REDOC_HTML = bytes(
    get_redoc_html(
        openapi_url="/openapi.json",
        title="CLIP service API",
        redoc_js_url="/redoc/assets/redoc.standalone.js",
        redoc_favicon_url="/docs/assets/favicon.png",
        with_google_fonts=False,
    ).body
)
REDOC_POLICY = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
    f"{_COMMON_POLICY}"
)


# ReDoc's sidebar footer shows a logo from its CDN: the page must ask nothing of another host, so
# the script is served with that address replaced by an inline blank image (the vendored file is
# kept as released, with its licence).
REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
BLANK_SVG = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' width='1' height='1'/%3E"


@functools.cache
def redoc_js() -> bytes:
    """The patched script, read on first request: 1 MB that a server nobody reads the docs of never loads."""
    return (REDOC_DIR / "redoc.standalone.js").read_bytes().replace(REDOC_LOGO, BLANK_SVG)


@router.get("/redoc/assets/redoc.standalone.js")
async def redoc_script() -> Response:
    return Response(redoc_js(), media_type="text/javascript; charset=utf-8")


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return HTMLResponse(SWAGGER_HTML, headers={"Content-Security-Policy": SWAGGER_POLICY})


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return HTMLResponse(REDOC_HTML, headers={"Content-Security-Policy": REDOC_POLICY})


def install_docs(app: FastAPI) -> None:
    """Mount the pages and their static files (the app is created with docs_url=None, redoc_url=None)."""
    app.include_router(router)
    app.mount("/docs/assets", StaticFiles(directory=SWAGGER_UI_DIR), name="swagger-ui-assets")
    app.mount("/redoc/assets", StaticFiles(directory=REDOC_DIR), name="redoc-assets")
