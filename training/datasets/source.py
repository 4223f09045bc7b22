"""Reading a dataset: JSONL files beside an image folder, or WebDataset tar shards.

Every record comes back with where it was read (file and line, or shard and key), so a problem
can be reported at its place; problems are returned beside the records, never raised one at a
time, so a validator can list them all before any training starts.

WebDataset shards are open_clip's own training format: a tar whose members share a key, e.g.
``0001.jpg`` + ``0001.txt`` (a caption) or ``0001.json`` (a record of any kind whose image fields
name the member's extension, or omit them when the sample has one image). They are read with the
``webdataset`` library.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from training.datasets.records import RECORD_TYPES, Record, image_fields, infer_kind

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp")


@dataclass(frozen=True)
class Place:
    """Where a record was read: ``file:line`` for JSONL, ``shard#key`` for tar shards."""

    file: str
    line: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else f"{self.file}#{self.key}"


@dataclass(frozen=True)
class Problem:
    place: Place
    message: str

    def __str__(self) -> str:
        return f"{self.place}: {self.message}"


@dataclass(frozen=True)
class Item:
    """A parsed record, where it came from, and how to read each image it names."""

    record: Record
    place: Place
    images: tuple[ImageRef, ...]


@dataclass(frozen=True)
class ImageRef:
    """An image on disk (``path``) or inside a shard (``data``, already read)."""

    name: str
    path: Path | None = None
    data: bytes | None = None

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.path is not None
        return self.path.read_bytes()


def parse_record(obj: Any, place: Place) -> Record | Problem:
    if not isinstance(obj, dict):
        return Problem(place, f"expected a JSON object, got {type(obj).__name__}")
    kind = infer_kind(obj)
    if kind is None:
        return Problem(place, "cannot tell the record's kind: give 'kind' or the fields of one (docs/data.md)")
    if kind not in RECORD_TYPES:
        return Problem(place, f"unknown kind {kind!r}; known: {', '.join(RECORD_TYPES)}")
    try:
        return RECORD_TYPES[kind].model_validate(obj)  # type: ignore[return-value]
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in exc.errors())
        return Problem(place, f"bad {kind} record: {errors}")


def read_jsonl(path: Path) -> Iterator[Item | Problem]:
    """Records of one JSONL file, images resolved relative to its folder."""
    base = path.parent
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        yield Problem(Place(str(path), 0), f"cannot read the file: {exc}")
        return
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        place = Place(str(path), number)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Problem(place, f"bad JSON: {exc.msg} (column {exc.colno})")
            continue
        record = parse_record(obj, place)
        if isinstance(record, Problem):
            yield record
            continue
        images = []
        for name in image_fields(record):
            target = Path(name) if Path(name).is_absolute() else base / name
            images.append(ImageRef(name, path=target))
        yield Item(record, place, tuple(images))


def read_shards(paths: list[Path]) -> Iterator[Item | Problem]:
    """Records of WebDataset tar shards: one sample per key."""
    import webdataset as wds

    for shard in paths:
        try:
            samples = wds.WebDataset(str(shard), shardshuffle=False, empty_check=False)
            for sample in samples:
                yield _shard_item(shard, sample)
        except Exception as exc:  # a broken tar: report the shard, go on with the others
            yield Problem(Place(str(shard), key="?"), f"cannot read the shard: {exc}")


def _shard_item(shard: Path, sample: dict[str, Any]) -> Item | Problem:
    key = str(sample.get("__key__", "?"))
    place = Place(str(shard), key=key)
    members = {k: v for k, v in sample.items() if not k.startswith("__")}
    pictures = {ext: data for ext, data in members.items() if ext in IMAGE_EXTENSIONS}
    if "json" in members:
        try:
            obj = json.loads(members["json"])
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return Problem(place, f"bad JSON in {key}.json: {exc}")
        if isinstance(obj, dict) and len(pictures) == 1 and "image" not in obj and "image_a" not in obj:
            obj = {**obj, "image": next(iter(pictures))}  # one picture: the record's image
    elif "txt" in members:
        if len(pictures) != 1:
            return Problem(place, f"a caption sample needs exactly one image, found {sorted(pictures) or 'none'}")
        obj = {"image": next(iter(pictures)), "caption": members["txt"].decode("utf-8", errors="replace")}
    else:
        return Problem(place, "a sample needs a .txt caption or a .json record")
    record = parse_record(obj, place)
    if isinstance(record, Problem):
        return record
    images = []
    for name in image_fields(record):
        ext = name.rsplit(".", 1)[-1].lower()
        if ext not in pictures:
            return Problem(place, f"no member {key}.{ext} for image {name!r}")
        images.append(ImageRef(f"{key}.{ext}", data=pictures[ext]))
    return Item(record, place, tuple(images))


def read_source(path: Path) -> Iterator[Item | Problem]:
    """A JSONL file, a ``.tar`` shard, or a folder of them (sorted, so reads are reproducible)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".tar"))
        if not files:
            yield Problem(Place(str(path), 0), "no .jsonl files or .tar shards in this folder")
        jsonl = [p for p in files if p.suffix == ".jsonl"]
        for file in jsonl:
            yield from read_jsonl(file)
        shards = [p for p in files if p.suffix == ".tar"]
        if shards:
            yield from read_shards(shards)
    elif path.suffix == ".tar":
        yield from read_shards([path])
    elif path.exists():
        yield from read_jsonl(path)
    else:
        yield Problem(Place(str(path), 0), "no such file or folder")


def decode_problem(ref: ImageRef, max_pixels: int = 100_000_000) -> str | None:
    """Why the image cannot be used, or None when it decodes."""
    from PIL import Image

    try:
        data = ref.read()
    except FileNotFoundError:
        return f"image {ref.name!r} not found"
    except OSError as exc:
        return f"image {ref.name!r} cannot be read: {exc.strerror or exc}"
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > max_pixels:
                return f"image {ref.name!r} is too large ({img.width}x{img.height})"
            img.load()  # verify() misses truncated data that load() catches
    except Exception as exc:  # PIL raises many types for corrupt data
        return f"image {ref.name!r} does not decode: {exc}"
    return None
