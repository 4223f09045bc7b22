"""Render the example images of the README, docs/api.md and the playground from the shapes world.

    python scripts/render_examples.py            # rewrite examples/*.png and the playground's copies

The images are clean scenes of the default model's own world, drawn with
``training.world.render.render_scene`` (no jitter, no noise) at 128 px: a few hundred bytes each.
The file names are the ones the examples use, so every example runs from the ``examples/``
folder of a fresh clone.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from PIL import Image  # noqa: E402

from training.world.render import render_scene  # noqa: E402
from training.world.scene import Scene, SceneObject  # noqa: E402
from training.world.vocab import SIZE_RANGES  # noqa: E402

EXAMPLES_DIR = REPO / "examples"
PLAYGROUND_DIR = REPO / "service" / "static" / "playground" / "examples"
SIZE_PX = 128


def _obj(shape: str, colour: str, size: str, x: float = 0.5, y: float = 0.5) -> SceneObject:
    low, high = SIZE_RANGES[size]
    return SceneObject(shape, colour, size, (low + high) / 2, x, y)


def _one(shape: str, colour: str, size: str) -> Scene:
    return Scene(objects=(_obj(shape, colour, size),))


def _left_of(first: SceneObject, second: SceneObject) -> Scene:
    return Scene(objects=(first, second), relation="left of")


# name -> (scene, what it shows); the names are those the README and docs/api.md use.
EXAMPLES: dict[str, tuple[Scene, str]] = {
    "big_circle.png": (_one("circle", "red", "large"), "a large red circle"),
    "small_circle.png": (_one("circle", "red", "small"), "a small red circle"),
    "red.png": (_one("circle", "red", "medium"), "a red circle"),
    "blue.png": (_one("square", "blue", "medium"), "a blue square"),
    "scene.png": (
        _left_of(_obj("circle", "red", "medium", 0.27, 0.5), _obj("square", "blue", "medium", 0.73, 0.5)),
        "a red circle to the left of a blue square",
    ),
    "small.png": (_one("square", "yellow", "small"), "a small yellow square"),
    "medium.png": (_one("square", "yellow", "medium"), "a medium yellow square"),
    "large.png": (_one("square", "yellow", "large"), "a large yellow square"),
    "big.png": (_one("diamond", "cyan", "large"), "a large cyan diamond"),
    "a.png": (_one("square", "red", "medium"), "a red square"),
    "b.png": (_one("square", "purple", "medium"), "a purple square"),
    "c.png": (_one("square", "blue", "medium"), "a blue square"),
}
# The playground offers these in its example pickers.
PLAYGROUND = ["big_circle.png", "small_circle.png", "red.png", "blue.png", "scene.png", "large.png", "small.png"]


def png_bytes(scene: Scene) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(render_scene(scene, size=SIZE_PX)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.parse_args()
    EXAMPLES_DIR.mkdir(exist_ok=True)
    PLAYGROUND_DIR.mkdir(parents=True, exist_ok=True)
    for name, (scene, _) in EXAMPLES.items():
        data = png_bytes(scene)
        (EXAMPLES_DIR / name).write_bytes(data)
        if name in PLAYGROUND:
            (PLAYGROUND_DIR / name).write_bytes(data)
    print(f"wrote {len(EXAMPLES)} images to {EXAMPLES_DIR} ({len(PLAYGROUND)} also to {PLAYGROUND_DIR})")


if __name__ == "__main__":
    main()
