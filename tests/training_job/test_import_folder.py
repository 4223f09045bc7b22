"""``clip-train data import-folder``: folders of class folders (real JPEG and PNG files) to label records.

The pictures are drawn: one shape per class, each picture with its own colour, size and place, so
every file has its own content (and content hash). The converted data is read back with the same
loader every training command uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw
from typer.testing import CliRunner

from training.cli import app
from training.datasets.dataset import load_dataset, require_valid, split_of

SHAPES = ("circle", "square", "triangle")


def draw(shape: str, i: int, size: int = 40) -> Image.Image:
    img = Image.new("RGB", (size, size), (250 - 3 * i % 200, 240, 230))
    pen = ImageDraw.Draw(img)
    r = 6 + i % 9
    cx, cy = 12 + (7 * i) % 16, 12 + (5 * i) % 16
    colour = ((40 * i) % 256, (90 + 17 * i) % 256, (200 - 11 * i) % 256)
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        pen.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    else:
        pen.polygon(((cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)), fill=colour)
    return img


def write_tree(root: Path, per_class: int = 12, start: int = 0, classes: tuple[str, ...] = SHAPES) -> None:
    """``root/<class>/NNN.jpg`` (every third a PNG), the ``big_circle``-style names with underscores."""
    for c, shape in enumerate(classes):
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(start, start + per_class):
            image = draw(shape.split("_")[-1], 31 * c + i)
            if i % 3 == 2:
                image.save(folder / f"{i:03d}.png")
            else:
                image.save(folder / f"{i:03d}.jpg", quality=90)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["data", "import-folder", *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_a_folder_of_class_folders_becomes_label_records_with_a_test_part_held_out_by_content(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    write_tree(photos, per_class=30, classes=("circle", "square", "big_triangle"))
    (photos / "square" / "nested").mkdir()
    draw("square", 99).save(photos / "square" / "nested" / "deep.JPG")  # deeper, upper-case suffix: still the class
    (photos / "circle" / "notes.txt").write_text("not an image")
    (photos / "circle" / ".hidden.jpg").write_bytes(b"editor junk")
    code, output = run(str(photos), str(tmp_path / "out"))
    assert code == 0, output
    assert "skipped 1 file(s) that are not images" in output
    out = tmp_path / "out"
    assert json.loads((out / "labels.json").read_text()) == ["big triangle", "circle", "square"]
    train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
    assert len(train) + len(test) == 91 and test, (len(train), len(test))
    assert f"wrote {len(train)} training and {len(test)} test records" in output
    assert {r["label"] for r in train} == {"big triangle", "circle", "square"}
    deep = [r for r in train + test if r["image"].endswith("/square/nested/deep.JPG")]
    assert [r["label"] for r in deep] == ["square"]
    for record in train + test:  # copied byte for byte from the class folder it names
        original = photos.joinpath(*Path(record["image"]).parts[2:])
        assert (out / record["image"]).read_bytes() == original.read_bytes()
    # The loader every command uses reads it clean; the held-out photos are exactly its test split,
    # so inside train.jsonl the content split gives train and validation records only.
    dataset = require_valid(load_dataset(out / "train.jsonl"))
    assert dataset.labels == {"big triangle": {}, "circle": {}, "square": {}}
    assert len(dataset.split("test")) == 0 and dataset.split("val")
    assert {split_of(item) for item in require_valid(load_dataset(out / "test.jsonl")).items} == {"test"}


def test_train_and_test_trees_and_split_from_give_the_same_records_with_attributes(tmp_path: Path) -> None:
    write_tree(tmp_path / "both" / "train", per_class=8)
    write_tree(tmp_path / "both" / "test", per_class=4, start=50)
    attributes = tmp_path / "attributes.json"
    attributes.write_text(json.dumps({s: {"corners": str(n)} for s, n in zip(SHAPES, ("no", "four", "three"))}))
    code, output = run(str(tmp_path / "both"), str(tmp_path / "a"), "--attributes", str(attributes))
    assert code == 0 and "(test part: test/)" in output, output
    code, output = run(
        str(tmp_path / "both" / "train"), str(tmp_path / "b"), "--split-from", str(tmp_path / "both" / "test"),
        "--attributes", str(attributes),
    )  # fmt: skip
    assert code == 0 and "--split-from" in output, output
    for part, n in (("train", 24), ("test", 12)):
        a, b = read_jsonl(tmp_path / "a" / f"{part}.jsonl"), read_jsonl(tmp_path / "b" / f"{part}.jsonl")
        assert a == b and len(a) == n
        assert all(r["image"].startswith(f"images/{part}/") for r in a)
    record = read_jsonl(tmp_path / "a" / "train.jsonl")[0]
    assert record["label"] == "circle" and record["attributes"] == {"corners": "no"}
    assert json.loads((tmp_path / "a" / "labels.json").read_text())["triangle"] == {"corners": "three"}
    dataset = require_valid(load_dataset(tmp_path / "a" / "train.jsonl"))
    assert dataset.labels["square"] == {"corners": "four"}
    # The test part is test.jsonl: every photo of train.jsonl is trained on (train or validation),
    # including those whose content alone would have held them out.
    assert dataset.test_file == tmp_path / "a" / "test.jsonl"
    assert not dataset.split("test") and len(dataset.split("train")) + len(dataset.split("val")) == 24
    assert any(split_of(item) == "test" for item in dataset.split("train"))
    alone = require_valid(load_dataset(tmp_path / "a" / "test.jsonl"))
    assert alone.test_file is None  # the held-out file itself keeps the content split
    validate = CliRunner().invoke(app, ["data", "validate", str(tmp_path / "a" / "test.jsonl")])
    assert validate.exit_code == 0 and "12 usable records" in validate.output, validate.output


def test_no_copy_names_the_original_files(tmp_path: Path) -> None:
    write_tree(tmp_path / "photos", per_class=5, classes=("circle", "square"))
    code, output = run(str(tmp_path / "photos"), str(tmp_path / "out"), "--no-copy")
    assert code == 0, output
    records = read_jsonl(tmp_path / "out" / "train.jsonl") + read_jsonl(tmp_path / "out" / "test.jsonl")
    assert len(records) == 10 and not (tmp_path / "out" / "images").exists()
    assert all(Path(r["image"]).is_absolute() and Path(r["image"]).is_relative_to(tmp_path / "photos") for r in records)
    loaded = [load_dataset(tmp_path / "out" / f"{part}.jsonl") for part in ("train", "test")]
    assert not any(d.problems for d in loaded) and sum(len(d.items) for d in loaded) == 10


def _broken(root: Path) -> str:
    path = root / "square" / "004.jpg"
    path.write_bytes(path.read_bytes()[:40])  # a truncated JPEG
    return str(path)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("empty", "empty: no class folders"),
        ("one class", "only one class ('circle')"),
        ("unreadable", "{broken}: image does not decode"),
        ("loose images", "mixed layouts: 1 image(s) directly in the folder (e.g. stray.jpg) beside class folders"),
        ("images only", "image(s) but no class folders"),
        ("train beside classes", "mixed layouts: train/ beside other folders (circle, square)"),
        ("val beside train", "val/ is neither"),
        ("empty class", "class 'square' has no images"),
        ("unknown test class", "class(es) 'triangle' that"),
        ("two test sets", "drop --split-from"),
        ("attributes", "no entry for class 'square'"),
        ("out inside root", "must not be inside"),
    ],
)
def test_a_folder_that_cannot_be_imported_is_named_and_nothing_is_written(
    tmp_path: Path, layout: str, expected: str
) -> None:
    root, out, extra = tmp_path / "photos", tmp_path / "out", []
    root.mkdir()
    broken = ""
    if layout == "one class":
        write_tree(root, per_class=4, classes=("circle",))
    elif layout in ("unreadable", "attributes", "loose images", "empty class", "out inside root"):
        write_tree(root, per_class=6, classes=("circle", "square"))
        if layout == "unreadable":
            broken = _broken(root)
        elif layout == "attributes":
            (tmp_path / "attributes.json").write_text(json.dumps({"circle": {"corners": "no"}}))
            extra = ["--attributes", str(tmp_path / "attributes.json")]
        elif layout == "loose images":
            draw("circle", 3).save(root / "stray.jpg")
        elif layout == "empty class":
            for path in (root / "square").iterdir():
                path.unlink()
            (root / "square" / "README.md").write_text("pictures to come")
        else:
            out = root / "converted"
    elif layout == "images only":
        draw("circle", 1).save(root / "a.png")
    elif layout == "train beside classes":
        write_tree(root, per_class=3, classes=("circle", "square"))
        write_tree(root / "train", per_class=3, classes=("circle", "square"))
    elif layout == "val beside train":
        for part in ("train", "test", "val"):
            write_tree(root / part, per_class=3, classes=("circle", "square"))
    elif layout == "unknown test class":
        write_tree(root / "train", per_class=3, classes=("circle", "square"))
        write_tree(root / "test", per_class=3, classes=("circle", "triangle"))
    elif layout == "two test sets":
        write_tree(root / "train", per_class=3, classes=("circle", "square"))
        write_tree(root / "test", per_class=3, classes=("circle", "square"))
        extra = ["--split-from", str(root / "test")]
    code, output = run(str(root), str(out), *extra)
    assert code == 1, output
    flat = " ".join(output.split())
    assert expected.format(broken=broken) in flat, output
    assert "nothing written" in flat
    assert not (out / "train.jsonl").exists() and not (out / "labels.json").exists()


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    write_tree(root, per_class=6, classes=("circle", "square"))
    first = _broken(root)
    second = root / "circle" / "001.jpg"
    second.write_bytes(b"\xff\xd8\xff not a jpeg")
    (root / "empty").mkdir()
    code, output = run(str(root), str(tmp_path / "out"))
    flat = " ".join(output.split())
    assert code == 1 and "3 problem(s): nothing written" in flat, output
    assert first in flat and str(second) in flat and "class 'empty' has no images" in flat
