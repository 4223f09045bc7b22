"""At start-up: takes up every job a server left running (stopped, or killed) from the record kept
with its collection: a re-embedding (``versions.resume_reembed``) or an import
(``imports.resume_import``). Each then waits for its collection's job lease, so among servers
sharing a database one runs it and the others follow it (``service.collections.leases``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from clipcore.errors import ClipError
from service.api.deps import Services
from service.collections.imports import ItemCheck, resume_import
from service.collections.service import Collections
from service.collections.versions import resume_reembed
from service.runtime.pipeline import Pipeline

log = logging.getLogger("service.collections")
RESUME_RETRY_S = 5.0  # between tries to read the running jobs while the store cannot be reached


async def resume_jobs(services: Services, pipeline: Pipeline, collections: Collections, check: ItemCheck) -> None:
    """Until a re-embedding taken up has switched its collection, that collection answers 503 like
    any being re-embedded. A database not reachable yet is waited for. ``check``: an import's
    per-item check (its dataset is listed again)."""
    while True:
        try:
            saved = await collections.call(collections.store.saved_jobs)
            break
        except ClipError as exc:
            log.warning("collections: the running jobs cannot be read yet (%s); retrying", exc.message)
            await asyncio.sleep(RESUME_RETRY_S)
    for name, record in saved.items():
        if collections.jobs.running(name) is not None:  # a request started one meanwhile
            continue
        kind = record.get("kind", "reembed")  # a record from before imports were recorded: a re-embedding
        try:
            if kind == "reembed":
                resume_reembed(services, pipeline, collections, name, record)
            elif kind == "import":
                resume_import(services, pipeline, collections, name, record, check)
            else:
                raise ValueError(f"a job record of an unknown kind: {record!r}")
        except ValueError as exc:
            log.warning("collection %s: %s is dropped", name, exc)
            with contextlib.suppress(ClipError):  # the collection dropped meanwhile
                await collections.call(collections.store.save_job, name, None)
