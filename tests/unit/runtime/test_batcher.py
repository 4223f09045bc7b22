"""DynamicBatcher: grouping, splitting, order, backpressure, deadlines, failures, shutdown.

The model is a recording fake here (this tests the batcher, not the model); a gate lets a test
hold the worker inside a batch so that later submits pile up deterministically.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from service.runtime import (
    BatcherClosed,
    DeadlineExceeded,
    DynamicBatcher,
    QueueFull,
    RequestTooLarge,
    ServiceMetrics,
)


class Recorder:
    """fn for the batcher: doubles items, records batches, can block on a gate."""

    def __init__(self, fail_on: Any = None) -> None:
        self.batches: list[list[Any]] = []
        self.threads: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail_on = fail_on
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, items: list[Any]) -> list[Any]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.batches.append(list(items))
            self.threads.add(threading.get_ident())
            self.started.set()
            assert self.gate.wait(timeout=10), "test gate never opened"
            if self.fail_on is not None and self.fail_on in items:
                raise ValueError(f"bad item {self.fail_on!r}")
            return [x * 2 for x in items]
        finally:
            with self._lock:
                self.active -= 1

    def hold(self) -> None:
        self.gate.clear()
        self.started.clear()

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, 10)

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]

    @property
    def seen(self) -> list[Any]:
        return [x for b in self.batches for x in b]


BatcherFactory = Callable[..., DynamicBatcher[Any, Any]]


@pytest.fixture
async def make() -> AsyncIterator[BatcherFactory]:
    created: list[DynamicBatcher[Any, Any]] = []

    def factory(fn: Recorder, **kw: Any) -> DynamicBatcher[Any, Any]:
        b: DynamicBatcher[Any, Any] = DynamicBatcher("test", fn, **kw)
        created.append(b)
        return b

    yield factory
    for b in created:
        await b.stop(drain=False)


async def started(b: DynamicBatcher[Any, Any]) -> DynamicBatcher[Any, Any]:
    await b.start()
    return b


async def test_concurrent_submits_are_grouped_in_one_batch(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=32, max_wait_ms=50))
    results = await asyncio.gather(*(b.submit([i]) for i in range(5)))
    assert results == [[0], [2], [4], [6], [8]]
    assert fn.sizes == [5]


async def test_backlog_forms_full_batches_while_model_is_busy(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=8, max_wait_ms=1))
    fn.hold()
    first = asyncio.create_task(b.submit([-1]))
    await fn.wait_started()
    reqs = [list(range(10 * r, 10 * r + 3)) for r in range(10)]
    tasks = [asyncio.create_task(b.submit(items)) for items in reqs]
    await asyncio.sleep(0.05)
    assert b.queue_depth == 30
    fn.gate.set()
    assert await first == [-2]
    for items, task in zip(reqs, tasks, strict=True):
        assert await task == [2 * x for x in items]
    assert fn.sizes == [1, 8, 8, 8, 6]
    assert fn.seen[1:] == [x for items in reqs for x in items]  # FIFO across requests
    assert b.queue_depth == 0


async def test_without_a_wait_requests_a_loop_turn_behind_join_the_batch(make: BatcherFactory) -> None:
    # max_wait 0: no time is spent waiting, but a request that reaches submit a turn or two of the
    # event loop after the first (as requests read in the same turn do) still rides in its batch.
    fn = Recorder()
    b = await started(make(fn, max_batch=8, max_wait_ms=0))

    async def after_turns(item: int, turns: int) -> list[Any]:
        for _ in range(turns):
            await asyncio.sleep(0)
        return await b.submit([item])

    assert await asyncio.gather(b.submit([0]), after_turns(1, 1), after_turns(2, 2)) == [[0], [2], [4]]
    assert fn.sizes == [3]


async def test_oversized_request_is_split_and_order_kept(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=4, max_wait_ms=0))
    items = list(range(10))
    assert await b.submit(items) == [2 * x for x in items]
    assert fn.sizes == [4, 4, 2]


async def test_model_runs_on_one_worker_thread_never_concurrently(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=2, max_wait_ms=0))
    await asyncio.gather(*(b.submit([i, i + 1]) for i in range(0, 20, 2)))
    assert fn.threads and threading.get_ident() not in fn.threads
    assert len(fn.threads) == 1
    assert fn.max_active == 1


async def test_queue_full_is_immediate_with_retry_after(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=2, max_wait_ms=0, max_queue=5))
    fn.hold()
    running = asyncio.create_task(b.submit([0]))
    await fn.wait_started()
    pending = asyncio.create_task(b.submit([1, 2, 3, 4]))
    await asyncio.sleep(0)
    assert b.queue_depth == 4
    t0 = time.perf_counter()
    with pytest.raises(QueueFull) as err:
        await b.submit([5, 6])
    assert time.perf_counter() - t0 < 0.5  # raised at once, never queued
    assert err.value.retry_after > 0
    with pytest.raises(RequestTooLarge):
        await b.submit(list(range(6)))
    last = asyncio.create_task(b.submit([7]))  # exactly fills the queue
    fn.gate.set()
    assert await running == [0]
    assert await pending == [2, 4, 6, 8]
    assert await last == [14]


async def test_a_queue_longer_than_the_delay_bound_refuses_at_once(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=2, max_wait_ms=0, max_queue=100, max_delay_s=0.5))
    b._batch_s = 0.2  # as if measured: each batch of 2 takes 0.2 s
    b.admit(50)  # an idle queue takes any request that fits
    fn.hold()
    running = asyncio.create_task(b.submit([0]))
    await fn.wait_started()
    queued = asyncio.create_task(b.submit([1, 2, 3, 4]))  # 2 batches ahead: 0.4 s
    await asyncio.sleep(0)
    b.admit(0)
    with pytest.raises(QueueFull, match="would take 0.60s") as err:
        b.admit(1)  # 3 batches: 0.6 s > 0.5 s
    assert err.value.retry_after == pytest.approx(0.2)
    with pytest.raises(QueueFull):
        await b.submit([5])  # submit applies the same bound
    fn.gate.set()
    assert await running == [0] and await queued == [2, 4, 6, 8]


async def test_deadline_drops_queued_items(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=4, max_wait_ms=0))
    fn.hold()
    running = asyncio.create_task(b.submit([0]))
    await fn.wait_started()
    t0 = time.perf_counter()
    with pytest.raises(DeadlineExceeded):
        await b.submit([100, 101], timeout_s=0.1)
    assert time.perf_counter() - t0 < 2
    assert b.queue_depth == 0
    fn.gate.set()
    assert await running == [0]
    assert await b.submit([1]) == [2]
    assert 100 not in fn.seen and 101 not in fn.seen


async def test_default_timeout_applies(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_wait_ms=0, default_timeout_s=0.05))
    fn.hold()
    with pytest.raises(DeadlineExceeded):
        await b.submit([1])
    fn.gate.set()


async def test_exception_fails_only_requests_in_that_batch(make: BatcherFactory) -> None:
    fn = Recorder(fail_on="bad")
    b = await started(make(fn, max_batch=2, max_wait_ms=0))
    fn.hold()
    running = asyncio.create_task(b.submit(["x"]))
    await fn.wait_started()
    a = asyncio.create_task(b.submit(["a", "b"]))
    bad = asyncio.create_task(b.submit(["bad", "c"]))
    c = asyncio.create_task(b.submit(["d", "e"]))
    await asyncio.sleep(0)
    fn.gate.set()
    assert await running == ["xx"]
    assert await a == ["aa", "bb"]
    with pytest.raises(ValueError, match="bad item"):
        await bad
    assert await c == ["dd", "ee"]
    assert await b.submit(["f"]) == ["ff"]  # still running afterwards


async def test_failure_in_one_part_fails_the_whole_request(make: BatcherFactory) -> None:
    fn = Recorder(fail_on="bad")
    b = await started(make(fn, max_batch=2, max_wait_ms=0))
    with pytest.raises(ValueError):
        await b.submit(["a", "b", "bad", "c", "d", "e"])
    assert "d" not in fn.seen  # the rest of a failed request is not computed
    assert b.queue_depth == 0


async def test_wrong_result_count_is_an_error(make: BatcherFactory) -> None:
    b = await started(make(lambda xs: xs[:-1], max_wait_ms=0))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="results"):
        await b.submit([1, 2])


async def test_cancelled_submit_removes_pending_items(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=4, max_wait_ms=0))
    fn.hold()
    running = asyncio.create_task(b.submit([0]))
    await fn.wait_started()
    gone = asyncio.create_task(b.submit([50, 51, 52]))
    await asyncio.sleep(0)
    assert b.queue_depth == 3
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert b.queue_depth == 0
    fn.gate.set()
    await running
    assert await b.submit([1]) == [2]
    assert 50 not in fn.seen


async def test_stop_drain_finishes_queued_work_and_refuses_new(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=2, max_wait_ms=0))
    fn.hold()
    tasks = [asyncio.create_task(b.submit([i, i])) for i in range(4)]
    await fn.wait_started()
    stopping = asyncio.create_task(b.stop(drain=True))
    await asyncio.sleep(0.01)
    with pytest.raises(BatcherClosed):
        await b.submit([9])
    assert not stopping.done()
    fn.gate.set()
    await stopping
    assert [await t for t in tasks] == [[2 * i, 2 * i] for i in range(4)]


async def test_stop_without_drain_fails_queued_work(make: BatcherFactory) -> None:
    fn = Recorder()
    b = await started(make(fn, max_batch=1, max_wait_ms=0))
    fn.hold()
    first = asyncio.create_task(b.submit([1]))
    await fn.wait_started()
    queued = asyncio.create_task(b.submit([2]))
    await asyncio.sleep(0)
    await b.stop(drain=False)
    fn.gate.set()
    for task in (first, queued):
        with pytest.raises(BatcherClosed):
            await task


async def test_submit_before_start_is_an_error(make: BatcherFactory) -> None:
    b = make(Recorder())
    with pytest.raises(RuntimeError, match="not started"):
        await b.submit([1])


async def test_empty_submit_and_timings(make: BatcherFactory) -> None:
    b = await started(make(Recorder(), max_wait_ms=0))
    assert await b.submit([]) == []
    results, timings = await b.submit_timed([1, 2])
    assert results == [2, 4]
    assert timings.batches == 1 and timings.queue_s >= 0 and timings.run_s >= 0


async def test_metrics_are_recorded(make: BatcherFactory) -> None:
    metrics = ServiceMetrics()
    b = await started(make(Recorder(), max_batch=4, max_wait_ms=0, max_queue=4, metrics=metrics))
    await b.submit(list(range(4)))
    with pytest.raises(RequestTooLarge):
        await b.submit(list(range(5)))
    get = metrics.registry.get_sample_value
    # A batcher given the app's metrics directly records under no served-set entry (model "").
    test = {"model": "", "batcher": "test"}
    assert get("clip_batch_size_count", test) == 1
    assert get("clip_batch_size_sum", test) == 4
    assert get("clip_encode_seconds_count", test) == 1
    assert get("clip_batch_wait_seconds_count", test) == 1
    assert get("clip_queue_depth", test) == 0
    assert get("clip_batcher_rejected_total", {**test, "reason": "too_large"}) == 1


async def test_metrics_of_a_model_carry_its_label(make: BatcherFactory) -> None:
    metrics = ServiceMetrics()
    b = await started(make(Recorder(), max_batch=4, max_queue=4, metrics=metrics.for_model("other@v3")))
    await b.submit([1, 2])
    b.record_rejection("over_budget")
    get = metrics.registry.get_sample_value
    assert get("clip_batch_size_sum", {"model": "other@v3", "batcher": "test"}) == 2
    assert get("clip_batcher_rejected_total", {"model": "other@v3", "batcher": "test", "reason": "over_budget"}) == 1
