"""Adding a server-side dataset to a collection: a folder of images or a JSONL manifest under a
folder the operator allowed (``collections.import_roots``), embedded as a background job.

Every path is resolved (``..`` and symbolic links followed) before it is checked against the
allowed roots, so neither a ``..`` nor a link out of a root reaches a file outside them. The
listing (and every check of ids and metadata) happens before the job starts, so a bad dataset is
refused at once with the line or file at fault; the job then reads, embeds and adds the images
in batches of ``collections.max_items_per_add``, as many adds would.

The job keeps its record with the collection (the dataset's path, the version, its progress)
after every batch, so a server that stopped or was killed mid-import takes it up at start-up: it
lists the dataset again and embeds only what the collection does not hold already as the import
adds it (the same id, bytes and metadata), so no image is added twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from service.api.deps import Services
from service.collections.image_files import digest
from service.collections.jobs import Job
from service.collections.leases import keep_lease, run_leased
from service.collections.operations import add_read_images
from service.collections.service import Collections, model_ref
from service.collections.store import CollectionInfo, Scalar, StoredImage
from service.runtime.pipeline import Pipeline
from service.runtime.served import Selection

log = logging.getLogger("service.collections")
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
    services: Services,
    pipeline: Pipeline,
    collections: Collections,
    info: CollectionInfo,
    source: str,
    items: list[DatasetItem],
) -> Job:
    """Adds ``items`` (``list_dataset`` of ``source``) to the collection in the background."""
    job = Job("import", model_ref(info), total=len(items))
    return _started(services, pipeline, collections, info.name, info.version, source, items, job)


def resume_import(
    services: Services,
    pipeline: Pipeline,
    collections: Collections,
    name: str,
    record: Mapping[str, object],
    check: ItemCheck,
) -> Job:
    """Takes up the import ``record`` describes: its dataset listed again, and only the images
    the collection does not hold already as the import adds them are embedded (``ValueError`` for
    a record not readable). A dataset that can no longer be listed fails the job."""
    try:
        version, source = str(record["version"]), str(record["path"])
        job = Job("import", str(record["model"]), int(record["total"]), int(record["done"]),  # type: ignore[call-overload]
                  started_at=str(record["started_at"]))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"an unreadable import record: {record!r}") from exc
    # Listed again by the job (file-system work, never the event loop's), once it holds the lease.
    job = _started(services, pipeline, collections, name, version, source, None, job, check=check)
    log.info("collection %s: import of %s taken up again (%d/%d images)", name, source, job.done, job.total)
    return job


def _started(
    services: Services,
    pipeline: Pipeline,
    collections: Collections,
    name: str,
    version: str,
    source: str,
    items: list[DatasetItem] | None,
    job: Job,
    check: ItemCheck | None = None,
) -> Job:
    async def run(job: Job) -> None:
        nonlocal items
        if items is None:
            assert check is not None
            roots, most = collections.settings.import_roots, collections.settings.max_items_per_import
            items = await collections.call(list_dataset, source, roots, most, check)
        await _import(services, pipeline, collections, name, version, source, items, job)

    async def work(job: Job) -> None:
        await run_leased(collections, name, job, run)

    return collections.jobs.start(name, job, work)


async def _import(
    services: Services,
    pipeline: Pipeline,
    collections: Collections,
    name: str,
    version: str,
    source: str,
    items: list[DatasetItem],
    job: Job,
) -> None:
    info = await collections.call(collections.store.info, name)
    entry = services.models.resolve(info.model).entry
    while entry.current is None and entry.state == "loading":  # taken up at start-up: the models load
        job.check_stopping()
        await asyncio.sleep(0.2)
    # What the collection holds already as this import adds it (an import taken up after a
    # restart, or the same dataset imported again) is not embedded nor added again.
    held = {item.id: item for item in await collections.call(collections.store.stored_images, name)}
    todo = await collections.call(_not_held, items, held)
    job.total, job.done = len(items), len(items) - len(todo)
    batch = collections.settings.max_items_per_add
    if todo:
        await _save(collections, name, job, version, source)  # from the start: a restart takes the job up
    for start in range(0, len(todo), batch):
        job.check_stopping()
        await keep_lease(collections, job)
        chunk = todo[start : start + batch]
        current = entry.current
        if info.version != version or (current is not None and current.bundle.version != version):
            serves = current.ref if current is not None and current.bundle.version != version else model_ref(info)
            raise ClipError(
                ErrorCode.version_mismatch,
                f"{info.model} serves {serves} now, not {job.model}: {job.done} of {job.total} images "
                "were added; re-embed the collection, then import again (the images added are not embedded again)",
            )
        raw = [await collections.call(_read, item.path) for item in chunk]
        fields = [f"import.{item.id}" for item in chunk]
        async with services.models.lease(Selection(entry, version)) as rt:
            await add_read_images(
                pipeline, rt, collections, info, [(i.id, i.metadata) for i in chunk], raw, fields, staged=False
            )
        job.done += len(chunk)
        services.metrics.collection_job_images(job.kind, len(chunk))
        await _save(collections, name, job, version, source)  # the progress a waiting server shows
    await collections.call(collections.store.save_job, name, None)


async def _save(collections: Collections, name: str, job: Job, version: str, source: str) -> None:
    record = {"kind": job.kind, "model": job.model, "version": version, "path": source, "total": job.total,
              "done": job.done, "started_at": job.started_at}  # fmt: skip
    await collections.call(collections.store.save_job, name, record)


def _not_held(items: Sequence[DatasetItem], held: Mapping[str, StoredImage]) -> list[DatasetItem]:
    """The items whose id the collection lacks, or holds with other bytes or metadata."""
    todo = []
    for item in items:
        stored = held.get(item.id)
        if (
            stored is None
            or stored.image is None
            or _json(stored.metadata) != _json(item.metadata)
            or not item.path.is_file()
            or digest(_read(item.path)) != stored.image
        ):
            todo.append(item)
    return todo


def _json(metadata: Mapping[str, Scalar]) -> str:
    return json.dumps(metadata, sort_keys=True)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ClipError(ErrorCode.not_found, f"cannot read {str(path)!r}: {exc.strerror}") from None
