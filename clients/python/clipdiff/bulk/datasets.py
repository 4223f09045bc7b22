"""Reading the rows of a dataset to score: a folder of images, JSONL, Parquet or WebDataset shards.

Every reader numbers its rows from 0 in a fixed order (sorted paths, line order, row order,
member order), so a row keeps its index between runs: resuming and sharding are both "rows
``start`` to ``stop``". A row that cannot be read (a missing file, a line that is not JSON)
is still yielded, with an ``error``, so it is recorded and never stops the run.

WebDataset shards are read with the standard library's ``tarfile`` (no extra package): a sample
is the run of consecutive members sharing a key (the member name up to the first dot of its
file name), ``key.png`` holding the image, ``key.image_a.png`` / ``key.image_b.png`` a pair,
``key.json`` further fields and ``key.txt`` a ``text``.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FORMATS", "IMAGE_FIELDS", "Dataset", "Row", "open_dataset"]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
IMAGE_FIELDS = ("image", "image_a", "image_b")
FORMATS = ("folder", "jsonl", "parquet", "webdataset")


@dataclass
class Row:
    """One input row: its position in the dataset, a key naming it, and its fields (an image
    field holds the image's bytes or an API image object such as ``{"url": ...}``)."""

    index: int
    key: str
    fields: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class Dataset(Protocol):
    kind: str

    def count(self) -> int: ...

    def rows(self, start: int, stop: int) -> Iterator[Row]: ...


def _read_image(path: Path) -> bytes:
    return path.read_bytes()


def _image_value(value: Any, base: Path) -> Any:
    """An image cell as bytes or an API image object: a path (relative to the dataset's folder),
    a URL or ``data:`` URI, an object with one of data/url/sha256, raw bytes, or a Hugging Face
    image struct (``{"bytes", "path"}``)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        if value.startswith(("http://", "https://")):
            return {"url": value}
        if value.startswith("data:"):
            return {"data": value}
        return _read_image(base / value)
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return bytes(value["bytes"])
        if value.get("path"):
            return _read_image(base / str(value["path"]))
        kinds = [k for k in ("data", "url", "sha256") if k in value]
        if len(kinds) == 1:
            return {kinds[0]: value[kinds[0]]}
    raise ValueError(f"not an image: {type(value).__name__} (a path, URL, data: URI, bytes or {{'data': ...}})")


def _fields(record: dict[str, Any], base: Path) -> tuple[dict[str, Any], str | None]:
    """A record's fields with its image cells read; the first unreadable image is the row's error."""
    fields = dict(record)
    for name in IMAGE_FIELDS:
        if fields.get(name) is None:
            continue
        try:
            fields[name] = _image_value(fields[name], base)
        except (OSError, ValueError) as exc:
            fields[name] = None
            return fields, f"unreadable {name}: {exc}"
    return fields, None


def _key(record: dict[str, Any], index: int) -> str:
    for name in ("id", "key", "__key__"):
        if record.get(name) is not None:
            return str(record[name])
    return str(index)


class FolderDataset:
    """Every image file under a folder (recursively, sorted by relative path); the key is that path."""

    kind = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths = sorted(
            p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
        )

    def count(self) -> int:
        return len(self.paths)

    def rows(self, start: int, stop: int) -> Iterator[Row]:
        for index in range(start, min(stop, len(self.paths))):
            name = self.paths[index]
            try:
                yield Row(index, name, {"image": _read_image(self.root / name)})
            except OSError as exc:
                yield Row(index, name, {"image": None}, f"unreadable image: {exc}")


class JsonlDataset:
    """One JSON object per non-blank line; image paths are relative to the file's folder."""

    kind = "jsonl"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _lines(self) -> Iterator[str]:
        with self.path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield line

    def count(self) -> int:
        return sum(1 for _ in self._lines())

    def rows(self, start: int, stop: int) -> Iterator[Row]:
        for index, line in enumerate(self._lines()):
            if index >= stop:
                return
            if index < start:
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                yield Row(index, str(index), error=f"line {index + 1} is not JSON: {exc}")
                continue
            if not isinstance(record, dict):
                yield Row(index, str(index), error=f"line {index + 1} is not a JSON object")
                continue
            fields, error = _fields(record, self.path.parent)
            yield Row(index, _key(record, index), fields, error)


class ParquetDataset:
    """Rows of a Parquet file; an image column holds bytes, a path (relative to the file's
    folder) or a Hugging Face image struct."""

    kind = "parquet"

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path = path
        self.file = pq.ParquetFile(path)

    def count(self) -> int:
        return int(self.file.metadata.num_rows)

    def rows(self, start: int, stop: int) -> Iterator[Row]:
        first = 0  # index of the first row of the current row group
        for group in range(self.file.num_row_groups):
            size = self.file.metadata.row_group(group).num_rows
            if first + size > start and first < stop:
                # One row group at a time keeps memory to a group whatever the file's size.
                for offset, record in enumerate(self.file.read_row_group(group).to_pylist()):
                    index = first + offset
                    if start <= index < stop:
                        fields, error = _fields(record, self.path.parent)
                        yield Row(index, _key(record, index), fields, error)
            first += size


def _sample_parts(name: str) -> tuple[str, str]:
    """``dir/key.image_a.png`` -> (``dir/key``, ``image_a.png``): WebDataset's key and suffix."""
    folder, _, base = name.rpartition("/")
    stem, _, suffix = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), suffix


def _sample_fields(members: dict[str, bytes]) -> tuple[dict[str, Any], str | None]:
    fields: dict[str, Any] = {}
    error = None
    for suffix, data in members.items():
        head, _, ext = suffix.rpartition(".")
        if f".{(ext or suffix).lower()}" in IMAGE_SUFFIXES:
            fields[head if head in IMAGE_FIELDS else "image"] = data
        elif suffix == "json":
            try:
                extra = json.loads(data)
            except ValueError as exc:
                error = f"unreadable json member: {exc}"
                continue
            if isinstance(extra, dict):
                fields.update({k: v for k, v in extra.items() if k not in IMAGE_FIELDS})
        elif suffix == "txt":
            fields["text"] = data.decode("utf-8", "replace")
    return fields, error


class WebDataset:
    """Samples of one or more WebDataset tar shards (in the order given, members in tar order)."""

    kind = "webdataset"

    def __init__(self, shards: list[Path]) -> None:
        self.shards = shards

    def _samples(self, first_loaded: int) -> Iterator[tuple[str, dict[str, bytes]]]:
        """``(key, {suffix: bytes})`` per sample; the members of samples before ``first_loaded``
        are skipped unread (their contents come back empty), as a streamed tar cannot seek."""
        index = 0
        for shard in self.shards:
            with tarfile.open(shard, mode="r|*") as tar:
                key: str | None = None
                members: dict[str, bytes] = {}
                for info in tar:
                    if not info.isfile():
                        continue
                    member_key, suffix = _sample_parts(info.name)
                    if key is not None and member_key != key:
                        yield key, members
                        index += 1
                        members = {}
                    key = member_key
                    handle = tar.extractfile(info) if index >= first_loaded else None
                    members[suffix] = handle.read() if handle is not None else b""
                if key is not None:
                    yield key, members
                    index += 1

    def count(self) -> int:
        return sum(1 for _ in self._samples(first_loaded=2**62))

    def rows(self, start: int, stop: int) -> Iterator[Row]:
        for index, (key, members) in enumerate(self._samples(first_loaded=start)):
            if index >= stop:
                return
            if index >= start:
                fields, error = _sample_fields(members)
                yield Row(index, key, fields, error)


def _shards(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".tar"))


def open_dataset(path: str | Path, kind: str | None = None) -> Dataset:
    """The dataset at ``path``: ``kind`` (one of ``FORMATS``) or, when None, guessed: a ``.jsonl``
    file, a ``.parquet`` file, a ``.tar`` shard or a folder holding ``.tar`` shards (WebDataset),
    else a folder of images.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: an unknown ``kind``, or a path that is not of that kind.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no dataset at {path}")
    if kind is None:
        suffix = path.suffix.lower()
        if path.is_dir():
            kind = "webdataset" if _shards(path) else "folder"
        elif suffix in (".jsonl", ".ndjson"):
            kind = "jsonl"
        elif suffix in (".parquet", ".pq"):
            kind = "parquet"
        elif suffix == ".tar":
            kind = "webdataset"
        else:
            raise ValueError(f"cannot tell the format of {path}: name it (one of {', '.join(FORMATS)})")
    if kind not in FORMATS:
        raise ValueError(f"unknown dataset format {kind!r}: one of {', '.join(FORMATS)}")
    if kind in ("folder",) and not path.is_dir():
        raise ValueError(f"{path} is not a folder")
    if kind in ("jsonl", "parquet") and not path.is_file():
        raise ValueError(f"{path} is not a file")
    if kind == "folder":
        return FolderDataset(path)
    if kind == "jsonl":
        return JsonlDataset(path)
    if kind == "parquet":
        return ParquetDataset(path)
    shards = _shards(path) if path.is_dir() else [path]
    if not shards:
        raise ValueError(f"no .tar shards in {path}")
    return WebDataset(shards)
