"""Re-timing ``auto`` in the background: while the server is idle, or paced under steady traffic.

With ``precision=auto`` / ``backend=auto`` a version whose decision was deferred (the timing rounds
could not tell whether any candidate beats the reference, ``clipcore.backends.auto``) serves the
reference. The ``Retimer`` of its served-set entry measures it again once the server is idle: no
request in flight on any entry of the served set (primaries and canaries), none for
``auto_retime_idle_s`` and no version loading; a request for any of them stops the measurement,
and the entries re-time one at a time. Each attempt
loads the version beside the serving one and times its candidates in a worker thread (never on the
model thread: a request is never queued behind timing); the timing asks before every timed call
whether a request arrived, and stops at once when one did (``TimingInterrupted``): that attempt
decides nothing, is not counted, and waits for the next idle spell.

Under steady traffic no idle spell comes, and the reference (the slowest candidate, often by
several times) would serve for good. So an attempt that has waited ``auto_retime_busy_after_s``
without one runs under the traffic instead (``auto_retime_busy_share`` > 0, no version loading):
requests no longer stop it, a version that starts loading does, and its work is paced (``Pacer``):
after each build and each timed call the worker thread pauses long enough that the work, counted on
every thread it may use, is at most ``auto_retime_busy_share`` of one core over the time that passed.
The interleaved rounds spread the traffic's load over every candidate alike.

An attempt that decides swaps the winner in the way a version swap does (the old towers drain, no
request fails), the decision is kept in the decision file as at a load, and re-timing ends. One
that defers again waits
``auto_retime_backoff_s``, doubling, up to ``auto_retime_attempts`` attempts and
``auto_retime_cpu_s`` CPU seconds per version (the process's, every thread; for an attempt under
traffic, whose process CPU time holds the requests' too, the pacing's bound: its work's seconds
times the threads it may use).

A version decided here (``chosen`` or ``remembered``) is not timed again; each attempt only looks
the version's shared decision up in the model store (``clip-train tune``, ``clipcore.backends.shared``)
and, once there is one, swaps to it the same way (under steady traffic too, after the same wait,
the load and parity gate of the shared winner paced alike). A ``shared`` decision is final. Only the primary
is re-timed; canaries and shadows serve as they loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from clipcore.backends.auto import Interrupted, Pace, TimingInterrupted
from model_store import ModelStore
from service.config import Settings
from service.runtime.loader import VersionLoader
from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime

__all__ = ["Pacer", "RetimeState", "Retimer", "attempt_copy"]

log = logging.getLogger("service.retime")

POLL_S = 0.5  # how often an idle spell is looked for (at most)
# What one attempt came to: a winner swapped in (chosen, remembered, shared), nothing decided
# (deferred, no shared decision: counted), a request arrived (interrupted: not counted), or an
# error (failed: counted).
Result = Literal["chosen", "remembered", "shared", "deferred", "unshared", "interrupted", "failed", "superseded"]
State = Literal["waiting", "timing", "decided", "exhausted", "budget spent"]
# (the serving runtime, whether to stop, the pacing under traffic or None while idle) -> the result of one attempt.
Attempt = Callable[[ModelRuntime, Interrupted, Pace | None], Awaitable[Result]]


@dataclass
class RetimeState:
    """Where re-timing stands for one served version (GET /models shows it in ``auto.retime``)."""

    version: str
    mode: Literal["time", "shared"]  # deferred: time the candidates again; decided here: look for a shared one
    state: State = "waiting"
    attempts: int = 0  # attempts that ran to the end (interrupted ones are not counted)
    max_attempts: int = 0
    interrupted: int = 0  # attempts stopped because a request arrived
    paced: int = 0  # attempts that ran under traffic, paced (no idle spell within auto_retime_busy_after_s)
    cpu_s: float = 0.0  # CPU seconds spent, interrupted attempts included
    last: Result | None = None
    at: float | None = None  # when the last attempt ended (Unix time)


class Pacer:
    """Keeps work in a worker thread to ``share`` of one core (``clipcore.backends.auto.Pace``):
    after work that took ``seconds`` (wall clock) on up to ``threads`` threads, so at most
    ``threads * seconds`` CPU seconds, it pauses ``seconds * (threads / share - 1)``, so that the
    work's CPU time is at most ``share`` of the time that passed. ``wait`` pauses (the attempt's
    ``threading.Event.wait``: it returns early once re-timing stops)."""

    def __init__(self, share: float, threads: int, wait: Callable[[float], object]) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"a share of one core is in (0, 1], not {share}")
        self.share, self.threads, self.wait = share, max(1, threads), wait
        self.busy_s = 0.0  # wall seconds of the work paced so far
        self.paused_s = 0.0  # seconds of pause asked for

    @property
    def cpu_s(self) -> float:
        """The most CPU seconds the work paced so far can have used (its seconds on every thread)."""
        return self.busy_s * self.threads

    def __call__(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        pause = seconds * (self.threads / self.share - 1)
        self.busy_s += seconds
        self.paused_s += pause
        if pause > 0:
            self.wait(pause)


def work_threads(settings: Settings) -> int:
    """How many threads a measurement's calls may use: ``torch_threads``, or (0, the libraries'
    default) every core this process may run on."""
    if settings.torch_threads > 0:
        return settings.torch_threads
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


class Retimer:
    """Re-times one served-set entry's primary while the server is idle (module doc). ``idle_since``:
    when the last request on the served set ended (monotonic), None while one is in flight (or a
    version loads); ``loading``: whether a version of the served set loads (an attempt under traffic
    waits for it, and stops when one starts); ``attempt``: one attempt on a serving runtime
    (``ModelManager.retime_attempt``)."""

    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        model: str,
        *,
        idle_since: Callable[[], float | None],
        attempt: Attempt,
        loading: Callable[[], bool] = lambda: False,
        turn: asyncio.Lock | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.model = model
        self.idle_since = idle_since
        self.loading = loading
        self.attempt = attempt
        self.state: RetimeState | None = None
        self._runtime: ModelRuntime | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()  # set when a request arrives: a measurement stops at its next call
        self._halt = threading.Event()  # set when re-timing stops: a measurement under traffic stops too
        # Held during an attempt; the entries of a served set share one lock, so they take turns.
        self.turn = turn if turn is not None else asyncio.Lock()

    def request_arrived(self) -> None:
        """A request started on the entry: a measurement in progress stops at its next timed call."""
        self._stop.set()

    def _interrupted(self, stop: threading.Event) -> Interrupted:
        """Whether a measurement must stop now (asked from the measuring thread): its own ``stop``
        was set (a request arrived, re-timing stopped) or a request is in flight."""
        return lambda: stop.is_set() or self.idle_since() is None

    def _halted(self, halt: threading.Event) -> Interrupted:
        """Whether a measurement under traffic must stop now: re-timing stopped, or a version loads
        (its own timing would share the cores). Requests do not stop it."""
        return lambda: halt.is_set() or self.loading()

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
        self._halt.set()  # under traffic too, and its pause ends
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
                busy = await self._wait_idle()
                if self._runtime is not runtime:
                    return
                state.state = "timing"
                # Its own events: a thread left from a cancelled attempt still stops.
                stop, halt = self._stop, self._halt = threading.Event(), threading.Event()
                pacer: Pacer | None = None
                if busy:
                    pacer = Pacer(self.settings.auto_retime_busy_share, work_threads(self.settings), halt.wait)
                    state.paced += 1
                    log.info("auto re-timing of %s: no idle spell for %gs; timing under the traffic, paced to "
                             "%g of a core", runtime.ref, self.settings.auto_retime_busy_after_s,
                             self.settings.auto_retime_busy_share)  # fmt: skip
                started = time.process_time()
                try:
                    if pacer is None:
                        result = await self.attempt(runtime, self._interrupted(stop), None)
                    else:
                        result = await self.attempt(runtime, self._halted(halt), pacer)
                except TimingInterrupted:
                    result = "interrupted"
                except asyncio.CancelledError:
                    stop.set()
                    halt.set()
                    raise
                except Exception:
                    log.exception("auto re-timing of %s failed", runtime.ref)
                    result = "failed"
                finally:
                    # Under traffic the process's CPU time holds the requests': the pacing's bound counts.
                    state.cpu_s += pacer.cpu_s if pacer is not None else time.process_time() - started
            state.last, state.at = result, time.time()
            self.metrics.auto_retime(result, model=self.model)
            if result == "interrupted":
                state.interrupted += 1
                log.info("auto re-timing of %s stopped: %s; not counted, it starts over", runtime.ref,
                         "a version loads" if pacer is not None else "a request arrived")  # fmt: skip
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

    async def _wait_idle(self) -> bool:
        """Until the served set has had no request in flight (and no load) for ``auto_retime_idle_s``:
        False. With ``auto_retime_busy_share`` above 0, True once ``auto_retime_busy_after_s`` went
        by without such a spell and no version loads: the attempt runs under the traffic, paced."""
        quiet = self.settings.auto_retime_idle_s
        share = self.settings.auto_retime_busy_share
        deadline = time.monotonic() + self.settings.auto_retime_busy_after_s if share > 0 else math.inf
        while True:
            now = time.monotonic()
            since = self.idle_since()
            left = quiet - (now - since) if since is not None else quiet
            if since is not None and left <= 0:
                return False
            if now >= deadline and not self.loading():
                return True
            naps = [left, POLL_S] if now >= deadline else [left, POLL_S, deadline - now]
            await asyncio.sleep(min(naps))


async def attempt_copy(
    loader: VersionLoader,
    store: ModelStore,
    serving: ModelRuntime,
    interrupted: Interrupted,
    pace: Pace | None,
    *,
    serving_now: Callable[[], ModelRuntime | None],
    install: Callable[[ModelRuntime], None],
) -> Result:
    """One re-timing of the serving primary: the version loaded again beside it by the entry's
    version loader, its ``auto`` decided again (deferred: timed, asking ``interrupted`` before every
    timed call; decided here: only a shared decision replaces it); a winner is swapped in like a new
    version (``install``) and the serving towers drain. ``pace`` (under traffic): called after the
    load and each build and timed call (``Pacer``). ``serving_now``: the entry's primary now."""
    decision = serving.auto
    assert decision is not None
    if decision.outcome != "deferred" and not await asyncio.to_thread(_shared_exists, loader, store, serving):
        return "unshared"
    loader.retiming += 1
    try:
        prepared = await loader.prepare(serving.ref, interrupted, pace)
    finally:
        loader.retiming -= 1
    found = prepared.towers.auto
    if found is not None and found.outcome == "deferred":
        loader.metrics.backend_auto(found.outcome, found.margin, found.spread)
        return "deferred"
    if found is None or (decision.outcome != "deferred" and found.outcome != "shared"):
        return "unshared"  # the shared decision could not be used here: the local one stays
    if serving_now() is not serving:
        return "superseded"
    runtime = await loader.start(prepared)
    if serving_now() is not serving:  # replaced while this one started: it never served
        await runtime.stop()
        return "superseded"
    log.info("auto re-timing of %s: %s %s (%s) replaces %s %s", serving.ref, found.backend, found.precision,
             found.outcome, decision.backend, decision.precision)  # fmt: skip
    install(runtime)
    return found.outcome


def _shared_exists(loader: VersionLoader, store: ModelStore, serving: ModelRuntime) -> bool:
    """Whether the store holds a decision ``clip-train tune`` shared for this CPU kind and these settings."""
    from clipcore.backends.shared import shared_key

    settings = loader.settings
    key, _ = shared_key(loader.device, settings.torch_threads or None, settings.precision,
                        settings.batching.max_batch_images)  # fmt: skip
    try:
        return store.artifacts(serving.bundle.name, serving.version, key) is not None
    except Exception:  # unreadable now: looked up again at the next attempt
        log.warning("auto re-timing of %s: the store's shared decisions cannot be read", serving.ref, exc_info=True)
        return False
