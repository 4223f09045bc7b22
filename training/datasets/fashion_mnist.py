"""Fashion-MNIST (Zalando's product photos, 28x28 grey) from its raw IDX files to PNGs + JSONL.

The raw files are the four ``*-idx?-ubyte.gz`` of the original release (on Debian:
``apt-get install dataset-fashion-mnist`` puts them in /usr/share/datasets/fashion-mnist). The
output is a dataset in this project's format (docs/data.md):

    OUT/labels.json          the 10 labels, each with the attributes that tell it apart
    OUT/train.jsonl          label records of the 60,000 training images (``--limit`` cuts it)
    OUT/test.jsonl           label records of the 10,000 test images, kept for evaluation
    OUT/images/{train,test}/NNNNN.png

With ``class_folders`` it writes the same photos as JPEGs in the layout most photo datasets come
in instead, ``OUT/{train,test}/<label>/NNNNN.jpg`` (spaces in a label as underscores), which
``clip-train data import-folder`` reads (docs/tutorial.md shows both).

The split by content hash inside ``train.jsonl`` gives train / validation (calibration) records;
``test.jsonl`` is the official test set, which no training command reads.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
from PIL import Image

DEFAULT_SOURCE = Path("/usr/share/datasets/fashion-mnist")
# The label names of the release, in class-index order, written as a caption would say them.
LABELS = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")
# What tells the classes apart, as "The first image has long sleeves, while the second has short sleeves."
ATTRIBUTES: dict[str, dict[str, str]] = {
    "t-shirt": {"sleeves": "short", "front": "plain", "collar": "no"},
    "trouser": {"legs": "two long"},
    "pullover": {"sleeves": "long", "front": "plain", "collar": "no"},
    "dress": {"sleeves": "short", "legs": "no"},
    "coat": {"sleeves": "long", "front": "open", "collar": "a wide"},
    "sandal": {"toes": "open", "shaft": "no"},
    "shirt": {"sleeves": "long", "front": "buttoned", "collar": "a pointed"},
    "sneaker": {"toes": "covered", "shaft": "a low"},
    "bag": {"handles": "carrying"},
    "ankle boot": {"toes": "covered", "shaft": "a high"},
}


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (big-endian header: magic with dtype code and rank, then each dimension)."""
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    if data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path} holds {body.size} values, its header says {dims}")
    return body.reshape(dims)


def convert(source: Path, out: Path, limit: int | None = None, test_limit: int | None = None) -> dict[str, int]:
    """Write the dataset under ``out``; returns the number of records of each file."""
    (out / "labels.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "labels.json").write_text(json.dumps(ATTRIBUTES, indent=2))
    counts = {}
    for part, prefix, cut in (("train", "train", limit), ("test", "t10k", test_limit)):
        images = read_idx(source / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(source / f"{prefix}-labels-idx1-ubyte.gz")
        if len(images) != len(labels):
            raise ValueError(f"{prefix}: {len(images)} images but {len(labels)} labels")
        n = len(images) if cut is None else min(cut, len(images))
        folder = out / "images" / part
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(n):
            name = f"images/{part}/{i:05d}.png"
            if not (out / name).exists():
                Image.fromarray(images[i], mode="L").save(out / name, optimize=False)
            label = LABELS[int(labels[i])]
            lines.append(json.dumps({"image": name, "label": label, "attributes": ATTRIBUTES[label]}))
        (out / f"{part}.jsonl").write_text("\n".join(lines) + "\n")
        counts[part] = n
    return counts


def write_class_folders(
    source: Path, out: Path, limit: int | None = None, test_limit: int | None = None
) -> dict[str, int]:
    """The photos as JPEGs in ``out/{train,test}/<label>/``; returns the number of images of each part."""
    counts = {}
    for part, prefix, cut in (("train", "train", limit), ("test", "t10k", test_limit)):
        images = read_idx(source / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(source / f"{prefix}-labels-idx1-ubyte.gz")
        n = len(images) if cut is None else min(cut, len(images))
        for i in range(n):
            folder = out / part / LABELS[int(labels[i])].replace(" ", "_")
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i], mode="L").save(folder / f"{i:05d}.jpg", quality=95)
        counts[part] = n
    return counts
