"""Two renderers of scene graphs.

``render_scene`` is the training renderer: numpy signed-distance shapes, supersampled for
anti-aliasing, colour jitter and pixel noise; a few thousand 64x64 scenes per second.
``draw_scene_pil`` is a second, independent renderer (PIL polygons on a flat background at
any size, no noise) used to check that models work on images the generator never made.
Both share only the shape geometry below, so "what a triangle is" cannot drift.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from training.world.scene import Scene, SceneObject
from training.world.vocab import COLOURS

SUPERSAMPLE = 3


def shape_polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    """Vertices of a shape of 'radius' r centred at (cx, cy); None for the circle."""
    if shape == "square":
        h = r * 0.86
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape == "diamond":
        h = r * 1.18
        return [(cx, cy - h), (cx + h, cy), (cx, cy + h), (cx - h, cy)]
    if shape == "triangle":
        R = r * 1.2
        ys = cy + R * 0.18  # centre the triangle's bounding box on the object centre
        return [(cx + R * math.cos(a), ys + R * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    if shape == "cross":
        a, b = r * 1.05, r * 0.36
        return [
            (cx - b, cy - a),
            (cx + b, cy - a),
            (cx + b, cy - b),
            (cx + a, cy - b),
            (cx + a, cy + b),
            (cx + b, cy + b),
            (cx + b, cy + a),
            (cx - b, cy + a),
            (cx - b, cy + b),
            (cx - a, cy + b),
            (cx - a, cy - b),
            (cx - b, cy - b),
        ]
    if shape == "circle":
        return None
    raise ValueError(f"unknown shape {shape!r}")


def _inside(shape: str, px: np.ndarray, py: np.ndarray, cx: float, cy: float, r: float) -> np.ndarray:
    """Boolean mask of sample points inside the shape (same geometry as shape_polygon)."""
    dx, dy = px - cx, py - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        h = r * 0.86
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= r * 1.18
    if shape == "cross":
        a, b = r * 1.05, r * 0.36
        ax, ay = np.abs(dx), np.abs(dy)
        return ((ax <= b) & (ay <= a)) | ((ax <= a) & (ay <= b))
    if shape == "triangle":
        (x0, y0), (x1, y1), (x2, y2) = shape_polygon(shape, cx, cy, r)  # type: ignore[misc]

        def edge(xa: float, ya: float, xb: float, yb: float) -> np.ndarray:
            return (xb - xa) * (py - ya) - (yb - ya) * (px - xa)

        e0, e1, e2 = edge(x0, y0, x1, y1), edge(x1, y1, x2, y2), edge(x2, y2, x0, y0)
        return ((e0 >= 0) & (e1 >= 0) & (e2 >= 0)) | ((e0 <= 0) & (e1 <= 0) & (e2 <= 0))
    raise ValueError(f"unknown shape {shape!r}")


def object_coverage(obj: SceneObject, size: int, ss: int = SUPERSAMPLE) -> tuple[np.ndarray, slice, slice]:
    """Anti-aliased coverage in [0, 1] of one object over its pixel bounding box."""
    ext = obj.radius * 1.25
    x0, x1 = max(0, int((obj.x - ext) * size) - 1), min(size, int((obj.x + ext) * size) + 2)
    y0, y1 = max(0, int((obj.y - ext) * size) - 1), min(size, int((obj.y + ext) * size) + 2)
    xs = (np.arange(x0 * ss, x1 * ss) + 0.5) / (size * ss)
    ys = (np.arange(y0 * ss, y1 * ss) + 0.5) / (size * ss)
    px, py = np.meshgrid(xs, ys)
    inside = _inside(obj.shape, px, py, obj.x, obj.y, obj.radius).astype(np.float32)
    cov = inside.reshape(y1 - y0, ss, x1 - x0, ss).mean(axis=(1, 3))
    return cov, slice(y0, y1), slice(x0, x1)


def object_mask(obj: SceneObject, size: int) -> np.ndarray:
    """Boolean (size, size) mask of the pixels an object covers at least half of."""
    mask = np.zeros((size, size), dtype=bool)
    cov, ys, xs = object_coverage(obj, size)
    mask[ys, xs] = cov >= 0.5
    return mask


def render_scene(scene: Scene, size: int = 64, rng: np.random.Generator | None = None) -> np.ndarray:
    """(size, size, 3) uint8 image of a scene; ``rng`` adds colour jitter and pixel noise."""
    img = np.empty((size, size, 3), dtype=np.float32)
    img[:] = scene.background
    for obj in scene.objects:
        colour = np.asarray(COLOURS[obj.colour], dtype=np.float32)
        if rng is not None:
            colour = np.clip(colour + rng.uniform(-14, 14, size=3), 0, 255)
        cov, ys, xs = object_coverage(obj, size)
        region = img[ys, xs]
        img[ys, xs] = region * (1 - cov[..., None]) + colour * cov[..., None]
    if rng is not None and scene.noise > 0:
        img += rng.normal(0.0, scene.noise, size=img.shape).astype(np.float32)
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def render_batch(scenes: list[Scene], size: int = 64, seed: int | None = None) -> np.ndarray:
    """(N, size, size, 3) uint8; jitter and noise drawn from ``seed`` (None: clean)."""
    rng = None if seed is None else np.random.default_rng(seed)
    return np.stack([render_scene(s, size, rng) for s in scenes])


def draw_scene_pil(
    scene: Scene, size: int = 224, background: tuple[int, int, int] = (255, 255, 255), oversample: int = 4
) -> Image.Image:
    """An anti-aliased PIL drawing of the scene on a flat background, canonical colours."""
    big = size * oversample
    im = Image.new("RGB", (big, big), background)
    draw = ImageDraw.Draw(im)
    for obj in scene.objects:
        colour = COLOURS[obj.colour]
        cx, cy, r = obj.x * big, obj.y * big, obj.radius * big
        poly = shape_polygon(obj.shape, cx, cy, r)
        if poly is None:
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        else:
            draw.polygon(poly, fill=colour)
    return im.resize((size, size), Image.Resampling.LANCZOS)
