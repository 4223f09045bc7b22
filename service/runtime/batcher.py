"""Dynamic batching of model calls with a bounded queue, deadlines and stage timings.

Concurrent requests put their items in one queue; a collector task groups them into batches of
at most ``max_batch`` items, waiting at most ``max_wait_ms`` after the oldest queued item for
more, and runs ``fn`` on a worker thread so the event loop never blocks on the model. A batch
that is not full first lets the event loop turn a few times, for as long as that brings more
items (requests it has already read reach ``submit`` a turn or two later): no time is waited,
and under load batches are larger, which makes the model cheaper per item. Batches run one
after another: while one runs, the next fills up, which is what makes batching pay off under
load. Backpressure is explicit: a submit that does not fit in the queue fails at once with
``QueueFull`` (HTTP 429) instead of waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from service.runtime.batcher_errors import (
    BatcherClosed,
    BatcherError,
    DeadlineExceeded,
    QueueFull,
    RequestTooLarge,
)

if TYPE_CHECKING:
    from service.runtime.metrics import ModelMetrics, ServiceMetrics

__all__ = [
    "BatcherClosed",
    "BatcherError",
    "DeadlineExceeded",
    "DynamicBatcher",
    "QueueFull",
    "RequestTooLarge",
    "Reservation",
    "SubmitTimings",
]

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

# Batch time assumed before any batch has run, for the first Retry-After estimates.
_INITIAL_BATCH_S = 0.05
_EWMA_ALPHA = 0.2
# At most this many turns of the event loop gather arrivals before a partial batch runs.
_ARRIVAL_TURNS = 8


@dataclass(frozen=True)
class SubmitTimings:
    """Per-request stage times: queued before its first batch, then running until done."""

    queue_s: float
    run_s: float
    batches: int


@dataclass(eq=False)
class Reservation:
    """Room held in a batcher's queue by ``DynamicBatcher.reserve``; release it before submitting
    the items it was for (and in any case when the request ends)."""

    batcher: DynamicBatcher  # type: ignore[type-arg]
    n: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.batcher._reserved -= self.n

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False)
class _Request(Generic[T, R]):
    items: Sequence[T]
    future: asyncio.Future[list[R]]
    enqueued_at: float
    deadline: float | None
    results: list[R | None] = field(default_factory=list)
    taken: int = 0  # items handed to batches so far (prefix of ``items``)
    done: int = 0  # items whose results arrived
    dead: bool = False  # failed, timed out or cancelled: skip whatever is still queued
    first_start: float | None = None
    batches: int = 0

    @property
    def untaken(self) -> int:
        return len(self.items) - self.taken


class DynamicBatcher(Generic[T, R]):
    """Groups items from concurrent ``submit`` calls into batched calls of ``fn``.

    ``fn`` gets a list of items and must return one result per item, in order (a list, or
    anything ``list()`` turns into one, e.g. a 2-D array becomes its rows).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[list[T]], Iterable[R]],
        *,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
        executor: concurrent.futures.ThreadPoolExecutor | None = None,
        metrics: ServiceMetrics | ModelMetrics | None = None,
        default_timeout_s: float | None = None,
        max_delay_s: float | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and max_queue must be >= 1 and max_wait_ms >= 0")
        self.name = name
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        # The queue measured in time: a submit whose last item would wait longer than this
        # (batches ahead of it x the measured batch time) is refused with Retry-After, so
        # overload answers 429 at once instead of seconds of latency (None: no such bound).
        self.max_delay_s = max_delay_s
        self.default_timeout_s = default_timeout_s
        self._fn = fn
        self._metrics = metrics
        # One dedicated thread by default: model calls stay off the loop and never overlap.
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"batcher-{name}"
        )
        self._queue: deque[_Request[T, R]] = deque()
        self._depth = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._batch_s = _INITIAL_BATCH_S  # EWMA of fn run time, for Retry-After
        self._full_batch_s: float | None = None  # EWMA of full batches' run time, once one has run
        self._reserved = 0  # items admitted by reserve() and not yet submitted

    # -- public -------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Items queued and not yet handed to a batch."""
        return self._depth

    @property
    def full_batch_s(self) -> float | None:
        """Measured run time of a full batch (``max_batch`` items); None until one has run."""
        return self._full_batch_s

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"batcher {self.name!r} already started")
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._task = self._loop.create_task(self._collect(), name=f"batcher-{self.name}")

    async def submit(self, items: Sequence[T], timeout_s: float | None = None) -> list[R]:
        """Run ``items`` through ``fn``; all results in input order, or one exception."""
        results, _ = await self.submit_timed(items, timeout_s)
        return results

    async def submit_timed(self, items: Sequence[T], timeout_s: float | None = None) -> tuple[list[R], SubmitTimings]:
        """Like ``submit``, also returning queue and run times (for X-Queue-Time headers)."""
        if self._task is None or self._wakeup is None or self._loop is None:
            raise RuntimeError(f"batcher {self.name!r} not started")
        n = len(items)
        self.admit(n)
        if n == 0:
            return [], SubmitTimings(0.0, 0.0, 0)

        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        now = self._loop.time()
        req: _Request[T, R] = _Request(
            items=items,
            future=self._loop.create_future(),
            enqueued_at=now,
            deadline=None if timeout is None else now + timeout,
            results=[None] * n,
        )
        self._queue.append(req)
        self._depth += n
        self._publish_depth()
        self._wakeup.set()
        try:
            # A timeout block rather than wait_for: no waiter future and callbacks of its own per
            # request. No shield either (another future and two callback hops per request): a
            # timeout or a client gone cancels ``req.future`` itself, and the collector completes
            # only futures not done, of requests not dropped.
            async with asyncio.timeout(timeout):
                results = await req.future
        except TimeoutError:
            self._drop(req)
            self.record_rejection("deadline")
            raise DeadlineExceeded(f"batcher {self.name!r}: request not done within {timeout:.3f}s") from None
        except asyncio.CancelledError:
            # Client went away: free its queue slots so they are not computed for nobody.
            self._drop(req)
            self.record_rejection("cancelled")
            raise
        end = self._loop.time()
        start = req.first_start if req.first_start is not None else end
        return results, SubmitTimings(start - req.enqueued_at, end - start, req.batches)

    def reserve(self, n: int) -> Reservation:
        """Admit ``n`` items now and hold their room until ``release`` (or the submit that
        follows): a request checks before its costly preparation (decoding images), so an
        overloaded server refuses cheaply, and concurrent requests cannot all pass the check
        before any of them has queued."""
        self.admit(n)
        self._reserved += n
        return Reservation(self, n)

    def admit(self, n: int) -> None:
        """Raise now what a submit of ``n`` items would raise (closed, too large, queue full or
        too long a wait), without queueing or reserving anything."""
        if self._closing:
            self.record_rejection("closed")
            raise BatcherClosed(f"batcher {self.name!r} is shutting down", self._retry_after(n))
        if n == 0:
            return
        if n > self.max_queue:
            self.record_rejection("too_large")
            raise RequestTooLarge(f"{n} items exceed the queue size {self.max_queue}")
        ahead = self._depth + self._reserved
        if ahead + n > self.max_queue:
            self.record_rejection("queue_full")
            raise QueueFull(f"batcher {self.name!r} queue is full", self._retry_after(n))
        if self.max_delay_s is not None and ahead > 0:  # an idle queue takes any request
            delay = math.ceil((ahead + n) / self.max_batch) * self._batch_s
            if delay > self.max_delay_s:
                self.record_rejection("queue_delay")
                raise QueueFull(
                    f"batcher {self.name!r} queue would take {delay:.2f}s (limit {self.max_delay_s:g}s)",
                    max(delay - self.max_delay_s, self._batch_s, 0.001),
                )

    async def stop(self, drain: bool = True) -> None:
        """Refuse new work; with ``drain`` finish what is queued, else fail it with BatcherClosed."""
        if self._task is None:
            self._shutdown_executor()
            return
        self._closing = True
        if not drain:
            for req in list(self._queue):
                self._fail(req, BatcherClosed(f"batcher {self.name!r} stopped", 0.0))
            self._task.cancel()
        if self._wakeup is not None:
            self._wakeup.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._shutdown_executor()

    # -- collector ----------------------------------------------------------------------------

    async def _collect(self) -> None:
        assert self._wakeup is not None and self._loop is not None
        loop = self._loop
        while True:
            self._purge_head()
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._let_arrivals_queue()
            # Wait for a full batch, but never longer than max_wait after the oldest item.
            first_at = self._queue[0].enqueued_at
            while self._depth < self.max_batch and not self._closing:
                remaining = first_at + self.max_wait_s - loop.time()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    # Not wait_for, which wraps the wait in a new task on every arrival that wakes it.
                    async with asyncio.timeout(remaining):
                        await self._wakeup.wait()
                except TimeoutError:
                    break
            parts = self._take()
            if parts:
                try:
                    await self._execute(parts)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug here must not kill the collector; requests got errors
                    log.exception("batcher %s: unexpected error while running a batch", self.name)

    async def _let_arrivals_queue(self) -> None:
        """Before a batch that is not full: a few turns of the event loop, for as long as they bring
        more items. Requests the loop has already read (and those whose answers it is writing) reach
        ``submit`` a turn or two after the model became free; taken at once, the batch would leave
        them to the next one, and small batches cost the model more per item."""
        for turn in range(_ARRIVAL_TURNS):
            depth = self._depth
            if depth >= self.max_batch or self._closing:
                return
            await asyncio.sleep(0)
            if turn and self._depth == depth:  # the first turn only reads the sockets
                return

    def _purge_head(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        while self._queue:
            head = self._queue[0]
            if head.dead or head.untaken == 0:
                self._queue.popleft()
            elif head.deadline is not None and now >= head.deadline:
                self.record_rejection("deadline")
                self._fail(head, DeadlineExceeded(f"batcher {self.name!r}: deadline passed"))
            else:
                return

    def _take(self) -> list[tuple[_Request[T, R], int, int]]:
        """Slices ``(request, start, end)`` of at most ``max_batch`` items, oldest first."""
        parts: list[tuple[_Request[T, R], int, int]] = []
        room = self.max_batch
        while room and self._queue:
            self._purge_head()
            if not self._queue:
                break
            req = self._queue[0]
            k = min(room, req.untaken)
            parts.append((req, req.taken, req.taken + k))
            req.taken += k
            self._depth -= k
            room -= k
            if req.untaken == 0:
                self._queue.popleft()
        self._publish_depth()
        return parts

    async def _execute(self, parts: list[tuple[_Request[T, R], int, int]]) -> None:
        assert self._loop is not None
        loop = self._loop
        items = [item for req, s, e in parts for item in req.items[s:e]]
        start = loop.time()
        for req, _, _ in parts:
            if req.first_start is None:
                req.first_start = start
            req.batches += 1
        wait_s = start - min(req.enqueued_at for req, _, _ in parts)
        try:
            out = await loop.run_in_executor(self._executor, self._fn, items)
            results = list(out)
            if len(results) != len(items):
                raise RuntimeError(f"batcher {self.name!r}: fn returned {len(results)} results for {len(items)} items")
            if len(items) >= self.max_batch:
                full = loop.time() - start
                prev = self._full_batch_s
                self._full_batch_s = full if prev is None else (1 - _EWMA_ALPHA) * prev + _EWMA_ALPHA * full
        except asyncio.CancelledError:
            for req, _, _ in parts:
                self._fail(req, BatcherClosed(f"batcher {self.name!r} stopped", 0.0))
            raise
        except Exception as exc:
            # Only the requests with items in this batch fail; the batcher keeps going.
            if self._metrics is not None:
                self._metrics.batch_failed(self.name)
            for req, _, _ in parts:
                self._fail(req, exc)
            return
        finally:
            run_s = loop.time() - start
            self._batch_s = (1 - _EWMA_ALPHA) * self._batch_s + _EWMA_ALPHA * run_s
            if self._metrics is not None:
                self._metrics.observe_batch(self.name, len(items), wait_s, run_s)
        offset = 0
        for req, s, e in parts:
            k = e - s
            if not req.dead:
                req.results[s:e] = results[offset : offset + k]
                req.done += k
                if req.done == len(req.items) and not req.future.done():
                    req.future.set_result(req.results)  # type: ignore[arg-type]
            offset += k

    # -- helpers ------------------------------------------------------------------------------

    def _drop(self, req: _Request[T, R]) -> None:
        """Forget a request: its queued items leave the queue (counted), its results are ignored."""
        if not req.dead:
            req.dead = True
            self._depth -= req.untaken
            req.taken = len(req.items)
            self._publish_depth()

    def _fail(self, req: _Request[T, R], exc: BaseException) -> None:
        self._drop(req)
        if not req.future.done():
            req.future.set_exception(exc)
            # The submitter may already be gone (timeout); do not warn about an unread exception.
            req.future.exception()

    def _retry_after(self, n: int) -> float:
        """Seconds until ``n`` more items would fit: the batches that must finish first."""
        excess = max(self._depth + self._reserved + n - self.max_queue, 1)
        batches = math.ceil(excess / self.max_batch)
        return max(batches * self._batch_s + self.max_wait_s, 0.001)

    def _publish_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.set_queue_depth(self.name, self._depth)

    def record_rejection(self, reason: str) -> None:
        """Count work refused for ``reason`` (also by callers that refuse before submitting)."""
        if self._metrics is not None:
            self._metrics.batcher_rejected(self.name, reason)

    def _shutdown_executor(self) -> None:
        if self._own_executor:
            # No wait: with drain every batch already finished; without, a stuck call is abandoned.
            self._executor.shutdown(wait=False, cancel_futures=True)
