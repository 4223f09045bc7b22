"""Adding a server-side dataset to a collection: a folder of images or a JSONL manifest under a
folder the operator allowed (``collections.import_roots``), embedded as a background job.

Every path is resolved (``..`` and symbolic links followed) before it is checked against the
allowed roots, so neither a ``..`` nor a link out of a root reaches a file outside them. The
listing (and every check of ids and metadata) happens before the job starts, so a bad dataset is
refused at once with the line or file at fault; the job then reads, embeds and adds the images
in batches of ``collections.max_items_per_add``, as many adds would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from service.api.deps import Services
from service.collections.jobs import Job
from service.collections.operations import add_read_images
from service.collections.service import Collections, model_ref
from service.collections.store import CollectionInfo, Scalar
from service.runtime.pipeline import Pipeline
from service.runtime.served import Selection

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
# Checks an item's id and metadata as an add does (the route's bounds): raises for a bad one.
ItemCheck = Callable[[str, Mapping[str, Scalar], str], None]


@dataclass(frozen=True)
class DatasetItem:
    id: str
    path: Path
    metadata: Mapping[str, Scalar]


class _ManifestLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    id: str | None = Field(default=None, min_length=1)
    metadata: dict[str, Scalar] = Field(default_factory=dict)


def allowed(requested: str | Path, roots: Sequence[str], field: str = "path") -> Path:
    """``requested`` resolved, if it lies within one of ``roots``; 403 otherwise."""
    if not roots:
        raise ClipError(
            ErrorCode.forbidden, "this server imports from no folder (collections.import_roots is empty)", field
        )
    path = Path(requested)
    if not path.is_absolute():
        raise bad_input(f"an import path is absolute (/data/catalogue); got {str(requested)[:200]!r}", field)
    resolved = path.resolve()
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise ClipError(
            ErrorCode.forbidden,
            f"{str(requested)[:200]!r} is outside the folders this server imports from (collections.import_roots)",
            field,
        )
    return resolved


def list_dataset(requested: str, roots: Sequence[str], max_items: int, check: ItemCheck) -> list[DatasetItem]:
    """The items of a folder (every image file below it; its id the path relative to the folder)
    or of a JSONL manifest (one ``{"path", "id", "metadata"}`` object a line; ``path`` relative to
    the manifest's folder, ``id`` the path when left out)."""
    source = allowed(requested, roots)
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        items = []
        for file in files:
            item_id = file.relative_to(source).as_posix()
            items.append(DatasetItem(item_id, allowed(file, roots, f"path: {item_id}"), {}))
            _count(items, max_items)
    elif source.is_file():
        items = _manifest(source, roots, max_items)
    else:
        raise ClipError(ErrorCode.not_found, f"{requested[:200]!r} is neither a folder nor a file", "path")
    if not items:
        raise bad_input(f"{requested[:200]!r} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})", "path")
    for item in items:
        check(item.id, item.metadata, f"path: {item.id[:200]}")
    return items


def _count(items: Sequence[DatasetItem], max_items: int) -> None:
    if len(items) > max_items:
        raise too_large(f"an import adds at most {max_items} images (collections.max_items_per_import)", "path")


def _manifest(manifest: Path, roots: Sequence[str], max_items: int) -> list[DatasetItem]:
    items: list[DatasetItem] = []
    with manifest.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"path: line {number}"
            try:
                entry = _ManifestLine.model_validate_json(line)
            except ValidationError as exc:
                problem = exc.errors()[0]
                at = ".".join(str(p) for p in problem["loc"])
                raise bad_input(f"manifest line {number}: {at + ': ' if at else ''}{problem['msg']}", where) from None
            path = allowed(manifest.parent / entry.path, roots, where)
            if not path.is_file():
                raise ClipError(ErrorCode.not_found, f"manifest line {number}: no file {entry.path[:200]!r}", where)
            items.append(DatasetItem(entry.id or entry.path, path, entry.metadata))
            _count(items, max_items)
    return items


def start_import(
    services: Services, pipeline: Pipeline, collections: Collections, info: CollectionInfo, items: list[DatasetItem]
) -> Job:
    job = Job("import", model_ref(info), total=len(items))

    async def work(job: Job) -> None:
        await _import(services, pipeline, collections, info, items, job)

    return collections.jobs.start(info.name, job, work)


async def _import(
    services: Services,
    pipeline: Pipeline,
    collections: Collections,
    info: CollectionInfo,
    items: list[DatasetItem],
    job: Job,
) -> None:
    entry = services.models.resolve(info.model).entry
    batch = collections.settings.max_items_per_add
    for start in range(0, len(items), batch):
        job.check_stopping()
        chunk = items[start : start + batch]
        current = entry.current
        if current is not None and current.bundle.version != info.version:
            raise ClipError(
                ErrorCode.version_mismatch,
                f"{info.model} serves {current.ref} now, not {model_ref(info)}: {job.done} of {job.total} images "
                "were added; re-embed the collection, then import again (ids already there are replaced)",
            )
        raw = [await collections.call(_read, item.path) for item in chunk]
        fields = [f"import.{item.id}" for item in chunk]
        async with services.models.lease(Selection(entry, info.version)) as rt:
            await add_read_images(
                pipeline, rt, collections, info, [(i.id, i.metadata) for i in chunk], raw, fields, staged=False
            )
        job.done += len(chunk)
        services.metrics.collection_job_images(job.kind, len(chunk))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ClipError(ErrorCode.not_found, f"cannot read {str(path)!r}: {exc.strerror}") from None
