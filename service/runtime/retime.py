"""Re-timing ``auto`` in the background while a served version is idle.

With ``precision=auto`` / ``backend=auto`` a version whose decision was deferred (the timing rounds
could not tell the candidates apart from their noise, ``clipcore.backends.auto``) serves the
reference. The ``Retimer`` of its served-set entry measures it again once the server is idle: no
request in flight on any entry of the served set (primaries and canaries), none for
``auto_retime_idle_s`` and no version loading; a request for any of them stops the measurement,
and the entries re-time one at a time. Each attempt
loads the version beside the serving one and times its candidates in a worker thread (never on the
model thread: a request is never queued behind timing); the timing asks before every timed call
whether a request arrived, and stops at once when one did (``TimingInterrupted``): that attempt
decides nothing, is not counted, and waits for the next idle spell. An attempt that decides swaps
the winner in the way a version swap does (the old towers drain, no request fails), the decision
is kept in the decision file as at a load, and re-timing ends. One that defers again waits
``auto_retime_backoff_s``, doubling, up to ``auto_retime_attempts`` attempts and
``auto_retime_cpu_s`` CPU seconds (the process's, every thread) per version.

A version decided here (``chosen`` or ``remembered``) is not timed again; each attempt only looks
the version's shared decision up in the model store (``clip-train tune``, ``clipcore.backends.shared``)
and, once there is one, swaps to it the same way. A ``shared`` decision is final. Only the primary
is re-timed; canaries and shadows serve as they loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from clipcore.backends.auto import Interrupted, TimingInterrupted
from service.config import Settings
from service.runtime.assembly import ModelRuntime
from service.runtime.metrics import ServiceMetrics

__all__ = ["RetimeState", "Retimer"]

log = logging.getLogger("service.retime")

POLL_S = 0.5  # how often an idle spell is looked for (at most)
# What one attempt came to: a winner swapped in (chosen, remembered, shared), nothing decided
# (deferred, no shared decision: counted), a request arrived (interrupted: not counted), or an
# error (failed: counted).
Result = Literal["chosen", "remembered", "shared", "deferred", "unshared", "interrupted", "failed", "superseded"]
State = Literal["waiting", "timing", "decided", "exhausted", "budget spent"]
# (the serving runtime, whether to stop) -> the result of one attempt.
Attempt = Callable[[ModelRuntime, Interrupted], Awaitable[Result]]


@dataclass
class RetimeState:
    """Where re-timing stands for one served version (GET /models shows it in ``auto.retime``)."""

    version: str
    mode: Literal["time", "shared"]  # deferred: time the candidates again; decided here: look for a shared one
    state: State = "waiting"
    attempts: int = 0  # attempts that ran to the end (interrupted ones are not counted)
    max_attempts: int = 0
    interrupted: int = 0  # attempts stopped because a request arrived
    cpu_s: float = 0.0  # CPU seconds spent, interrupted attempts included
    last: Result | None = None
    at: float | None = None  # when the last attempt ended (Unix time)


class Retimer:
    """Re-times one served-set entry's primary while the server is idle (module doc). ``idle_since``:
    when the last request on the served set ended (monotonic), None while one is in flight;
    ``attempt``: one attempt on a serving runtime (``ModelManager._retime_attempt``)."""

    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        model: str,
        *,
        idle_since: Callable[[], float | None],
        attempt: Attempt,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.model = model
        self.idle_since = idle_since
        self.attempt = attempt
        self.state: RetimeState | None = None
        self._runtime: ModelRuntime | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()  # set when a request arrives: a measurement stops at its next call
        # Held during an attempt; the served set gives its entries one lock, so they take turns.
        self.turn = asyncio.Lock()

    def request_arrived(self) -> None:
        """A request started on the entry: a measurement in progress stops at its next timed call."""
        self._stop.set()

    def _interrupted(self, stop: threading.Event) -> Interrupted:
        """Whether a measurement must stop now (asked from the measuring thread): its own ``stop``
        was set (a request arrived, re-timing stopped) or a request is in flight."""
        return lambda: stop.is_set() or self.idle_since() is None

    def follow(self, runtime: ModelRuntime | None, retimed: bool = False) -> None:
        """``runtime`` serves now: re-time it if its decision calls for it (a deferred one, or one
        decided here while a shared one may appear). ``retimed``: it is the winner of a re-timing,
        which ends there."""
        if runtime is self._runtime:
            return
        self._runtime = runtime
        if retimed:
            return  # the task that swapped it in ends with the swap
        self._cancel()
        self.state = None
        decision = runtime.auto if runtime is not None else None
        limit = self.settings.auto_retime_attempts
        if runtime is None or decision is None or decision.outcome == "shared" or limit <= 0:
            return
        mode: Literal["time", "shared"] = "time" if decision.outcome == "deferred" else "shared"
        self.state = RetimeState(runtime.bundle.version, mode, max_attempts=limit)
        self._task = asyncio.get_running_loop().create_task(
            self._run(runtime, self.state), name=f"auto re-timing {runtime.ref}"
        )

    def stop(self) -> asyncio.Task[None] | None:
        """Stop re-timing now (the entry lets go of its versions); the task to await, if any."""
        self._runtime, self.state = None, None
        return self._cancel()

    async def close(self) -> None:
        task = self.stop()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _cancel(self) -> asyncio.Task[None] | None:
        task, self._task = self._task, None
        self._stop.set()  # a measurement running in a thread stops at its next timed call
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            return task
        return None

    async def _run(self, runtime: ModelRuntime, state: RetimeState) -> None:
        delay = self.settings.auto_retime_backoff_s
        while state.attempts < state.max_attempts:
            if state.cpu_s >= self.settings.auto_retime_cpu_s:
                state.state = "budget spent"
                log.info("auto re-timing of %s stops: %.1f CPU seconds spent (auto_retime_cpu_s=%g)",
                         runtime.ref, state.cpu_s, self.settings.auto_retime_cpu_s)  # fmt: skip
                return
            state.state = "waiting"
            await asyncio.sleep(delay)
            async with self.turn:
                await self._wait_idle()
                if self._runtime is not runtime:
                    return
                state.state = "timing"
                stop = self._stop = threading.Event()  # its own: a thread left from a cancelled attempt still stops
                started = time.process_time()
                try:
                    result = await self.attempt(runtime, self._interrupted(stop))
                except TimingInterrupted:
                    result = "interrupted"
                except asyncio.CancelledError:
                    stop.set()
                    raise
                except Exception:
                    log.exception("auto re-timing of %s failed", runtime.ref)
                    result = "failed"
                finally:
                    state.cpu_s += time.process_time() - started
            state.last, state.at = result, time.time()
            self.metrics.auto_retime(result, model=self.model)
            if result == "interrupted":
                state.interrupted += 1
                log.info("auto re-timing of %s stopped: a request arrived; again at the next idle spell", runtime.ref)
                delay = 0.0  # the idle wait is the pause
                continue
            state.attempts += 1
            if result in ("chosen", "remembered", "shared"):
                state.state = "decided"
                return
            if result == "superseded":
                return
            log.info("auto re-timing of %s: %s (attempt %d of %d)", runtime.ref, result, state.attempts,
                     state.max_attempts)  # fmt: skip
            delay = self.settings.auto_retime_backoff_s * 2**state.attempts
        state.state = "exhausted"

    async def _wait_idle(self) -> None:
        """Until the served set has had no request in flight (and no load) for ``auto_retime_idle_s``."""
        quiet = self.settings.auto_retime_idle_s
        while True:
            since = self.idle_since()
            if since is not None:
                left = quiet - (time.monotonic() - since)
                if left <= 0:
                    return
                await asyncio.sleep(min(left, POLL_S))
            else:
                await asyncio.sleep(min(quiet, POLL_S))
