"""A small dataset in the user-data format to try the commands on: pictures drawn with PIL
(fruit-like blobs on textured backgrounds) as JPEG and PNG files, JSONL records of every kind and a
label set with attributes. The tests and the training benchmark use it.

    python -m training.userdata.demo_data OUT_DIR [--per-label N] [--scenes N] [--size PX]

Nothing here comes from the shapes-world renderer: other colours, sizes, backgrounds and a
different drawing, as a user's photos would be.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

# label -> (fill colour, shape); attributes are what the template generator reads.
FRUITS: dict[str, tuple[tuple[int, int, int], str]] = {
    "tomato": ((215, 30, 25), "round"),
    "lemon": ((245, 220, 40), "oval"),
    "lime": ((90, 190, 40), "round"),
    "plum": ((120, 40, 130), "oval"),
}
LABELS = {
    "tomato": {"colour": "red", "shape": "round"},
    "lemon": {"colour": "yellow", "shape": "oval"},
    "lime": {"colour": "green", "shape": "round"},
    "plum": {"colour": "purple", "shape": "oval"},
}


def draw(objects: list[tuple[str, float, float]], rng: random.Random, size: int = 80) -> Image.Image:
    """Fruits at (x, y) centres in [0, 1], on a light textured background."""
    base = tuple(rng.randint(200, 250) for _ in range(3))
    img = Image.new("RGB", (size, size), base)  # type: ignore[arg-type]
    pen = ImageDraw.Draw(img)
    for _ in range(6):  # faint streaks: not a flat synthetic background
        x0, y0 = rng.randint(0, size), rng.randint(0, size)
        pen.line((x0, y0, x0 + rng.randint(-30, 30), y0 + rng.randint(-30, 30)), fill=tuple(c - 25 for c in base))
    for label, x, y in objects:
        colour, shape = FRUITS[label]
        r = rng.uniform(0.14, 0.2) * size
        rx, ry = (r * 1.35, r * 0.85) if shape == "oval" else (r, r)
        cx, cy = x * size, y * size
        shade = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in colour)
        pen.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), fill=shade, outline=(40, 40, 40))  # type: ignore[arg-type]
        pen.line((cx, cy - ry, cx + 2, cy - ry - 6), fill=(60, 110, 30), width=2)  # stem
    return img


def write_user_dataset(root: Path, per_label: int = 24, scenes: int = 40, seed: int = 0, size: int = 80) -> Path:
    """Images under ``root/images``, records in ``root/*.jsonl``, ``root/labels.json``; returns ``root``."""
    rng = random.Random(seed)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    labelled, captions, pairs = [], [], []
    for label in FRUITS:
        for i in range(per_label):
            name = f"images/{label}_{i:03d}.{'jpg' if i % 2 else 'png'}"
            draw([(label, rng.uniform(0.35, 0.65), rng.uniform(0.35, 0.65))], rng, size).save(root / name)
            labelled.append({"image": name, "label": label})
    names = list(FRUITS)
    for i in range(scenes):
        a, b = rng.sample(names, 2)
        name = f"images/scene_{i:03d}.jpg"
        draw([(a, 0.27, rng.uniform(0.4, 0.6)), (b, 0.73, rng.uniform(0.4, 0.6))], rng, size).save(
            root / name, quality=92
        )
        ca, cb = LABELS[a]["colour"], LABELS[b]["colour"]
        captions.append({"image": name, "caption": f"a {ca} {a} left of a {cb} {b}"})
    for i in range(0, len(labelled) - per_label, 7):
        first, second = labelled[i], labelled[(i + per_label) % len(labelled)]
        ca, cb = (LABELS[r["label"]]["colour"] for r in (first, second))
        pairs.append({"image_a": first["image"], "image_b": second["image"],
                      "difference": f"The first fruit is {ca}, while the second is {cb}."})  # fmt: skip
    (root / "labelled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled))
    (root / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in captions))
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    (root / "labels.json").write_text(json.dumps(LABELS, indent=2))
    return root


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a small drawn dataset in the user-data format.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-label", type=int, default=24, help="labelled images per label")
    parser.add_argument("--scenes", type=int, default=40, help="two-object captioned images")
    parser.add_argument("--size", type=int, default=80, help="image side in pixels")
    args = parser.parse_args()
    print(write_user_dataset(args.out, args.per_label, args.scenes, size=args.size))
