"""Scoring a whole dataset through the service, resumably: ``run`` / ``run_async``.

Rows are read in input order and cut into batches of the size the server takes in one request
(``GET /limits``); up to ``concurrency`` requests are in flight at once (never more than the
server's ``max_concurrent_requests``), each sent with the SDK's retry policy (429 and 503 wait
for ``Retry-After``). Answers are written in input order, ``row_group_rows`` rows per row group,
through :class:`~clipdiff.bulk.output.PartedOutput`, which lets a killed run resume.

A batch the server refuses as a whole for what its rows hold (400, 413, 422: an image it cannot
decode; 404 ``unknown_image``: a ``sha256`` it has not seen) is sent again one row at a time,
so only the bad rows fail, each with the server's reason in ``error``. A failure that is not the
rows' (the service unreachable, overloaded past the retries, a wrong key or model) stops the
run: the rows written so far stay, and the same call resumes.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

from clipdiff.bulk.datasets import Row, open_dataset
from clipdiff.bulk.output import PartedOutput
from clipdiff.bulk.progress import make_progress
from clipdiff.bulk.tasks import TASKS, BulkOptions, RowError, Task, output_schema
from clipdiff.client import AsyncClient
from clipdiff.errors import BadRequest, ClipServiceError, NotFound, PayloadTooLarge

__all__ = ["BulkSummary", "run", "run_async", "shard_bounds"]

DEFAULT_CONCURRENCY = 4


class RowRefused(Exception):
    """The server refused a request for what its rows hold (``reason``: its code and message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def rows_at_fault(exc: ClipServiceError) -> bool:
    """The server read the rows and refused them (a bad image, one over a limit, an unknown
    ``sha256`` reference), rather than the run (an unknown model, a wrong key, no service)."""
    return isinstance(exc, (BadRequest, PayloadTooLarge)) or (isinstance(exc, NotFound) and exc.code == "unknown_image")


@dataclass
class BulkSummary:
    """What a run did: ``rows`` in the output, ``scored`` by this run (``resumed`` were already
    there), ``failed`` rows with their reasons (reason -> count), ``seconds`` and ``rate``
    (rows per second of this run)."""

    task: str
    output: Path
    rows: int
    scored: int
    resumed: int
    failed: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    already_finished: bool = False

    @property
    def rate(self) -> float:
        return self.scored / self.seconds if self.seconds > 0 else 0.0

    def text(self) -> str:
        if self.already_finished:
            return f"bulk {self.task}: {self.output} is already complete ({self.rows} rows); nothing to do"
        lines = [
            f"bulk {self.task}: {self.rows} rows in {self.output}; {self.scored} scored in {self.seconds:.1f} s "
            f"({self.rate:.1f} rows/s), {self.resumed} resumed from an earlier run, "
            f"{sum(self.failed.values())} failed"
        ]
        lines += [f"  {count} x {reason}" for reason, count in self.failed.most_common(10)]
        if len(self.failed) > 10:
            lines.append(f"  ... and {len(self.failed) - 10} other reasons (see the error column)")
        return "\n".join(lines)


def shard_bounds(total: int, shard: tuple[int, int] | None) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``i`` of ``n`` (contiguous blocks, sizes differing by at most one)."""
    if shard is None:
        return 0, total
    index, count = shard
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: the index must be in 0..{count - 1}")
    return total * index // count, total * (index + 1) // count


def _batches(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    while batch := list(islice(rows, size)):
        yield batch


class _Scorer:
    def __init__(self, client: AsyncClient, task: Task, options: BulkOptions, concurrency: int) -> None:
        self.client, self.task, self.options = client, task, options
        self.slots = asyncio.Semaphore(concurrency)

    async def _send(self, items: list[Any]) -> list[dict[str, Any]]:
        async with self.slots:
            try:
                return await self.task.score(self.client, items, self.options)
            except ClipServiceError as exc:
                if rows_at_fault(exc):
                    raise RowRefused(f"{exc.code}: {exc.message}") from exc
                raise

    async def batch(self, rows: list[Row]) -> list[dict[str, Any]]:
        """One output record per row, in order."""
        records: list[dict[str, Any]] = [{"index": r.index, "key": r.key, "error": r.error} for r in rows]
        items: dict[int, Any] = {}
        for i, row in enumerate(rows):
            if row.error is None:
                try:
                    items[i] = self.task.item(row, self.options)
                except RowError as exc:
                    records[i]["error"] = str(exc)
        if not items:
            return records
        try:
            answers = dict(zip(items, await self._send(list(items.values())), strict=True))
        except RowRefused as exc:
            answers = {}
            if len(items) == 1:
                records[next(iter(items))]["error"] = exc.reason
            else:
                for i, item in items.items():  # find the rows the server refuses
                    try:
                        answers[i] = (await self._send([item]))[0]
                    except RowRefused as one:
                        records[i]["error"] = one.reason
        for i, answer in answers.items():
            records[i].update(answer)
        return records


async def run_async(
    task: str,
    input: str | Path,
    output: str | Path,
    *,
    options: BulkOptions | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    input_format: str | None = None,
    concurrency: int | None = None,
    batch_size: int | None = None,
    row_group_rows: int = 1024,
    shard: tuple[int, int] | None = None,
    overwrite: bool = False,
    max_retries: int = 8,
    timeout: float = 120.0,
    progress: str = "auto",
    progress_interval: float = 5.0,
    stream: TextIO | None = None,
) -> BulkSummary:
    """Score the rows of ``input`` with ``task`` (``embed``, ``classify``, ``rank-pairs``,
    ``score-dense``) into the Parquet file ``output``; see :func:`run`."""
    if task not in TASKS:
        raise ValueError(f"unknown bulk command {task!r}: one of {', '.join(TASKS)}")
    if row_group_rows < 1:
        raise ValueError("row_group_rows must be >= 1")
    job, options = TASKS[task], options or BulkOptions()
    job.check(options)
    dataset = open_dataset(input, input_format)
    start, stop = shard_bounds(dataset.count(), shard)
    settings = {
        "task": task,
        "input": str(Path(input).resolve()),
        "rows": [start, stop],
        "options": options.manifest(),
    }
    out = PartedOutput(output, output_schema(job), settings)
    began = time.monotonic()
    finished = None if overwrite else out.finished_rows()
    if finished is not None:
        return BulkSummary(task, out.path, finished, 0, finished, already_finished=True)
    resumed = out.resume(overwrite)
    summary = BulkSummary(task, out.path, 0, 0, resumed)
    async with AsyncClient(base_url, api_key, timeout=timeout, max_retries=max_retries) as client:
        limits = await client.limits()
        size = max(1, min(batch_size or job.batch_size(limits), job.batch_size(limits)))
        allowed = limits.max_concurrent_requests or 1 << 30
        slots = max(1, min(concurrency or DEFAULT_CONCURRENCY, allowed))
        scorer = _Scorer(client, job, options, slots)
        bar = make_progress(task, stop - start, resumed, progress, stream, progress_interval)
        pending: list[dict[str, Any]] = []

        def take(records: list[dict[str, Any]]) -> None:
            pending.extend(records)
            summary.scored += len(records)
            summary.failed.update(r["error"] for r in records if r.get("error"))
            if len(pending) >= row_group_rows:
                out.write(pending[:])
                pending.clear()
            bar.advance(len(records))

        # Twice as many batches are started as may be in flight, so one waiting to be written in
        # order (a slow head) does not leave the server idle; the window bounds what is held.
        window: deque[asyncio.Task[list[dict[str, Any]]]] = deque()
        try:
            batches = _batches(dataset.rows(start + resumed, stop), size)
            # Reading (files, tar members) runs in a thread, so answers keep arriving meanwhile.
            while rows := await asyncio.to_thread(next, batches, None):
                window.append(asyncio.ensure_future(scorer.batch(rows)))
                while len(window) >= 2 * slots:
                    take(await window.popleft())
            while window:
                take(await window.popleft())
            if pending:
                out.write(pending)
        finally:
            for pending_task in window:
                pending_task.cancel()
            bar.close()
    summary.rows = out.finish()
    summary.seconds = time.monotonic() - began
    return summary


def run(task: str, input: str | Path, output: str | Path, **kwargs: Any) -> BulkSummary:
    """Score a dataset in bulk through the service and write the answers to a Parquet file.

    Args:
        task: ``embed``, ``classify``, ``rank-pairs`` or ``score-dense`` (columns: :mod:`clipdiff.bulk.tasks`).
        input: a folder of images, a ``.jsonl`` or ``.parquet`` file, a WebDataset ``.tar``
            shard or a folder of them (``input_format=`` names the format when the path does not).
        output: the Parquet file to write; a run stopped before the end resumes when called again
            with the same arguments (``overwrite=True`` starts again).
        options: :class:`~clipdiff.bulk.tasks.BulkOptions`: labels, texts, difference, model, ...
        base_url, api_key: the service (default ``$CLIP_SERVICE_URL`` / ``$CLIP_SERVICE_API_KEY``).
        concurrency: requests in flight (default 4, at most the server's ``max_concurrent_requests``).
        batch_size: rows per request (default and maximum: what the server's limits allow).
        row_group_rows: rows per Parquet row group, the unit a resumed run restarts from.
        shard: ``(i, n)``: only block ``i`` of ``n`` equal blocks of the rows.
        max_retries: retries of a request on 429 / 503 / no connection (the SDK's backoff).
        progress: ``auto`` (a bar on a terminal, lines otherwise), ``bar``, ``plain`` or ``none``.

    Returns:
        A :class:`BulkSummary`; rows that failed are in the output with their ``error``.
    """
    return asyncio.run(run_async(task, input, output, **kwargs))


def print_summary(summary: BulkSummary, stream: TextIO | None = None) -> None:
    print(summary.text(), file=stream or sys.stderr, flush=True)
