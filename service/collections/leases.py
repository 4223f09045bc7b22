"""One server at a time runs a collection's job, among every server sharing its store.

Before a job (a re-embedding, an import) embeds anything, it claims the collection's job lease
(``CollectionStore.claim_job``: on PostgreSQL a session-level advisory lock, which PostgreSQL
releases by itself when the holder dies). A server that cannot claim it keeps the job waiting:
its status shows the progress the holder records (``runs_here`` false) and, for a re-embedding,
the collection answers 503 as on the holder. Each wait tries the lease again, so when the holder
dies another server takes the job up where it stood (a re-embedding from its staged copy, an
import past the images already added). The holder checks its lease before every batch and, once
it is lost, stops writing and waits like the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from clipcore.errors import ClipError, ErrorCode
from service.collections.jobs import Job
from service.collections.service import Collections
from service.collections.store import JobLease

log = logging.getLogger("service.collections")
LEASE_POLL_S = 1.0  # how often a waiting job tries the lease again (and reads the holder's progress)


class LeaseLost(Exception):
    """The job's lease went (its database session ended): another server may run the job now."""


async def run_leased(collections: Collections, name: str, job: Job, run: Callable[[Job], Awaitable[None]]) -> None:
    """``run(job)`` once this server holds the collection's job lease, waiting for it meanwhile
    (``run`` goes on from what another server's run of the job left). A failure removes the job's
    record."""
    waited = False
    while True:
        job.check_stopping()
        lease = await _claim(collections, name, quiet=waited)
        if lease is not None:
            job.lease, job.runs_here = lease, True
            try:
                await run(job)
                return
            except LeaseLost:
                job.runs_here = False
                log.warning("collection %s: the %s job lost its lease; another server may run it now", name, job.kind)
            except BaseException:
                # A job that failed here ends: its record goes (the holder's to remove). One stopped
                # by the server's shutdown keeps it, to be taken up at the next start.
                if not job.stopping:
                    with contextlib.suppress(ClipError):  # dropped, or the database gone: nothing to remove
                        await collections.call(collections.store.save_job, name, None)
                raise
            finally:
                job.lease = None
                await collections.call(lease.release)
        elif not waited:
            log.info("collection %s: another server runs its job; this one waits for it to end", name)
        waited = True
        await _follow(collections, name, job)
        await asyncio.sleep(LEASE_POLL_S)


async def keep_lease(collections: Collections, job: Job) -> None:
    """Called before each batch of a leased job: ``LeaseLost`` once another server may run it."""
    if job.lease is not None and not await collections.call(job.lease.holds):
        raise LeaseLost


async def _claim(collections: Collections, name: str, *, quiet: bool) -> JobLease | None:
    """The lease, or None while another server holds it or the database cannot be reached (logged
    once a wait, not every try)."""
    try:
        return await collections.call(collections.store.claim_job, name)
    except ClipError as exc:
        if exc.code is not ErrorCode.not_ready:  # the collection dropped: the job ends
            raise
        level = logging.DEBUG if quiet else logging.WARNING
        log.log(level, "collection %s: its job lease cannot be claimed yet (%s)", name, exc.message)
        return None


async def _follow(collections: Collections, name: str, job: Job) -> None:
    """The holder's recorded progress, shown by this server's status of the job."""
    try:
        record = await collections.call(collections.store.saved_job, name)
    except ClipError:
        return
    if record is not None and record.get("kind", "reembed") == job.kind:
        try:
            job.done, job.total = int(record["done"]), int(record["total"])  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            pass
