"""Which model version serves, and how it is replaced without failing a request.

The ``ModelManager`` loads the configured ref at start (retrying until it succeeds, while
/readyz says 503) and, for ``name@alias`` refs, polls the alias. A new target is loaded beside
the serving one in a thread (checksums verified by the store), warmed up, and swapped in. A
version that fails verification, warm-up or its backend's parity gate is refused, logged and
counted, and the old one keeps serving; it is not retried until the alias moves again (versions
are immutable). A load that failed for a reason that may pass (an unreadable file, a version not
there yet, no memory) is retried with backoff instead. Requests ``acquire`` the current runtime
and keep that reference to the end: a swap never changes the model under a running request, and
the old runtime is only stopped once the requests holding it are done (or after
``drain_timeout_s``). The watcher survives any error: it logs it (once a minute at most when it
repeats), waits longer after each failure in a row, and polls on.

One ``ModelManager`` serves one entry of the served set (``service.runtime.served``): the set
starts, stops and, under a memory budget, unloads entries; everything above holds per entry.
An entry the set loads on request (``loads_on_request``: under a memory budget, every entry but
the first) tries its first load once per launch: a load that fails *quarantines* the entry
(``Quarantine``) with the same refuse-or-retry policy as a hot swap (``may_pass``): a version that
may pass is tried again by the next request after ``backoff_s`` (the watch interval, doubling with
each failure in a row), a refused one not until its alias names another version (read again at
most once per watch interval). Meanwhile its requests get 503 at once and nothing is loaded.

The alias entry may also name a canary (a weighted share of the callers) and a shadow (re-runs
a sample of the requests after they were answered). Each is loaded beside the primary with its own
runtime and batchers, checked like a swapped-in version; one that cannot load is refused (or
retried) and logged, and the primary answers everything meanwhile. ``acquire(key)`` routes a
request to the canary by its caller key (``model_store.routing.route``), or to the version the
request named (``acquire(key, version)``: the primary's or the canary's), and the shadow runs go
through a bounded queue (``service.runtime.shadow``). Weight changes take effect at the next poll;
a promoted canary becomes the primary as it is (nothing reloads), and a version no role holds any
more drains like a swapped-out one. Each entry of the served set has its own canary, shadow and
shadow runner; unloading an entry stops all three with its primary.

With ``precision=auto`` / ``backend=auto``, a primary whose decision was deferred is measured again
while the server is idle, and swapped for the winner like a new version (``service.runtime.retime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from clipcore.backends.auto import Interrupted, Pace
from clipcore.backends.base import BackendError, ServingTowers
from clipcore.backends.residency import trim_heap
from clipcore.errors import ClipError, ErrorCode
from clipcore.models.bundle import ModelBundle
from model_store import ChecksumMismatch, InvalidManifest, ModelNotFound, ModelStore, parse_ref
from model_store.aliases import AliasEntry
from model_store.location import missing_directory
from model_store.routing import route, shadow_target
from service.config import Settings
from service.runtime.assembly import (
    CANARY,
    PRIMARY,
    SHADOW,
    ModelRuntime,
    build_runtime,
    resolve_device,
    serving_towers,
    warm_up,
)
from service.runtime.canary import SideLoad
from service.runtime.heap import settle
from service.runtime.metrics import ServiceMetrics
from service.runtime.retime import Result, Retimer
from service.runtime.shadow import ShadowRunner

__all__ = ["ModelManager", "ModelRuntime", "ModelState", "Quarantine"]

log = logging.getLogger("service.lifecycle")

STORE_SETTING = "CLIP_STORE / --store"
# Load failures that may pass: the version is tried again later rather than refused.
TRANSIENT_LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, MemoryError, ModelNotFound)
MAX_BACKOFF_S = 300.0
LOG_REPEAT_S = 60.0  # the same error again is logged once a minute at most
ModelState = Literal["ready", "loading", "failed", "unloaded", "quarantined"]


def may_pass(exc: BaseException) -> bool:
    """Whether a version that failed to load may load later as it is: its files could not be read
    (a flaky mount), were not there yet, or memory ran out. Wrong checksums, an invalid manifest, a
    failed warm-up or parity gate stay true of an immutable version: it is refused instead."""
    if isinstance(exc, ChecksumMismatch):
        return all(why == "missing" or why.startswith("unreadable") for why in exc.problems.values())
    return isinstance(exc, TRANSIENT_LOAD_ERRORS)


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of ``clip_model_load_failures_total``: a few words, never a message."""
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, ModelNotFound):
        return "not_found"
    if isinstance(exc, ChecksumMismatch):
        return "unreadable" if may_pass(exc) else "checksum"
    if isinstance(exc, InvalidManifest):
        return "manifest"
    if isinstance(exc, BackendError):
        return "gate"
    if isinstance(exc, OSError):
        return "unreadable"
    return "other"  # a failed warm-up among others: the log says which


@dataclass(frozen=True)
class Quarantine:
    """Why an entry loaded on request serves nothing, and until when no request tries again.

    From a failed load until a load succeeds (or, refused, its alias names another version)."""

    version: str | None  # the version whose load failed; None when the ref could not be resolved
    reason: str  # for callers: no paths (the log has the error)
    refused: bool  # may not pass as it is: not loaded again until the alias names another version
    failures: int  # failed loads of this version in a row
    until: float  # monotonic: no load (refused: no read of the alias) before it

    def left_s(self, now: float | None = None) -> float:
        return max(0.0, self.until - (time.monotonic() if now is None else now))

    def until_epoch(self) -> float:
        """``until`` as Unix time, for /models."""
        return time.time() + (self.until - time.monotonic())

    def describe(self, ref: str) -> str:
        """The 503 message for a request naming the entry ``ref``."""
        if self.refused:
            return (
                f"model {ref} is quarantined ({self.reason}): version {self.version} is refused until its alias "
                "names another version; the server log says why"
            )
        left = max(1, math.ceil(self.left_s()))
        times = f", {self.failures} failed loads in a row" if self.failures > 1 else ""
        return (
            f"model {ref} is quarantined ({self.reason}{times}): not tried again for {left}s; the server log says why"
        )


def release_freed_memory() -> None:
    """Collect an unloaded version's reference cycles (``heap.settle``: frozen objects are only
    collected after a thaw), then give the pages of freed memory back to the system. glibc's
    allocator keeps what an unloaded model freed for its own reuse: without this the process's RSS
    stays as high as if the model were still loaded (no effect, and no error, with another C library)."""
    settle(full=True)
    trim_heap()


def backoff_s(interval_s: float, failures: int) -> float:
    """Wait before the next try after ``failures`` failures in a row: the interval, doubling."""
    return min(interval_s * 2 ** max(failures - 1, 0), max(interval_s, MAX_BACKOFF_S))


class ModelManager:
    """One served model: ``ref`` (default: the ``model`` setting, which must then be one ref)
    loaded, watched and hot-swapped. ``on_change`` is called whenever what it serves, or whether
    it has requests in flight, changes (the served set waits on it to load models on demand)."""

    def __init__(
        self,
        settings: Settings,
        store: ModelStore,
        metrics: ServiceMetrics,
        ref: str | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.ref = settings.model if ref is None else ref
        self.name, self.selector = parse_ref(self.ref)
        self.on_change = on_change
        self.last_used = 0.0  # monotonic time of the last request, for unloading the least recently used
        self.load_started: float | None = None  # monotonic start of the load in progress
        self.last_load_s: float | None = None  # how long the last load took
        self._loading = 0  # loads in progress (first load or a hot swap's)
        self._retiming = 0  # re-timing attempts holding a second copy of the version
        self.waiting = 0  # requests waiting for it to load (under a memory budget)
        # Set by the served set for the entries it loads on request: a failed first load ends the
        # launch and quarantines the entry, instead of being retried in the background.
        self.loads_on_request = False
        self.quarantine: Quarantine | None = None
        self._recheck = asyncio.Lock()  # one read of a refused entry's alias at a time
        self.device = resolve_device(settings.device)
        self.current: ModelRuntime | None = None
        self.alias: str | None = None  # set once we know the selector names an alias
        self.last_error: str | None = None
        # Why nothing serves yet, in words safe for unauthenticated callers (no paths): the 503s say it.
        self.not_ready_reason: str | None = None
        # Why the alias could not be read on the last poll (None: it could). The serving version
        # keeps serving meanwhile; /readyz and the clip_store_watch_ok gauge report it.
        self.watch_error: str | None = None
        self._watch_logged = 0.0
        self._refused: str | None = None
        # A target whose load failed for a reason that may pass: tried again at _retry_at.
        self._retry: tuple[str, int] | None = None  # (version, failures in a row)
        self._retry_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._retiring: dict[asyncio.Task[None], ModelRuntime] = {}
        # The alias entry of the last poll (None until then, or for a pinned ref): what requests are
        # routed by. The canary and shadow runtimes loaded beside the primary, by role.
        self.entry: AliasEntry | None = None
        self.sides: dict[str, ModelRuntime | None] = {CANARY: None, SHADOW: None}
        self._side_loads = {CANARY: SideLoad(), SHADOW: SideLoad()}
        self._split_exported: set[str] = set()  # versions exporting clip_canary_weight_ratio/clip_shadow_sample_ratio
        self.shadows = ShadowRunner(
            self.ref,
            metrics,
            lease=self._shadow_lease,
            busy=self.answering_busy,
            idle_since=self.answering_idle_since,
            quiet_s=settings.shadow_quiet_ms / 1000,
        )
        # The served set's entries (``ServedModels`` sets it): re-timing waits until none has a request.
        self.peers: list[ModelManager] = [self]
        self.retimer = Retimer(
            settings,
            metrics,
            self.ref,
            idle_since=self.server_idle_since,
            attempt=self._retime_attempt,
            loading=self.server_loading,
        )
        metrics.set_store_watch(ok=True, model=self.ref)

    async def start(self) -> None:
        self.launch()

    def launch(self) -> None:
        """Start loading (and then watching) unless already started; returns at once."""
        if not self.started:
            self.shadows.launch()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"model-manager {self.ref}")

    @property
    def started(self) -> bool:
        """Whether this entry holds (or is loading) a version: what a memory budget counts."""
        return self.current is not None or (self._task is not None and not self._task.done())

    @property
    def state(self) -> ModelState:
        """``ready`` (serving), ``loading``, ``failed`` (no version loaded; retrying, the log says
        why), ``quarantined`` (loaded on request, and its last load failed: ``quarantine`` says
        until when no request tries again) or ``unloaded`` (not loaded: past the memory budget,
        until a request names it)."""
        if self.current is not None:
            return "ready"
        if self._task is None or self._task.done():
            return "quarantined" if self.quarantine is not None else "unloaded"
        return "failed" if self.last_error is not None else "loading"

    @property
    def evictable(self) -> bool:
        """No request in flight on any of its versions (canary and shadow runs included), none
        waiting for it to load and no load in progress: unloading it now fails nothing and undoes
        no load a request waits for (two models waiting for one slot would unload each other's as
        soon as it started, or before their requests got to it)."""
        if self._loading or self._retiming or self.waiting:
            return False
        runtimes = [*self._retiring.values(), *self._loaded()]
        return all(runtime.active == 0 for runtime in runtimes)

    def _loaded(self) -> list[ModelRuntime]:
        """The loaded runtimes of every role, each once (a shadow may be the canary's version)."""
        held = {id(r): r for r in (self.current, *self.sides.values()) if r is not None}
        return list(held.values())

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def unload(self) -> Coroutine[Any, Any, None]:
        """Stop watching and stop the serving version with its canary and shadow (and the shadow
        runner), to make room under a memory budget; the next ``launch`` loads the ref again (the
        alias may have moved meanwhile). The caller checks ``evictable`` first. The entry lets go
        of its versions now, before this returns, so no request can acquire them after the check;
        await the returned coroutine to stop them (their batchers and model threads)."""
        task, self._task = self._task, None
        runtimes = self._loaded()
        self.current = None
        self.sides = {CANARY: None, SHADOW: None}
        self.entry = None
        self._side_loads = {CANARY: SideLoad(), SHADOW: SideLoad()}
        shadows = self.shadows.stop()  # queued shadow runs are dropped: their versions go
        retiming = self.retimer.stop()
        self.last_error = self.watch_error = None
        self._refused, self._retry = None, None
        self.not_ready_reason = "unloaded to make room for other models; the next request loads it"
        self.metrics.clear_model(self.ref)
        self.metrics.set_store_watch(ok=True, model=self.ref)
        for version in self._split_exported:
            self.metrics.clear_split(self.ref, version)
        self._split_exported.clear()
        for runtime in runtimes:
            self.metrics.forget_version(self.ref, runtime.bundle.version)
            self.shadows.forget(runtime.bundle.version)
        if runtimes:
            self.metrics.model_unloaded(self.ref)
        self._changed()
        return self._stop_unloaded(task, shadows, runtimes, retiming)

    async def _stop_unloaded(
        self,
        task: asyncio.Task[None] | None,
        shadows: asyncio.Task[None] | None,
        runtimes: list[ModelRuntime],
        retiming: asyncio.Task[None] | None,
    ) -> None:
        stopping = [t for t in (task, shadows, retiming) if t is not None]
        for t in stopping:
            t.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        refs = [runtime.ref for runtime in runtimes]
        while runtimes:
            runtime = runtimes.pop()
            try:
                await runtime.stop()
            except Exception:
                log.exception("stopping %s failed", runtime.ref)
            del runtime  # the last reference: the version's weights are freed here
        await asyncio.to_thread(release_freed_memory)
        if refs:
            log.info("unloaded %s (%s) to make room for other models", ", ".join(refs), self.ref)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # a watcher that died must not stop the rest of the shutdown
                log.exception("the model watcher had failed")
        await self.retimer.close()
        await self.shadows.close()
        # Versions still draining are stopped now: uvicorn has already let the requests finish,
        # and a runtime left running keeps its model thread (the interpreter waits for it at exit).
        retiring = list(self._retiring.items())
        for task, _ in retiring:
            task.cancel()
        await asyncio.gather(*(task for task, _ in retiring), return_exceptions=True)
        current, self.current = self.current, None
        # Each once: one runtime may hold two roles (a shadow of the canary's version).
        held = {id(r): r for r in (current, *self.sides.values()) if r is not None}
        self.sides = {CANARY: None, SHADOW: None}
        for runtime in [*(r for _, r in retiring), *held.values()]:
            try:
                await runtime.stop()
            except Exception:
                log.exception("stopping %s failed", runtime.ref)

    def serves(self, version: str, role: str = PRIMARY) -> bool:
        """Whether ``version`` is loaded here as the primary (``role`` primary) or the canary."""
        runtime = self.current if role == PRIMARY else self.sides[CANARY] if self.current is not None else None
        return runtime is not None and runtime.bundle.version == version

    def answers(self, key: str | bytes | None) -> str | None:
        """The ``name@version`` that answers the caller ``key`` now; None while nothing is loaded,
        or while a canary splits the callers and ``key`` is None (each request is drawn at random)."""
        current, canary = self.current, self.sides[CANARY]
        if current is None or canary is None or self.entry is None or self.entry.canary is None:
            return current.ref if current is not None else None
        if key is None:
            return None
        return canary.ref if route(self.entry, key) == canary.bundle.version else current.ref

    @contextlib.asynccontextmanager
    async def acquire(self, key: str | bytes | None = None, version: str | None = None) -> AsyncIterator[ModelRuntime]:
        """The runtime that answers a request from the caller ``key`` (``service.runtime.canary``):
        the canary for the callers the alias routes to it, else the primary; or, when the request
        named a ``version``, that version if it is still the primary or the canary (unknown_model
        once it is neither: a request never gets another version than the one it named). Held for
        the whole request (no await between read and count)."""
        runtime = self.current
        if runtime is None:
            raise ClipError(ErrorCode.not_ready, self.not_ready_message(), retry_after=1)
        canary = self.sides[CANARY]
        if version is not None:
            if runtime.bundle.version != version:
                if canary is None or canary.bundle.version != version:
                    raise ClipError(
                        ErrorCode.unknown_model,
                        f"model {self.name}@{version} is not served here any more; {self.ref} serves {runtime.ref}",
                        "model",
                    )
                runtime = canary
        elif canary is not None and self.entry is not None and route(self.entry, key) == canary.bundle.version:
            runtime = canary
        idle_since = self.answering_idle_since()
        self.last_used = time.monotonic()
        if idle_since is not None and idle_since > 0:  # teaches shadow runs the traffic's gaps
            self.shadows.note_gap(self.last_used - idle_since)
        for peer in self.peers:  # a measurement in the idle time, of any entry, stops at its next timed call
            peer.retimer.request_arrived()
        try:
            with runtime.held():
                yield runtime
        finally:
            self.last_used = time.monotonic()
            if runtime.active == 0:
                self._changed()  # an idle model may now be unloaded for one a request waits for

    def shadow_sample(self) -> str | None:
        """The shadow version to re-run a request on after answering it (sampled at the shadow's
        fraction), or None; only a loaded shadow is sampled for."""
        shadow = self.sides[SHADOW]
        if shadow is None or self.entry is None:
            return None
        version = shadow_target(self.entry)
        return version if version == shadow.bundle.version else None

    def _shadow_lease(self, version: str) -> ModelRuntime | None:
        shadow = self.sides[SHADOW]
        return shadow if shadow is not None and shadow.bundle.version == version else None

    def answering_idle_since(self) -> float | None:
        """When the last request on the versions that answer callers (primary, canary) ended
        (monotonic), None while one is in flight: shadow runs wait for a gap in the traffic."""
        if any(rt is not None and rt.active > 0 for rt in (self.current, self.sides[CANARY])):
            return None
        return self.last_used

    def server_idle_since(self) -> float | None:
        """When the last request on any entry of the served set ended (monotonic), None while one is
        in flight, waits for a model to load, or a version loads (its own timing would share the
        cores): re-timing uses the whole server's idle time, not one model's."""
        if self.server_loading():
            return None
        spells = [peer.answering_idle_since() for peer in self.peers]
        return None if any(since is None for since in spells) else max(s for s in spells if s is not None)

    def server_loading(self) -> bool:
        """Whether an entry of the served set loads a version, or has requests waiting for one to load."""
        return any(peer._loading or peer.waiting for peer in self.peers)

    def answering_busy(self) -> bool:
        """Whether the versions that answer callers (primary, canary) have work queued: shadow work
        then waits for nobody but is dropped."""
        answering = (self.current, self.sides[CANARY])
        return any(b.queue_depth > 0 for rt in answering if rt is not None for b in rt.batchers)

    def not_ready_message(self) -> str:
        # A reason without detail: callers need not be authenticated and errors name internal
        # paths (the store's among them); the log has the detail.
        reason = f" ({self.not_ready_reason})" if self.not_ready_reason else ""
        return f"model {self.ref} is not loaded yet{reason}; the server log says why"

    def store_missing(self) -> bool:
        """Whether the configured store is a local directory that does not exist."""
        return missing_directory(self.settings.store)

    def _store_contents(self) -> str:
        """What the store holds, for a ref it does not: ``models in the store: default (production ->
        v6, staging -> v7), tiny (no aliases)``, so a misspelt ``--model`` is fixed from the log."""
        try:
            names = self.store.list_models()
            if not names:
                return "the store holds no model yet (publish or import one)"
            described = []
            for name in names:
                aliases = self.store.aliases(name)
                pairs = ", ".join(f"{alias} -> {version}" for alias, version in sorted(aliases.items()))
                described.append(f"{name} ({pairs or 'no aliases'})")
            return "models in the store: " + ", ".join(described)
        except Exception as exc:  # the listing is a hint; its failure must not hide the first error
            return f"the store cannot be listed ({type(exc).__name__})"

    def _not_ready_reason(self, exc: BaseException) -> str:
        if self.store_missing():
            return f"the model store set by {STORE_SETTING} does not exist"
        if isinstance(exc, ModelNotFound):  # names models and versions only
            return f"{exc} in the model store set by {STORE_SETTING}"
        return f"loading failed ({type(exc).__name__})"

    # ------------------------------------------------------------------ quarantine
    def _quarantine(self, version: str | None, exc: BaseException, error: str) -> None:
        """A first load on request failed: the launch ends (the entry holds nothing) and no request
        tries again before the quarantine ends; the policy is the hot swaps' (``may_pass``)."""
        previous = self.quarantine
        failures = previous.failures + 1 if previous is not None and previous.version == version else 1
        refused = version is not None and not may_pass(exc)
        interval = self.settings.watch_interval_s
        delay = interval if refused else backoff_s(interval, failures)
        reason = self.not_ready_reason = self._not_ready_reason(exc)
        self._set_quarantine(Quarantine(version, reason, refused, failures, time.monotonic() + delay))
        self.last_error = None  # the entry is not retrying in the background: its state says quarantined
        self._task = None  # this launch ends here (the caller returns): the entry holds no slot
        if refused:
            log.error("cannot load %s on request (%s); %s@%s is refused until the alias names another version",
                      self.ref, error, self.name, version)  # fmt: skip
        else:
            log.error("cannot load %s on request (%s); quarantined for %.1fs (failure %d in a row)",
                      self.ref, error, delay, failures)  # fmt: skip
        self._changed()

    def _set_quarantine(self, quarantine: Quarantine | None) -> None:
        self.quarantine = quarantine
        self.metrics.set_quarantined(quarantine is not None, model=self.ref)

    async def check_quarantine(self) -> Quarantine | None:
        """The quarantine a request for this entry must respect now (it answers 503), or None when
        the request may load it: no quarantine, its backoff is over, or (refused) its alias names
        another version now. A refused entry's alias is read at most once per watch interval,
        whatever the number of requests."""
        quarantine = self.quarantine
        if quarantine is None or time.monotonic() < quarantine.until:
            return quarantine
        if not quarantine.refused:
            return None  # kept until a load succeeds: the next failure doubles the backoff
        async with self._recheck:
            quarantine = self.quarantine
            if quarantine is None or time.monotonic() < quarantine.until:
                return quarantine  # read meanwhile by another request
            version: str | None
            try:
                _, version = await asyncio.to_thread(self.store.resolve, self.ref)
            except Exception as exc:  # the store cannot be read now: the version stays refused
                log.warning("cannot read %s to see whether it moved (%s: %s)", self.ref, type(exc).__name__, exc)
                version = quarantine.version
            if version == quarantine.version and self.quarantine is quarantine:
                renewed = dataclasses.replace(quarantine, until=time.monotonic() + self.settings.watch_interval_s)
                self._set_quarantine(renewed)
                return renewed
            if self.quarantine is quarantine:
                log.info("%s now names %s@%s, not the refused %s: the next request loads it", self.ref, self.name,
                         version, quarantine.version)  # fmt: skip
                self._set_quarantine(None)
                self._changed()
            return self.quarantine

    # ------------------------------------------------------------------ loading
    async def _run(self) -> None:
        last_logged = 0.0
        while self.current is None:
            target: str | None = None  # the version tried, once the ref is resolved
            try:
                name, version = await asyncio.to_thread(self.store.resolve, self.ref)
                target = version
                aliases = await asyncio.to_thread(self.store.aliases, name)
                runtime = await self._load(name, version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep retrying: the store may be mounted or filled later
                self.metrics.model_load_failed(self.ref, failure_reason(exc))
                error = f"{type(exc).__name__}: {exc}"
                if self.store_missing():
                    error = f"the model store directory {self.settings.store!r} ({STORE_SETTING}) does not exist"
                elif isinstance(exc, ModelNotFound):
                    error += f"; {await asyncio.to_thread(self._store_contents)}"
                if self.loads_on_request:  # no retry in the background: quarantined until a request
                    self._quarantine(target, exc, error)
                    return
                # A new problem is an error; the same one again is repeated once a minute at most.
                if error != self.last_error or time.monotonic() - last_logged >= LOG_REPEAT_S:
                    log.error(
                        "cannot load %s from the store %r (%s); retrying every %.1fs",
                        self.ref,
                        self.settings.store,
                        error,
                        self.settings.watch_interval_s,
                    )
                    last_logged = time.monotonic()
                self.last_error = error
                self.not_ready_reason = self._not_ready_reason(exc)
                self._changed()
                await asyncio.sleep(self.settings.watch_interval_s)
                continue
            self.alias = self.selector if self.selector in aliases else None
            self._install(runtime, initial=True)
            self.metrics.model_loaded(self.ref)
            if self.quarantine is not None:
                log.info("%s loaded: out of quarantine", self.ref)
                self._set_quarantine(None)
            # The watcher below runs in this frame for good: it must not keep the first version
            # alive after a swap (that held ~190 MB per swap for ViT-sized models).
            del runtime
        if self.alias is None:
            log.info("serving %s pinned (not an alias): no hot swap", self.current.ref)
            return
        failures, last_logged = 0, 0.0
        while True:
            await asyncio.sleep(backoff_s(self.settings.watch_interval_s, failures))
            try:
                await self.poll_once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher outlives any bug in one poll: it waits longer, then retries
                failures += 1
                if failures == 1 or time.monotonic() - last_logged >= LOG_REPEAT_S:
                    log.exception(
                        "watching %s@%s failed (%d in a row); retrying in %.1fs",
                        self.name,
                        self.alias,
                        failures,
                        backoff_s(self.settings.watch_interval_s, failures),
                    )
                    last_logged = time.monotonic()

    async def poll_once(self) -> None:
        assert self.alias is not None and self.current is not None
        try:
            entry = await asyncio.to_thread(self.store.alias_entry, self.name, self.alias)
        except Exception as exc:  # unreadable, half-written, missing: report, keep serving, retry
            self._watch_failed(f"{type(exc).__name__}: {exc}")
            return
        if self.watch_error is not None:
            log.info("alias %s@%s readable again", self.name, self.alias)
            self.watch_error = None
            self.metrics.set_store_watch(ok=True, model=self.ref)
        if entry is None:
            return
        self.entry = entry  # requests are routed by it from now on (a new weight applies at once)
        await self._follow_primary(entry.version)
        await self._follow_side(CANARY, entry.canary.version if entry.canary is not None else None)
        await self._follow_side(SHADOW, entry.shadow.version if entry.shadow is not None else None)
        self._export_split()

    async def _follow_primary(self, target: str) -> None:
        assert self.alias is not None and self.current is not None
        if target == self.current.bundle.version or target == self._refused:
            return
        loaded = self._held(target)
        if loaded is not None:  # a canary promoted (or a shadow): it answers everything as it is
            log.info("alias %s@%s moved to %s, already loaded as its %s", self.name, self.alias, target, loaded.role)
            for role, runtime in self.sides.items():
                if runtime is loaded:
                    self.sides[role] = None
            self._install(loaded, initial=False)
            return
        if self._retry is not None and self._retry[0] == target and time.monotonic() < self._retry_at:
            return
        log.info("alias %s@%s moved to %s; loading beside %s", self.name, self.alias, target, self.current.ref)
        try:
            runtime = await self._load(self.name, target)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if may_pass(exc):
                self._load_failed(target, f"{type(exc).__name__}: {exc}")
                return
            self._retry = None
            self._refused = target
            self.metrics.model_swap("refused", model=self.ref)
            log.error(
                "refusing %s@%s (%s: %s); %s keeps serving",
                self.name,
                target,
                type(exc).__name__,
                exc,
                self.current.ref,
            )
            return
        self._install(runtime, initial=False)

    def _load_failed(self, target: str, error: str) -> None:
        failures = self._retry[1] + 1 if self._retry is not None and self._retry[0] == target else 1
        self._retry = (target, failures)
        delay = backoff_s(self.settings.watch_interval_s, failures)
        self._retry_at = time.monotonic() + delay
        self.metrics.model_swap("retrying", model=self.ref)
        log.warning(
            "cannot load %s@%s yet (%s); %s keeps serving, retrying in %.1fs",
            self.name,
            target,
            error,
            self.current.ref if self.current else "nothing",
            delay,
        )

    def _watch_failed(self, error: str) -> None:
        # A new error is logged at once; the same one again once a minute at most.
        if error != self.watch_error or time.monotonic() - self._watch_logged >= LOG_REPEAT_S:
            serving = self.current.ref if self.current else "nothing"
            log.warning(
                "cannot read alias %s@%s (%s); %s keeps serving, retrying every %.1fs",
                self.name,
                self.alias,
                error,
                serving,
                self.settings.watch_interval_s,
            )
            self._watch_logged = time.monotonic()
        self.watch_error = error
        self.metrics.set_store_watch(ok=False, model=self.ref)

    async def _load(self, name: str, version: str) -> ModelRuntime:
        self._loading += 1
        self.load_started = time.monotonic()
        try:
            runtime = await self._load_version(name, version)
        finally:
            self._loading -= 1
            self.load_started = None
        self.last_load_s = runtime.load_s
        return runtime

    async def _load_version(self, name: str, version: str) -> ModelRuntime:
        started = time.perf_counter()

        def load_and_warm() -> tuple[ModelBundle, ServingTowers, str]:
            bundle = ModelBundle.load(self.store, f"{name}@{version}", self.device)  # verifies checksums
            if self.settings.warmup:
                warm_up(bundle)
            # Not skipped with warmup=False: the parity gate decides whether the version may serve.
            towers, backend = serving_towers(bundle, self.settings, self.device, self.store)
            return bundle, towers, backend

        bundle, towers, backend = await asyncio.to_thread(load_and_warm)
        runtime = build_runtime(bundle, self.settings, self.metrics, towers, backend, model=self.ref)
        self._count_decision(runtime)
        await runtime.start()
        settle()  # the new version's objects join the frozen ones (only what is new is walked)
        runtime.load_s = time.perf_counter() - started
        log.info(
            "loaded %s on %s in %.2fs (backend %s; text encoders: %s; dcsm: %s)",
            bundle.ref,
            self.device,
            time.perf_counter() - started,
            backend,
            ", ".join(sorted(bundle.text_models)),
            "yes" if bundle.dcsm is not None else "no",
        )
        return runtime

    def _count_decision(self, runtime: ModelRuntime) -> None:
        if runtime.auto is not None:
            decision = runtime.auto
            self.metrics.backend_auto(decision.outcome, decision.margin, decision.spread)

    async def _retime_attempt(self, serving: ModelRuntime, interrupted: Interrupted, pace: Pace | None) -> Result:
        """One re-timing of the serving primary (``service.runtime.retime``): the version loaded
        again beside it, in a worker thread, its ``auto`` decided again (deferred: timed, asking
        ``interrupted`` before every timed call; decided here: only a shared decision replaces
        it); a winner is swapped in like a new version and the serving towers drain. ``pace``
        (under traffic): called after the load and each build and timed call (``Pacer``)."""
        decision = serving.auto
        assert decision is not None
        ref = serving.ref
        if decision.outcome != "deferred" and not await asyncio.to_thread(self._shared_exists, serving.bundle):
            return "unshared"

        def measure() -> tuple[ModelBundle, ServingTowers, str]:
            started = time.perf_counter()
            bundle = ModelBundle.load(self.store, ref, self.device)
            if self.settings.warmup:
                warm_up(bundle)
            if pace is not None:
                pace(time.perf_counter() - started)
            towers, backend = serving_towers(bundle, self.settings, self.device, self.store, interrupted=interrupted,
                                             pace=pace)  # fmt: skip
            return bundle, towers, backend

        self._retiming += 1
        try:
            bundle, towers, backend = await asyncio.to_thread(measure)
        finally:
            self._retiming -= 1
        found = towers.auto
        if found is not None and found.outcome == "deferred":
            self.metrics.backend_auto(found.outcome, found.margin, found.spread)
            return "deferred"
        if found is None or (decision.outcome != "deferred" and found.outcome != "shared"):
            return "unshared"  # the shared decision could not be used here: the local one stays
        if self.current is not serving:
            return "superseded"
        runtime = build_runtime(bundle, self.settings, self.metrics, towers, backend, model=self.ref)
        self._count_decision(runtime)
        await runtime.start()
        if self.current is not serving:  # replaced while this one started: it never served
            await runtime.stop()
            return "superseded"
        log.info("auto re-timing of %s: %s %s (%s) replaces %s %s", ref, found.backend, found.precision,
                 found.outcome, decision.backend, decision.precision)  # fmt: skip
        self._install(runtime, initial=False, retimed=True)
        return found.outcome

    def _shared_exists(self, bundle: ModelBundle) -> bool:
        """Whether the store holds a decision ``clip-train tune`` shared for this CPU kind and these settings."""
        from clipcore.backends.shared import shared_key

        key, _ = shared_key(self.device, self.settings.torch_threads or None, self.settings.precision,
                            self.settings.batching.max_batch_images)  # fmt: skip
        try:
            return self.store.artifacts(bundle.name, bundle.version, key) is not None
        except Exception:  # unreadable now: looked up again at the next attempt
            log.warning("auto re-timing of %s: the store's shared decisions cannot be read", bundle.ref, exc_info=True)
            return False

    def _install(self, runtime: ModelRuntime, initial: bool, retimed: bool = False) -> None:
        old, self.current = self.current, runtime  # one assignment: requests see old or new
        self.last_error = None
        self._refused = None
        self._retry = None
        self._relabel()
        bundle = runtime.bundle
        self.metrics.set_serving_model(bundle.name, bundle.version, sorted(runtime.text_batchers), model=self.ref)
        if not initial:
            self.metrics.model_swap("ok", model=self.ref)
        self._changed()
        self.retimer.follow(runtime, retimed=retimed)
        if old is not None:
            if retimed:
                log.info("swapped %s to %s; draining the reference towers", runtime.ref, runtime.backend)
            else:
                log.info("swapped %s -> %s; draining the old version", old.ref, runtime.ref)
            self._release(old)

    # ------------------------------------------------------------------ canary and shadow
    def _held(self, version: str) -> ModelRuntime | None:
        """The loaded runtime of ``version`` in any role, if any."""
        for runtime in (self.current, *self.sides.values()):
            if runtime is not None and runtime.bundle.version == version:
                return runtime
        return None

    async def _follow_side(self, role: str, want: str | None) -> None:
        """Load, keep or drop the version ``role`` (canary or shadow) names; while it is not loaded
        the primary answers every request (a canary's share included) and nothing is shadowed."""
        assert self.current is not None
        if want == self.current.bundle.version:
            want = None  # nothing runs beside the primary as itself
        have = self.sides[role]
        if have is not None and have.bundle.version == want:
            return
        if have is not None:  # its callers are routed by the new entry already: it has none left
            self.sides[role] = None
            log.info("%s %s ended beside %s", role, have.ref, self.current.ref)
            self._release(have)
            self._relabel()
        if want is None:
            return
        runtime = self._held(want) or await self._load_side(role, want)
        if runtime is None:
            return
        self.sides[role] = runtime
        self._relabel()
        if role == SHADOW:  # a new shadow period: its summary starts from nothing
            self.shadows.forget(want)
        log.info("%s %s loaded beside %s", role, runtime.ref, self.current.ref)

    async def _load_side(self, role: str, version: str) -> ModelRuntime | None:
        assert self.current is not None
        state = self._side_loads[role]
        if state.waits(version, time.monotonic()):
            return None
        log.info(
            "alias %s@%s has a %s %s; loading it beside %s", self.name, self.alias, role, version, self.current.ref
        )
        try:
            runtime = await self._load(self.name, version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            serving = self.current.ref if self.current is not None else "nothing"
            if may_pass(exc):
                delay = backoff_s(self.settings.watch_interval_s, state.failed(version))
                state.retry_at = time.monotonic() + delay
                self.metrics.side_load(role, "retrying", model=self.ref)
                log.warning(
                    "cannot load %s %s@%s yet (%s: %s); %s answers every request meanwhile, retrying in %.1fs",
                    role, self.name, version, type(exc).__name__, exc, serving, delay,
                )  # fmt: skip
                return None
            state.refuse(version)
            self.metrics.side_load(role, "refused", model=self.ref)
            log.error(
                "refusing %s %s@%s (%s: %s); %s answers every request",
                role, self.name, version, type(exc).__name__, exc, serving,
            )  # fmt: skip
            return None
        state.loaded()
        self.metrics.side_load(role, "ok", model=self.ref)
        return runtime

    def _relabel(self) -> None:
        """Each loaded runtime takes its foremost role (a shadow may be the canary's version too)."""
        for role in (SHADOW, CANARY):
            runtime = self.sides[role]
            if runtime is not None:
                runtime.set_role(role)
        if self.current is not None:
            self.current.set_role(PRIMARY)

    def _export_split(self) -> None:
        """The canary weight and shadow fraction this server applies, as gauges."""
        entry, canary, shadow = self.entry, self.sides[CANARY], self.sides[SHADOW]
        for version in self._split_exported:
            self.metrics.clear_split(self.ref, version)
        self._split_exported.clear()
        if entry is None:
            return
        if canary is not None and entry.canary is not None and entry.canary.version == canary.bundle.version:
            self.metrics.set_split(self.ref, canary.bundle.version, weight=entry.canary.weight)
            self._split_exported.add(canary.bundle.version)
        if shadow is not None and entry.shadow is not None and entry.shadow.version == shadow.bundle.version:
            self.metrics.set_split(self.ref, shadow.bundle.version, fraction=entry.shadow.fraction)
            self._split_exported.add(shadow.bundle.version)

    def _release(self, runtime: ModelRuntime) -> None:
        """Drain and stop ``runtime`` unless it still holds another role."""
        if runtime is self.current or any(r is runtime for r in self.sides.values()):
            return
        task = asyncio.get_running_loop().create_task(self._retire(runtime))
        self._retiring[task] = runtime
        task.add_done_callback(self._retired)

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.pop(task, None)
        # Once the task's frame and this table no longer hold the version: its cycles are collected
        # and its pages handed back (``heap.settle``), in a worker thread as an unload does.
        with contextlib.suppress(RuntimeError):  # the loop's executor is gone at shutdown
            asyncio.get_running_loop().run_in_executor(None, release_freed_memory)

    async def _retire(self, runtime: ModelRuntime) -> None:
        try:
            await asyncio.wait_for(runtime.idle.wait(), self.settings.drain_timeout_s)
        except TimeoutError:
            log.warning(
                "%s still has %d requests after %.0fs; stopping it anyway",
                runtime.ref,
                runtime.active,
                self.settings.drain_timeout_s,
            )
        await runtime.stop()
        log.info("retired %s", runtime.ref)
        version = runtime.bundle.version
        if self._held(version) is None:  # not loaded again meanwhile: its series and totals go
            self.metrics.forget_version(self.ref, version)
            self.shadows.forget(version)
