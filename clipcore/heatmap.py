"""DCSM heatmaps: the image beside one patch-grid map per text token, as a PNG.

Layout (all sizes in pixels, see ``heatmap_size``): a title line with the text and its score;
below it the model's input image (``IMAGE_PX`` square) and, to its right, one ``CELL`` square
map per text position (start token, the text's tokens, end token) in rows of ``COLUMNS``, each
labelled with its token text. A map shows that token's row of the z-scored token x patch map
over the image's patch grid (the class-token column is left out): red is above the map's mean,
blue below, white at it, saturating at +-``CLIP_Z``. Functional words (left, not, ...) are
scored through fixed rows, not through what the image shows, so their maps are framed in
orange and their labels bracketed ("[left]").

``heatmap_png`` is pure (numpy + PIL); ``render_heatmap_png`` computes the map with a loaded
model bundle first, rounding features exactly as the service's cache does, so the picture
equals what ``POST /score/dense/heatmap`` returns for the same image and text.
"""

from __future__ import annotations

import io
import math
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from clipcore.methods.common import quantize

if TYPE_CHECKING:
    from clipcore.models.bundle import ModelBundle

__all__ = [
    "CELL",
    "COLUMNS",
    "IMAGE_PX",
    "colourise",
    "heatmap_png",
    "heatmap_size",
    "heatmap_title",
    "render_heatmap_png",
]

IMAGE_PX = 192
CELL = 64
LABEL_H = 16
PAD = 8
TITLE_H = 20
COLUMNS = 8
CLIP_Z = 3.0
BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)
FUNCTIONAL = (230, 120, 0)
FRAME = (190, 190, 190)
BORDER = 3
# Pillow's built-in FreeType font: at its default 10 px the spaces shrink to a pixel and a caption's
# words run together ("to the leftofa blue square"); at 13 px every space shows.
FONT_PX = 13


def heatmap_size(n_tokens: int) -> tuple[int, int]:
    """(width, height) of the PNG for a text with ``n_tokens`` map rows."""
    if n_tokens < 1:
        raise ValueError("a heatmap needs at least one token")
    cols = min(n_tokens, COLUMNS)
    rows = math.ceil(n_tokens / COLUMNS)
    width = PAD + IMAGE_PX + PAD + cols * (CELL + PAD)
    height = TITLE_H + PAD + max(IMAGE_PX, rows * (CELL + LABEL_H + PAD) - PAD) + PAD
    return width, height


def heatmap_title(text: str, score: float) -> str:
    return f'DCSM {score:+.3f}  "{text}"'


def colourise(values: np.ndarray) -> np.ndarray:
    """z-scores (any shape) -> uint8 RGB (shape + (3,)): blue (-) / white (0) / red (+)."""
    t = np.clip(np.asarray(values, dtype=np.float32) / CLIP_Z, -1.0, 1.0)[..., None]
    white = np.array([255.0, 255.0, 255.0], dtype=np.float32)
    red = np.array([200.0, 30.0, 30.0], dtype=np.float32)
    blue = np.array([30.0, 60.0, 200.0], dtype=np.float32)
    out = np.where(t >= 0, white + t * (red - white), white - t * (blue - white))
    return np.rint(out).astype(np.uint8)  # type: ignore[no-any-return]


def one_line(text: str) -> str:
    """``text`` on one line: line breaks, tabs and other control characters become single spaces
    (Pillow measures and draws single lines only; a caption may hold any of them)."""
    return " ".join("".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text).split())


def _fit(draw: ImageDraw.ImageDraw, text: str, width: int, font: ImageFont.ImageFont | ImageFont.FreeTypeFont) -> str:
    """``text`` on one line, cut (with an ellipsis) to fit ``width`` pixels."""
    text = one_line(text)
    if draw.textlength(text, font=font) <= width:
        return text
    # The longest prefix that fits with the ellipsis, by bisection (texts may be thousands of
    # characters long; measuring one character less at a time would be quadratic).
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if draw.textlength(text[:mid] + "...", font=font) <= width:
            low = mid
        else:
            high = mid - 1
    return text[:low] + "..."


def heatmap_png(
    image: np.ndarray,
    maps: np.ndarray,
    labels: Sequence[str],
    functional: Sequence[bool],
    *,
    title: str = "",
) -> bytes:
    """The PNG for one text: ``image`` (S, S, 3) uint8 as the model saw it; ``maps`` (T, 1+P)
    z-scored rows of the map (class token first, P a square grid); one label and functional
    flag per row."""
    maps = np.asarray(maps, dtype=np.float32)
    n, columns = maps.shape
    grid = math.isqrt(columns - 1)
    if grid * grid != columns - 1:
        raise ValueError(f"maps need 1 + grid^2 columns, got {columns}")
    if len(labels) != n or len(functional) != n:
        raise ValueError(f"{n} map rows need as many labels and flags, got {len(labels)} and {len(functional)}")
    width, height = heatmap_size(n)
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=FONT_PX)
    draw.text((PAD, 3), _fit(draw, title, width - 2 * PAD, font), fill=INK, font=font)
    top = TITLE_H + PAD
    picture = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).convert("RGB")
    canvas.paste(picture.resize((IMAGE_PX, IMAGE_PX), Image.Resampling.BICUBIC), (PAD, top))
    left = PAD + IMAGE_PX + PAD
    # Nearest-neighbour upscaling keeps every patch a visible square.
    cells = colourise(maps[:, 1:].reshape(n, grid, grid))
    for k in range(n):
        x = left + (k % COLUMNS) * (CELL + PAD)
        y = top + (k // COLUMNS) * (CELL + LABEL_H + PAD)
        cell = Image.fromarray(cells[k]).resize((CELL, CELL), Image.Resampling.NEAREST)
        canvas.paste(cell, (x, y))
        label = labels[k]
        if functional[k]:
            draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), outline=FUNCTIONAL, width=BORDER)
            label = f"[{label}]"
        else:  # a thin frame, so a map near the mean (white) still reads as a map
            draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), outline=FRAME, width=1)
        colour = FUNCTIONAL if functional[k] else INK
        draw.text((x, y + CELL + 1), _fit(draw, label, CELL + PAD - 2, font), fill=colour, font=font)
    buf = io.BytesIO()
    canvas.save(buf, "PNG", optimize=False)
    return buf.getvalue()


def render_heatmap_png(bundle: ModelBundle, image: Image.Image, text: str) -> bytes:
    """Heatmap of ``text`` on ``image`` with a bundle that has a DCSM component (CLI use)."""
    if bundle.dcsm is None:
        raise ValueError(f"{bundle.ref} has no DCSM component")
    pixels = bundle.preprocess(image)
    image_tokens = quantize(bundle.encode_dense_images(np.stack([pixels]))[0])
    text_tokens = quantize(bundle.encode_dense_texts([text]))
    layout = bundle.dense_layouts([text])[0]
    scores, maps = bundle.score_dense(image_tokens, text_tokens, [layout])
    return heatmap_png(
        pixels,
        maps[0][layout.valid],
        layout.labels,
        list(layout.row_index[layout.valid] >= 0),
        title=heatmap_title(text, float(scores[0])),
    )
