"""A collection follows its model's version: the version check of every request, and the
re-embedding that moves a collection to the version its model serves now.

A collection holds the embeddings of one version. Once its model serves another, a request is
refused (409 ``version_mismatch``, or with ``collections.reembed: auto`` the re-embedding starts)
until a re-embedding has embedded every kept image with the new version into a staged copy and
replaced the collection by it at once. While it runs the collection answers 503 (the old
version's model is no longer served to embed a query, and the new items are incomplete): a
search is never answered from a mix of the two. The job's record (target version, progress) is
kept with the collection after every batch; a server that stopped or was killed mid-job takes it
up at start-up (``resume_reembed``), going on from the staged copy. One server at a time runs it
(``service.collections.leases``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence

from fastapi import Request

from clipcore.errors import ClipError, ErrorCode
from service.api.answering import use_model
from service.api.deps import Services
from service.collections.jobs import Job
from service.collections.leases import keep_lease, run_leased
from service.collections.operations import add_read_images, stores_dense
from service.collections.service import Collections, model_ref
from service.collections.store import CollectionInfo, StoredImage
from service.runtime.assembly import ModelRuntime
from service.runtime.pipeline import Pipeline
from service.runtime.served import Selection

log = logging.getLogger("service.collections")


@contextlib.asynccontextmanager
async def bound_runtime(
    request: Request, services: Services, pipeline: Pipeline, collections: Collections, info: CollectionInfo
) -> AsyncIterator[ModelRuntime]:
    """The runtime of the version the collection holds, held for the request; 503 while it is
    re-embedded, and once its model serves another version 409 ``version_mismatch`` (or, with
    ``collections.reembed: auto``, a re-embedding starts and the answer is 503): never mixed."""
    try:
        selection = check_version(services, pipeline, collections, info)
    except ClipError as exc:
        if exc.code is ErrorCode.version_mismatch:
            await _join_recorded_reembed(services, pipeline, collections, info)
        raise
    # No await between the check above and the hold: a swap cannot come in between.
    async with use_model(request, services, Selection(selection.entry, info.version)) as runtime:
        yield runtime


def check_version(services: Services, pipeline: Pipeline, collections: Collections, info: CollectionInfo) -> Selection:
    """The collection's served model, if it still serves the collection's version and no
    re-embedding runs; else the refusal ``bound_runtime`` describes."""
    collections.jobs.refuse_while_reembedding(info.name)
    selection = services.models.resolve(info.model)
    current = selection.entry.current
    if current is not None and current.bundle.version != info.version:
        if collections.settings.reembed == "auto":
            job = start_reembed(services, pipeline, collections, info)
            raise ClipError(
                ErrorCode.not_ready,
                f"collection {info.name!r} holds embeddings of {model_ref(info)}, but {info.model} now serves "
                f"{job.model}: it is being re-embedded ({job.total} images) and answers once that completes",
                "name",
                retry_after=2,
            )
        raise ClipError(
            ErrorCode.version_mismatch,
            f"collection {info.name!r} holds embeddings of {model_ref(info)}, but {info.model} now serves "
            f"{current.ref}; a collection never mixes versions: POST /collections/{info.name}/reembed embeds its "
            "images again with the new version",
            "name",
        )
    return selection


async def _join_recorded_reembed(
    services: Services, pipeline: Pipeline, collections: Collections, info: CollectionInfo
) -> None:
    """A collection another server re-embeds (to the version this one serves: its record says so)
    answers 503 here too, as on that server, not 409: this server follows the job (and takes it
    up if that server dies)."""
    record = await collections.call(collections.store.saved_job, info.name)
    current = services.models.resolve(info.model).entry.current
    if record is None or record.get("kind", "reembed") != "reembed" or current is None:
        return
    if record.get("version") != current.bundle.version or collections.jobs.running(info.name) is not None:
        return
    job = start_reembed(services, pipeline, collections, info)
    raise ClipError(
        ErrorCode.not_ready,
        f"collection {info.name!r} is being re-embedded with {job.model} (by another server sharing its database); "
        "it answers again once that completes (GET /collections/{name} shows the progress)",
        "name",
        retry_after=2,
    )


def start_reembed(services: Services, pipeline: Pipeline, collections: Collections, info: CollectionInfo) -> Job:
    """Starts re-embedding ``info``'s collection with the version its model serves now (the
    running re-embedding if one runs); for a collection already on that version the job ends at once."""
    running = collections.jobs.running(info.name)
    if running is not None and running.kind == "reembed":
        return running
    selection = services.models.resolve(info.model)
    current = selection.entry.current
    if current is None:
        raise ClipError(ErrorCode.not_ready, selection.entry.not_ready_message(), retry_after=1)
    target = Selection(selection.entry, current.bundle.version)
    job = Job("reembed", current.ref, total=info.count)

    async def run(job: Job) -> None:
        await _reembed(services, pipeline, collections, info.name, target, job)

    async def work(job: Job) -> None:
        await run_leased(collections, info.name, job, run)

    return collections.jobs.start(info.name, job, work)


def resume_reembed(
    services: Services, pipeline: Pipeline, collections: Collections, name: str, record: Mapping[str, object]
) -> Job:
    """Takes up the re-embedding ``record`` describes (``ValueError`` for a record not readable)."""
    try:
        version = str(record["version"])
        job = Job("reembed", str(record["model"]), int(record["total"]), int(record["done"]),  # type: ignore[call-overload]
                  started_at=str(record["started_at"]))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"an unreadable re-embedding record: {record!r}") from exc

    async def run(job: Job) -> None:
        info = await collections.call(collections.store.info, name)
        entry = services.models.resolve(info.model).entry
        while entry.current is None and entry.state == "loading":  # the server's models load at start
            job.check_stopping()
            await asyncio.sleep(0.2)
        current = entry.current
        if current is not None and current.bundle.version != version:
            raise ClipError(
                ErrorCode.version_mismatch,
                f"{info.model} serves {current.ref} now, not {job.model}: the re-embedding is not taken up",
            )
        await _reembed(services, pipeline, collections, name, Selection(entry, version), job)

    async def work(job: Job) -> None:
        await run_leased(collections, name, job, run)

    collections.jobs.start(name, job, work)
    log.info("collection %s: re-embedding with %s taken up again (%d/%d images)", name, job.model, job.done, job.total)
    return job


async def _save(collections: Collections, name: str, job: Job, version: str) -> None:
    record = {"kind": job.kind, "model": job.model, "version": version, "total": job.total, "done": job.done,
              "started_at": job.started_at}  # fmt: skip
    await collections.call(collections.store.save_job, name, record)


async def _reembed(
    services: Services,
    pipeline: Pipeline,
    collections: Collections,
    name: str,
    target: Selection,
    job: Job,
) -> None:
    store, version = collections.store, target.version
    assert version is not None
    info = await collections.call(store.info, name)
    if info.version == version:
        job.total = job.done = info.count
        await collections.call(store.save_job, name, None)
        return  # already on it (a second request raced the first, or the switch came before a restart)
    items = await collections.call(store.stored_images, name)
    job.total = len(items)
    _require_kept(name, items)
    staged: CollectionInfo | None = None
    done: set[tuple[str, str | None, str]] = set()
    restage = True
    # What a staged copy for this version holds already (a job taken up after a restart, or from a
    # server that died) is not embedded again: an item staged with the same bytes and metadata is
    # what this job would write.
    previous = await collections.call(store.staged_images, name)
    if previous is not None and previous[0] == version and {i.id for i in previous[1]} <= {i.id for i in items}:
        done, restage = {_key(item) for item in previous[1]}, False
    job.done = sum(_key(item) in done for item in items)
    await _save(collections, name, job, version)
    batch = collections.settings.max_items_per_add
    # An add that held the old version before the job started may land after the listing: the
    # items are listed again until every one is in the staged copy, so none is lost by the switch.
    while todo := [item for item in items if _key(item) not in done]:
        job.total = len(done) + len(todo)
        for start in range(0, len(todo), batch):
            job.check_stopping()
            await keep_lease(collections, job)
            chunk = todo[start : start + batch]
            raw = [await collections.call(collections.images.get, name, item.image) for item in chunk if item.image]
            # Leased per batch: once the entry serves yet another version, the lease refuses this
            # one (unknown_model) and the job fails, the collection untouched on its old version.
            async with services.models.lease(target) as rt:
                if staged is None:
                    staged = dataclasses.replace(info, version=version, dim=rt.bundle.embed_dim, dense=stores_dense(rt))
                    if restage:
                        await collections.call(store.stage, name, version, staged.dim, staged.dense)
                fields = [f"reembed.{item.id}" for item in chunk]
                await add_read_images(
                    pipeline, rt, collections, staged, [(i.id, i.metadata) for i in chunk], raw, fields, staged=True
                )
            done.update(_key(item) for item in chunk)
            job.done += len(chunk)
            services.metrics.collection_job_images(job.kind, len(chunk))
            await _save(collections, name, job, version)  # the progress a restart goes on from
        items = await collections.call(store.stored_images, name)
        _require_kept(name, items)
        if staged is not None or not restage:
            # What the staged copy holds, not what this job wrote to it: a copy replaced meanwhile
            # (another server's job on a shared database) is filled again, never switched to short.
            holds = await collections.call(store.staged_images, name)
            done = {_key(item) for item in holds[1]} if holds is not None and holds[0] == version else set()
            job.done = sum(_key(item) in done for item in items)
    job.check_stopping()
    await keep_lease(collections, job)
    current = target.entry.current
    if current is None or current.bundle.version != version:
        await collections.call(store.discard_staged, name)
        raise ClipError(
            ErrorCode.version_mismatch,
            f"{info.model} serves {current.ref if current else 'nothing'} now, not {job.model}: re-embed again",
        )
    if staged is None and restage:  # an empty collection: nothing to embed, only its version to change
        async with services.models.lease(target) as rt:
            await collections.call(store.stage, name, version, rt.bundle.embed_dim, stores_dense(rt))
    await collections.call(store.commit_staged, name)  # removes the job record in the same step
    await collections.call(collections.images.keep_only, name, {item.image for item in items if item.image})


def _key(item: StoredImage) -> tuple[str, str | None, str]:
    return item.id, item.image, json.dumps(item.metadata, sort_keys=True)


def _require_kept(name: str, items: Sequence[StoredImage]) -> None:
    unkept = [item.id for item in items if item.image is None]
    if unkept:
        raise ClipError(
            ErrorCode.not_found,
            f"{len(unkept)} items of collection {name!r} were added before their images were kept (the first: "
            f"{unkept[0]!r}); add them again (the same id replaces an item), then re-embed",
        )
