"""Versions no role holds any more: drained (their requests finish), then stopped and freed.

A swapped-out primary, an ended canary or shadow and an unloaded entry's versions all end here.
A request keeps the runtime it acquired to its end, so a version is only stopped once it is idle
(or after ``drain_timeout_s``); then its reference cycles are collected and the pages of freed
memory handed back to the system (``release_freed_memory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from clipcore.backends.residency import trim_heap
from service.runtime.heap import settle
from service.runtime.model_runtime import ModelRuntime

__all__ = ["Drain", "release_freed_memory"]

log = logging.getLogger("service.lifecycle")


def release_freed_memory() -> None:
    """Collect an unloaded version's reference cycles (``heap.settle``: frozen objects are only
    collected after a thaw), then give the pages of freed memory back to the system. glibc's
    allocator keeps what an unloaded model freed for its own reuse: without this the process's RSS
    stays as high as if the model were still loaded (no effect, and no error, with another C library)."""
    settle(full=True)
    trim_heap()


class Drain:
    """The versions of one entry being drained. ``forget(version)``: called once a stopped version
    is not loaded again meanwhile (its metric series and shadow totals go)."""

    def __init__(self, drain_timeout_s: float, forget: Callable[[str], None]) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._forget = forget
        self.retiring: dict[asyncio.Task[None], ModelRuntime] = {}

    def add(self, runtime: ModelRuntime) -> None:
        task = asyncio.get_running_loop().create_task(self._retire(runtime))
        self.retiring[task] = runtime
        task.add_done_callback(self._retired)

    def active(self) -> bool:
        return any(runtime.active for runtime in self.retiring.values())

    async def close(self) -> None:
        """Stop every version still draining now (at shutdown: uvicorn has let the requests finish,
        and a runtime left running keeps its model thread, which the interpreter waits for at exit)."""
        retiring = list(self.retiring.items())
        for task, _ in retiring:
            task.cancel()
        await asyncio.gather(*(task for task, _ in retiring), return_exceptions=True)
        for _, runtime in retiring:
            try:
                await runtime.stop()
            except Exception:
                log.exception("stopping %s failed", runtime.ref)

    def _retired(self, task: asyncio.Task[None]) -> None:
        self.retiring.pop(task, None)
        # Once the task's frame and this table no longer hold the version: its cycles are collected
        # and its pages handed back (``heap.settle``), in a worker thread as an unload does.
        with contextlib.suppress(RuntimeError):  # the loop's executor is gone at shutdown
            asyncio.get_running_loop().run_in_executor(None, release_freed_memory)

    async def _retire(self, runtime: ModelRuntime) -> None:
        try:
            await asyncio.wait_for(runtime.idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            log.warning("%s still has %d requests after %.0fs; stopping it anyway", runtime.ref, runtime.active,
                        self.drain_timeout_s)  # fmt: skip
        await runtime.stop()
        log.info("retired %s", runtime.ref)
        self._forget(runtime.version)
