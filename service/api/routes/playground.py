"""The playground page at ``/``: static HTML, JavaScript and CSS from the package (no build step,
nothing loaded from elsewhere) that calls the public JSON API like any other client.

The page and its files are public; the API calls it makes need a key like any other call (the
page asks for one when the API answers 401). Off with ``playground=false``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

PLAYGROUND_DIR = Path(__file__).resolve().parents[2] / "static" / "playground"
# The page's Content-Security-Policy is the one for every HTML page (service/api/security.py): this
# server's own files only, images read in the browser (data: URIs) and heatmaps (blob: URLs), no framing.
router = APIRouter(include_in_schema=False)


@router.get("/")
async def playground() -> FileResponse:
    return FileResponse(
        PLAYGROUND_DIR / "index.html",
        headers={"Cache-Control": "no-cache"},
    )


def install_playground(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/playground", StaticFiles(directory=PLAYGROUND_DIR), name="playground")
