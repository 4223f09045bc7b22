"""A user's dataset: JSONL and WebDataset readers, every problem reported with its place, content splits."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from training.datasets.dataset import InvalidDataset, load_dataset, require_valid, split_of
from training.datasets.records import LabelRecord, NegativesRecord, PairRecord

REPO = Path(__file__).resolve().parents[2]


def png(colour: tuple[int, int, int], size: int = 16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def write_jsonl(path: Path, rows: list[object]) -> None:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    for i in range(12):
        (images / f"{i}.png").write_bytes(png((20 * i, 100, 200 - 10 * i)))
    (tmp_path / "labels.json").write_text(json.dumps({"coat": {"sleeves": "long"}, "shirt": {"sleeves": "short"}}))
    write_jsonl(tmp_path / "labelled.jsonl", [{"image": f"images/{i}.png", "label": "coat" if i % 2 else "shirt"}
                                              for i in range(6)])  # fmt: skip
    write_jsonl(tmp_path / "mixed.jsonl", [
        {"image": "images/6.png", "caption": "a long coat"},
        {"kind": "pair", "image_a": "images/7.png", "image_b": "images/8.png",
         "difference": "The first image shows a coat, while the second shows a shirt."},
        {"image": "images/9.png", "caption": "a coat with long sleeves", "negatives": ["a coat with short sleeves"]},
    ])  # fmt: skip
    return tmp_path


def test_a_clean_folder_loads_every_kind(folder: Path) -> None:
    dataset = require_valid(load_dataset(folder))
    assert dataset.counts() == {"label": 6, "caption": 1, "pair": 1, "negatives": 1}
    assert dataset.labels == {"coat": {"sleeves": "long"}, "shirt": {"sleeves": "short"}}
    pair = dataset.of_kind("pair")[0]
    assert isinstance(pair.record, PairRecord) and [r.name for r in pair.images] == ["images/7.png", "images/8.png"]
    assert isinstance(dataset.of_kind("negatives")[0].record, NegativesRecord)
    assert str(dataset.of_kind("pair")[0].place).endswith("mixed.jsonl:2")


def test_every_problem_is_reported_with_its_file_and_line(folder: Path) -> None:
    (folder / "images" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    write_jsonl(folder / "bad.jsonl", [
        {"image": "images/0.png", "label": "coat"},
        '{"image": "images/1.png", "label": ',
        {"image": "images/missing.png", "label": "coat"},
        {"image": "images/broken.png", "label": "shirt"},
        {"image": "images/2.png", "label": "sweater"},
        {"image": "images/3.png"},
        {"kind": "video", "image": "images/3.png"},
        {"image_a": "images/3.png", "image_b": "images/4.png"},
        ["not", "an", "object"],
        {"image": "images/5.png", "caption": "x", "negatives": []},
    ])  # fmt: skip
    dataset = load_dataset(folder)
    found = {str(p.place).rsplit("/", 1)[-1]: p.message for p in dataset.problems}
    assert set(found) == {f"bad.jsonl:{n}" for n in range(2, 11)}, found
    assert found["bad.jsonl:2"].startswith("bad JSON")
    assert "not found" in found["bad.jsonl:3"]
    assert "does not decode" in found["bad.jsonl:4"]
    assert "unknown label 'sweater'" in found["bad.jsonl:5"]
    assert "cannot tell the record's kind" in found["bad.jsonl:6"]
    assert "unknown kind 'video'" in found["bad.jsonl:7"]
    assert "difference" in found["bad.jsonl:8"] and "Field required" in found["bad.jsonl:8"]
    assert "expected a JSON object" in found["bad.jsonl:9"]
    assert "negatives" in found["bad.jsonl:10"]
    assert len(dataset.items) == 10  # line 1 of bad.jsonl and the clean files still load
    with pytest.raises(InvalidDataset, match="9 problem"):
        require_valid(dataset)


@pytest.mark.slow
def test_validate_command_lists_problems_and_exits_1_so_training_never_starts(folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "training.cli", "data", "validate", str(folder)]
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "9 usable records" in ok.stdout
    write_jsonl(folder / "more.jsonl", [{"image": "images/nope.png", "label": "coat"}])
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert "more.jsonl:1: image 'images/nope.png' not found" in bad.stdout
    assert "1 problem(s)" in bad.stdout


def test_webdataset_shards_hold_captions_and_records(tmp_path: Path) -> None:
    shard = tmp_path / "shard-000.tar"
    with tarfile.open(shard, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("0001.png", png((255, 0, 0)))
        add("0001.txt", b"a red square")
        add("0002.jpg", png((0, 0, 255)))  # a PNG under .jpg decodes all the same
        add("0002.json", json.dumps({"label": "blue"}).encode())
        add("0003.txt", b"a caption without an image")
    dataset = load_dataset(shard)
    assert [str(p) for p in dataset.problems] == [f"{shard}#0003: a caption sample needs exactly one image, found none"]
    caption, label = dataset.items
    assert caption.record.caption == "a red square" and caption.images[0].read()[:4] == b"\x89PNG"  # type: ignore[union-attr]
    assert isinstance(label.record, LabelRecord) and label.record.label == "blue"


def test_splits_follow_image_content_not_names_or_order(tmp_path: Path) -> None:
    images = tmp_path / "img"
    images.mkdir()
    rows = []
    for i in range(200):
        (images / f"{i}.png").write_bytes(png((i, 255 - i, (7 * i) % 256), size=8))
        rows.append({"image": f"img/{i}.png", "caption": f"picture {i}"})
    (images / "copy-of-5.png").write_bytes((images / "5.png").read_bytes())
    rows.append({"image": "img/copy-of-5.png", "caption": "the same picture again"})
    write_jsonl(tmp_path / "a.jsonl", rows)
    first = load_dataset(tmp_path / "a.jsonl")
    write_jsonl(tmp_path / "b.jsonl", rows[::-1])
    second = load_dataset(tmp_path / "b.jsonl")
    by_caption = {i.record.caption: split_of(i) for i in first.items}  # type: ignore[union-attr]
    assert by_caption == {i.record.caption: split_of(i) for i in second.items}  # type: ignore[union-attr]
    assert by_caption["picture 5"] == by_caption["the same picture again"]
    sizes = {s: len(first.split(s)) for s in ("train", "val", "test")}
    assert sum(sizes.values()) == 201 and 130 < sizes["train"] < 190 and sizes["val"] > 5 and sizes["test"] > 5
