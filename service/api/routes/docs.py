"""The API reference pages (Swagger UI at /docs, ReDoc at /redoc) with every asset served from the
package: they work on a machine without internet, and reveal nothing to a CDN.

Swagger UI's files come from the ``swagger-ui-bundle`` package; ReDoc's standalone script is
vendored under ``service/static/redoc`` with its licence.
"""

from __future__ import annotations

from pathlib import Path

import swagger_ui_bundle
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

REDOC_DIR = Path(__file__).resolve().parents[2] / "static" / "redoc"
router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="CLIP service API",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon-32x32.png",
    )


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="CLIP service API",
        redoc_js_url="/redoc/assets/redoc.standalone.js",
        redoc_favicon_url="/docs/assets/favicon-32x32.png",
        with_google_fonts=False,
    )


def install_docs(app: FastAPI) -> None:
    """Mount the pages and their static files (the app is created with docs_url=None, redoc_url=None)."""
    app.include_router(router)
    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger-ui-assets")
    app.mount("/redoc/assets", StaticFiles(directory=REDOC_DIR), name="redoc-assets")
