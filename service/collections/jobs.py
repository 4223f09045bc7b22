"""The background jobs of a collection (a re-embedding, a dataset import) and their progress.

A job runs as a task of the server's event loop; its progress is shown by ``GET
/collections/{name}`` (the last job of the collection, running or finished) and in the
``clip_collection_job_images_total`` metric. Each keeps its record with the collection after
every batch, so a restarted server takes it up (``service.collections.versions``: a re-embedding
from its staged copy; ``service.collections.imports``: an import past the images already added),
and one server at a time runs it (``service.collections.leases``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from clipcore.errors import ClipError, ErrorCode
from service.collections.store import JobLease

log = logging.getLogger("service.collections")

JobKind = Literal["reembed", "import"]
JobState = Literal["running", "done", "failed"]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Job:
    kind: JobKind
    model: str  # the name@version that embeds its images
    total: int = 0  # images to embed, once known
    done: int = 0
    state: JobState = "running"
    error: str | None = None
    started_at: str = ""
    finished_at: str | None = None
    stopping: bool = False  # set by ``JobBoard.cancel``: the job ends before its next batch
    # Whether this server holds the job's lease and runs it; false until it does, and while another
    # server sharing the store runs it (this one waits, showing that server's recorded progress).
    runs_here: bool = False
    lease: JobLease | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.started_at = self.started_at or now()

    def check_stopping(self) -> None:
        """Called between batches: a job asked to stop ends there (never within a store call, which
        runs on a thread that a task's cancellation would not stop)."""
        if self.stopping:
            raise ClipError(ErrorCode.not_found, "cancelled: the collection was dropped, or the server stopped")


class JobBoard:
    """The last job of each collection, and the tasks of those running."""

    def __init__(self, ended: Callable[[str, str], None] | None = None) -> None:
        self.ended = ended  # (kind, result): the metric of jobs that ended
        self.jobs: dict[str, Job] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def running(self, name: str) -> Job | None:
        job = self.jobs.get(name)
        return job if job is not None and job.state == "running" else None

    def refuse_while_reembedding(self, name: str) -> None:
        """A collection being re-embedded answers nothing: its old version's model is no longer
        served and its new version's items are not complete (never a mix of the two)."""
        job = self.running(name)
        if job is not None and job.kind == "reembed":
            raise ClipError(
                ErrorCode.not_ready,
                f"collection {name!r} is being re-embedded with {job.model} ({job.done}/{job.total} images); "
                "it answers again once that completes (GET /collections/{name} shows the progress)",
                "name",
                retry_after=2,
            )

    def start(self, name: str, job: Job, work: Callable[[Job], Awaitable[None]]) -> Job:
        """Runs ``work(job)`` in the background; one job per collection at a time."""
        busy = self.running(name)
        if busy is not None:
            raise ClipError(
                ErrorCode.not_ready,
                f"collection {name!r} runs a {busy.kind} job ({busy.done}/{busy.total}); start another once it ends",
                "name",
                retry_after=2,
            )
        self.jobs[name] = job
        self._tasks[name] = asyncio.get_running_loop().create_task(self._run(name, job, work))
        return job

    async def _run(self, name: str, job: Job, work: Callable[[Job], Awaitable[None]]) -> None:
        try:
            await work(job)
            job.state = "done"
        except ClipError as exc:
            job.state, job.error = "failed", exc.message
            log.warning("collection %s: %s job failed: %s", name, job.kind, exc.message)
        except Exception:
            log.exception("collection %s: %s job failed", name, job.kind)
            job.state, job.error = "failed", "internal error (see the server log)"
        finally:
            job.finished_at = now()
            self._tasks.pop(name, None)
            if self.ended is not None:
                self.ended(job.kind, job.state)

    async def cancel(self, name: str) -> None:
        """Stops the collection's job at its next batch and waits for it: once this returns,
        nothing of the job writes to the collection (which may then be dropped, or made again)."""
        job, task = self.jobs.get(name), self._tasks.get(name)
        if task is not None:
            if job is not None:
                job.stopping = True
            await asyncio.gather(task, return_exceptions=True)
        self.jobs.pop(name, None)

    async def close(self) -> None:
        for name in list(self._tasks):
            await self.cancel(name)
