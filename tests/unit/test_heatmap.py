"""The heatmap drawing (pure numpy + PIL): layout size, colours, functional-token marking."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from clipcore.heatmap import (
    BORDER,
    CELL,
    CLIP_Z,
    COLUMNS,
    FUNCTIONAL,
    IMAGE_PX,
    LABEL_H,
    PAD,
    TITLE_H,
    colourise,
    heatmap_png,
    heatmap_size,
)


def _maps(n: int, grid: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1 + grid * grid)).astype(np.float32)


def _image(size: int = 32) -> np.ndarray:
    return np.full((size, size, 3), 200, dtype=np.uint8)


def test_size_grows_by_columns_then_rows() -> None:
    one = heatmap_size(1)
    assert one == (PAD + IMAGE_PX + PAD + CELL + PAD, TITLE_H + PAD + IMAGE_PX + PAD)
    full_row = heatmap_size(COLUMNS)
    assert full_row[0] == one[0] + (COLUMNS - 1) * (CELL + PAD) and full_row[1] == one[1]
    assert heatmap_size(COLUMNS + 1)[0] == full_row[0]  # wraps instead of widening
    many = heatmap_size(4 * COLUMNS)  # four rows of cells are taller than the image
    assert many[1] == TITLE_H + PAD + 4 * (CELL + LABEL_H + PAD) - PAD + PAD
    with pytest.raises(ValueError):
        heatmap_size(0)


def test_colourise_is_diverging_and_saturates() -> None:
    rgb = colourise(np.array([0.0, CLIP_Z, -CLIP_Z, 10 * CLIP_Z, np.float32(0.5)]))
    assert rgb.dtype == np.uint8 and rgb.shape == (5, 3)
    assert tuple(rgb[0]) == (255, 255, 255)
    assert rgb[1][0] > rgb[1][2] and rgb[2][2] > rgb[2][0]  # red above the mean, blue below
    assert tuple(rgb[3]) == tuple(rgb[1])  # clipped at CLIP_Z
    assert 200 < rgb[4][0] <= 255 and rgb[4][1] < 255  # a little above the mean: light red


def test_png_decodes_with_the_layout_size_and_marks_functional_tokens() -> None:
    n = 11
    functional = [k == 3 for k in range(n)]
    data = heatmap_png(_image(), _maps(n), [f"t{k}" for k in range(n)], functional, title="a title")
    png = Image.open(io.BytesIO(data))
    assert png.format == "PNG" and png.size == heatmap_size(n)
    rgb = np.asarray(png.convert("RGB"))
    top = TITLE_H + PAD
    left = PAD + IMAGE_PX + PAD
    x3 = left + 3 * (CELL + PAD)
    assert tuple(rgb[top + CELL // 2, x3 + BORDER // 2]) == FUNCTIONAL  # framed in the functional colour
    x2 = left + 2 * (CELL + PAD)
    assert tuple(rgb[top + CELL // 2, x2 + BORDER // 2]) != FUNCTIONAL
    assert tuple(rgb[top + 5, PAD + 5]) == (200, 200, 200)  # the image panel


def test_map_cells_follow_the_patch_grid_row_major() -> None:
    grid = 4
    maps = np.zeros((1, 1 + grid * grid), dtype=np.float32)
    maps[0, 0] = 9.0  # the class token is not drawn
    maps[0, 1 + 1] = CLIP_Z  # patch (row 0, column 1): strongly red
    maps[0, 1 + grid * 3] = -CLIP_Z  # patch (row 3, column 0): strongly blue
    rgb = np.asarray(Image.open(io.BytesIO(heatmap_png(_image(), maps, ["x"], [False]))).convert("RGB"))
    top, left, step = TITLE_H + PAD, PAD + IMAGE_PX + PAD, CELL // grid
    centre = step // 2

    def at(row: int, col: int) -> tuple[int, ...]:
        return tuple(int(v) for v in rgb[top + row * step + centre, left + col * step + centre])

    assert at(0, 1) == tuple(colourise(np.float32(CLIP_Z)))
    assert at(3, 0) == tuple(colourise(np.float32(-CLIP_Z)))
    assert at(0, 0) == (255, 255, 255)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="1 \\+ grid"):
        heatmap_png(_image(), np.zeros((2, 11)), ["a", "b"], [False, False])
    with pytest.raises(ValueError, match="labels"):
        heatmap_png(_image(), _maps(2), ["a"], [False, False])


@pytest.mark.parametrize(
    "title",
    [
        "two\nlines",
        "a\r\nwindows line",
        "tab\tand\vvertical tab",
        "nul \x00 bell \x07",
        "emoji 😀 and 中文",
        "x" * 20_000,
        "\n\n\n",
        "",
    ],  # fmt: skip
)
def test_any_title_and_label_is_drawn_on_one_line(title: str) -> None:
    from PIL import ImageDraw, ImageFont

    from clipcore.heatmap import _fit, one_line

    png = heatmap_png(_image(), _maps(2), [title, "b\nc"], [False, True], title=title)
    assert Image.open(io.BytesIO(png)).size == heatmap_size(2)
    draw, font = ImageDraw.Draw(Image.new("RGB", (1, 1))), ImageFont.load_default()
    fitted = _fit(draw, title, 300, font)
    assert "\n" not in fitted and "\t" not in fitted and draw.textlength(fitted, font=font) <= 300
    assert one_line("a\n\tb  c\r\n") == "a b c"


def test_the_words_of_a_title_stay_apart() -> None:
    # At Pillow's default 10 px a space drew as a 1-2 px gap, no wider than the gaps inside words,
    # and "left of a blue square" read as "leftofa blue square".
    png = heatmap_png(_image(), _maps(1), ["a"], [False], title="left of a blue square")
    title = np.asarray(Image.open(io.BytesIO(png)).convert("L"))[:TITLE_H, PAD:]
    ink = np.flatnonzero((title < 160).any(axis=0))
    gaps = np.diff(ink) - 1  # blank columns between consecutive inked columns
    assert int(np.sum(gaps >= 3)) == 4, gaps  # one clear gap per space, none inside a word
