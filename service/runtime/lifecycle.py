"""One served entry: its role table, the loop that reconciles it with the store, and its leases.

A ``ModelManager`` serves one entry of the served set (``service.runtime.served``) and is made of
parts with one job each: the role table (``roles``: which loaded version is primary, canary and
shadow, and which one answers a caller), the version loader (``loader``: the one way a version is
loaded, for hot swaps, side loads and re-timing), the reconciler (``reconciler``: loads and swaps
toward the store's alias, with the one refuse-or-retry policy of ``policy``), the shadow runner
(``shadow``) and the re-timer (``retime``). What it adds is the leases: requests ``acquire`` the
runtime that answers them and keep that reference to the end, so a swap never changes the model
under a running request; a version no role holds any more is drained and only stopped once the
requests holding it are done (or after ``drain_timeout_s``). The HTTP layer reads it through
``view`` (a read-only snapshot), never through its parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from clipcore.backends.auto import Interrupted, Pace
from clipcore.errors import ClipError, ErrorCode
from model_store import ModelStore, parse_ref
from model_store.aliases import AliasEntry
from service.config import Settings
from service.runtime.assembly import resolve_device
from service.runtime.drain import Drain, release_freed_memory
from service.runtime.loader import VersionLoader
from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime
from service.runtime.policy import Quarantine
from service.runtime.reconciler import Reconciler
from service.runtime.retime import Result, Retimer, RetimeState, attempt_copy
from service.runtime.roles import PRIMARY, RoleTable
from service.runtime.shadow import EndpointStats, ShadowJob, ShadowRunner

__all__ = ["EntryView", "ModelManager", "ModelRuntime", "ModelState", "Neighbours", "Quarantine"]

log = logging.getLogger("service.lifecycle")

ModelState = Literal["ready", "loading", "failed", "unloaded", "quarantined"]
# (the entry, versions it would add, bytes it would add, runtimes loaded for it but not in its table yet)
# -> why that does not fit the memory budget, or None.
BudgetCheck = Callable[["ModelManager", int, int, list[ModelRuntime]], str | None]


@dataclass
class Neighbours:
    """The entries of one server: re-timing waits until none has a request, and they re-time one
    at a time (two would be each other's noise)."""

    entries: list[ModelManager] = field(default_factory=list)
    retime_turn: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True)
class EntryView:
    """What one entry serves, read-only, for the HTTP layer (/models, /readyz, error messages)."""

    ref: str
    name: str
    primary: ModelRuntime | None
    canary: ModelRuntime | None
    shadow: ModelRuntime | None
    alias: AliasEntry | None  # the alias entry requests are routed by (None: pinned or not read)
    retime: RetimeState | None
    shadow_stats: Mapping[str, EndpointStats]  # of the shadow the alias names, by endpoint
    side_problems: Mapping[str, str | None]  # role -> why the version the alias names is not loaded


class ModelManager:
    """One served model: ``ref`` (default: the ``model`` setting, which must then be one ref)
    loaded, watched and hot-swapped. ``on_change`` is called whenever what it serves, or whether
    it has requests in flight, changes (the served set waits on it to load models on demand);
    ``budget`` says whether a canary or shadow fits the memory budget."""

    def __init__(
        self,
        settings: Settings,
        store: ModelStore,
        metrics: ServiceMetrics,
        ref: str | None = None,
        on_change: Callable[[], None] | None = None,
        neighbours: Neighbours | None = None,
        budget: BudgetCheck | None = None,
    ) -> None:
        self.settings, self.store, self.metrics = settings, store, metrics
        self.ref = settings.model if ref is None else ref
        self.name, self.selector = parse_ref(self.ref)
        self.on_change = on_change
        self.neighbours = neighbours if neighbours is not None else Neighbours()
        self.neighbours.entries.append(self)
        self._budget = budget
        self.last_used = 0.0  # monotonic time of the last request, for unloading the least recently used
        self.waiting = 0  # requests waiting for it to load (under a memory budget)
        # Set by the served set for the entries it loads on request: a failed first load ends the
        # launch and quarantines the entry, instead of being retried in the background.
        self.loads_on_request = False
        self.device = resolve_device(settings.device)
        self.table: RoleTable[ModelRuntime] = RoleTable(self.name)
        self.loader = VersionLoader(settings, store, metrics, self.device, self.ref)
        self.reconciler = Reconciler(self)
        self._task: asyncio.Task[None] | None = None
        self.drain = Drain(settings.drain_timeout_s, self._forget)
        self._split_exported: set[str] = set()  # versions exporting clip_canary_weight_ratio/clip_shadow_sample_ratio
        self.shadows = ShadowRunner(self.ref, metrics, lease=self.table.shadow_of, busy=self.answering_busy,
                                    idle_since=self.answering_idle_since,
                                    quiet_s=settings.shadow_quiet_ms / 1000)  # fmt: skip
        self.retimer = Retimer(settings, metrics, self.ref, idle_since=self.server_idle_since,
                               attempt=self.retime_attempt, loading=self.server_loading,
                               turn=self.neighbours.retime_turn)  # fmt: skip
        metrics.set_store_watch(ok=True, model=self.ref)

    # ------------------------------------------------------------------ read-only state
    @property
    def current(self) -> ModelRuntime | None:
        """The primary: answers every request its canary does not take."""
        return self.table.primary

    @property
    def quarantine(self) -> Quarantine | None:
        return self.table.quarantine

    @property
    def last_error(self) -> str | None:
        return self.reconciler.last_error

    @property
    def not_ready_reason(self) -> str | None:
        return self.reconciler.not_ready_reason

    @property
    def watch_error(self) -> str | None:
        return self.reconciler.watch_error

    @property
    def load_started(self) -> float | None:
        return self.loader.load_started

    @property
    def last_load_s(self) -> float | None:
        return self.loader.last_load_s

    def view(self) -> EntryView:
        table = self.table
        alias = table.entry if table.primary is not None else None
        retime = self.retimer.state
        primary = table.primary
        if retime is not None and (primary is None or retime.version != primary.version):
            retime = None
        shadow_version = alias.shadow.version if alias is not None and alias.shadow is not None else None
        stats = self.shadows.summary(shadow_version) if shadow_version is not None else {}
        return EntryView(self.ref, self.name, primary, table.canary, table.shadow, alias, retime, stats,
                         dict(self.reconciler.side_problems))  # fmt: skip

    @property
    def started(self) -> bool:
        """Whether this entry holds (or is loading) a version: what a memory budget counts."""
        return self.table.primary is not None or (self._task is not None and not self._task.done())

    @property
    def state(self) -> ModelState:
        """``ready`` (serving), ``loading``, ``failed`` (no version loaded; retrying, the log says
        why), ``quarantined`` (loaded on request, and its last load failed: ``quarantine`` says
        until when no request tries again) or ``unloaded`` (not loaded: past the memory budget,
        until a request names it)."""
        if self.table.primary is not None:
            return "ready"
        if self._task is None or self._task.done():
            return "quarantined" if self.table.quarantine is not None else "unloaded"
        return "failed" if self.last_error is not None else "loading"

    @property
    def evictable(self) -> bool:
        """No request in flight on any of its versions (canary and shadow runs included), none
        waiting for it to load and no load in progress: unloading it now fails nothing and undoes
        no load a request waits for (two models waiting for one slot would unload each other's as
        soon as it started, or before their requests got to it)."""
        if self.loader.loading or self.loader.retiming or self.waiting:
            return False
        return not self.drain.active() and all(runtime.active == 0 for runtime in self.table.loaded())

    def over_budget(self, versions: int, size: int, extra: list[ModelRuntime]) -> str | None:
        """Why ``versions`` more versions of ``size`` bytes beside ``extra`` would not fit the memory
        budget (None: they fit, or there is no budget)."""
        return self._budget(self, versions, size, extra) if self._budget is not None else None

    # ------------------------------------------------------------------ start and stop
    def launch(self) -> None:
        """Start loading (and then watching) unless already started; returns at once."""
        if not self.started:
            self.shadows.launch()
            self._task = asyncio.get_running_loop().create_task(self.reconciler.run(), name=f"model-manager {self.ref}")

    async def check_quarantine(self) -> Quarantine | None:
        """The quarantine a request for this entry must respect now (``Reconciler.check_quarantine``)."""
        return await self.reconciler.check_quarantine()

    def launch_ended(self) -> None:
        """The reconciler's launch ended without a version (quarantined): the entry holds no slot."""
        self._task = None

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def set_quarantine(self, quarantine: Quarantine | None) -> None:
        if quarantine is None:
            self.table.lift()
        else:
            self.table.quarantined(quarantine)
        self.metrics.set_quarantined(quarantine is not None, model=self.ref)

    def unload(self) -> Coroutine[Any, Any, None]:
        """Stop watching and stop the serving version with its canary and shadow (and the shadow
        runner), to make room under a memory budget; the next ``launch`` loads the ref again (the
        alias may have moved meanwhile). The caller checks ``evictable`` first. The entry lets go
        of its versions now, before this returns, so no request can acquire them after the check;
        await the returned coroutine to stop them (their batchers and model threads)."""
        task, self._task = self._task, None
        runtimes = self.table.evict()
        shadows = self.shadows.stop()  # queued shadow runs are dropped: their versions go
        retiming = self.retimer.stop()
        self.reconciler.reset()
        self.reconciler.not_ready_reason = "unloaded to make room for other models; the next request loads it"
        self.metrics.clear_model(self.ref)
        self.metrics.set_store_watch(ok=True, model=self.ref)
        self.export_split()
        for runtime in runtimes:
            self.metrics.forget_version(self.ref, runtime.version)
            self.shadows.forget(runtime.version)
        if runtimes:
            self.metrics.model_unloaded(self.ref)
        self.changed()
        return self._stop_unloaded([t for t in (task, shadows, retiming) if t is not None], runtimes)

    async def _stop_unloaded(self, tasks: list[asyncio.Task[None]], runtimes: list[ModelRuntime]) -> None:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
        await self.drain.close()
        for runtime in self.table.evict():
            try:
                await runtime.stop()
            except Exception:
                log.exception("stopping %s failed", runtime.ref)

    # ------------------------------------------------------------------ leases
    @contextlib.asynccontextmanager
    async def acquire(self, key: str | bytes | None = None, version: str | None = None) -> AsyncIterator[ModelRuntime]:
        """The runtime that answers a request from the caller ``key`` (``RoleTable.route``: the
        canary for the callers the alias routes to it, else the primary; the ``version`` the
        request named, while it is one of them), held for the whole request (no await between the
        read and the count)."""
        if self.table.primary is None:
            raise ClipError(ErrorCode.not_ready, self.not_ready_message(), retry_after=1)
        runtime = self.table.route(key, version, self.ref)
        idle_since = self.answering_idle_since()
        self.last_used = time.monotonic()
        if idle_since is not None and idle_since > 0:  # teaches shadow runs the traffic's gaps
            self.shadows.note_gap(self.last_used - idle_since)
        for peer in self.neighbours.entries:  # a measurement in the idle time, of any entry, stops now
            peer.retimer.request_arrived()
        try:
            with runtime.held():
                yield runtime
        finally:
            self.last_used = time.monotonic()
            if runtime.active == 0:
                self.changed()  # an idle model may now be unloaded for one a request waits for

    def serves(self, version: str, role: str = PRIMARY) -> bool:
        return self.table.serves(version, role)

    def pins(self, version: str) -> bool:
        """Whether a request naming ``version`` belongs here (``RoleTable.pins``)."""
        return self.table.pins(version)

    def answers(self, key: str | bytes | None) -> str | None:
        return self.table.answers(key)

    def shadow_sample(self) -> str | None:
        return self.table.shadow_sample()

    async def offer_shadow(self, job: ShadowJob[Any]) -> None:
        """Queue a shadow run of an answered request (a background task of the response)."""
        await self.shadows.offer(job)

    def answering_idle_since(self) -> float | None:
        """When the last request on the versions that answer callers (primary, canary) ended
        (monotonic), None while one is in flight: shadow runs wait for a gap in the traffic."""
        if any(rt is not None and rt.active > 0 for rt in (self.table.primary, self.table.canary)):
            return None
        return self.last_used

    def server_idle_since(self) -> float | None:
        """When the last request on any entry of the served set ended (monotonic), None while one is
        in flight, waits for a model to load, or a version loads (its own timing would share the
        cores): re-timing uses the whole server's idle time, not one model's."""
        if self.server_loading():
            return None
        spells = [peer.answering_idle_since() for peer in self.neighbours.entries]
        return None if any(since is None for since in spells) else max(s for s in spells if s is not None)

    def server_loading(self) -> bool:
        """Whether an entry of the served set loads a version, or has requests waiting for one to load."""
        return any(peer.loader.loading or peer.waiting for peer in self.neighbours.entries)

    def answering_busy(self) -> bool:
        """Whether the versions that answer callers (primary, canary) have work queued: shadow work
        then waits for nobody but is dropped."""
        answering = (self.table.primary, self.table.canary)
        return any(b.queue_depth > 0 for rt in answering if rt is not None for b in rt.batchers)

    def not_ready_message(self) -> str:
        # A reason without detail: callers need not be authenticated and errors name internal
        # paths (the store's among them); the log has the detail.
        reason = f" ({self.not_ready_reason})" if self.not_ready_reason else ""
        return f"model {self.ref} is not loaded yet{reason}; the server log says why"

    # ------------------------------------------------------------------ swaps and retirement
    def install(self, runtime: ModelRuntime, initial: bool, retimed: bool = False) -> None:
        """``runtime`` becomes the primary (a first load, a hot swap, a promotion, a re-timed copy)."""
        if self.table.quarantine is not None:
            log.info("%s loaded: out of quarantine", self.ref)
            self.metrics.set_quarantined(False, model=self.ref)
        dropped = self.table.load(runtime)  # one assignment: requests see old or new (and no quarantine)
        self.reconciler.last_error = None
        self.reconciler.attempts[PRIMARY].loaded()  # whatever failed before may be tried when named again
        bundle = runtime.bundle
        self.metrics.set_serving_model(bundle.name, bundle.version, sorted(runtime.text_batchers), model=self.ref)
        if not initial:
            self.metrics.model_swap("ok", model=self.ref)
        self.changed()
        self.retimer.follow(runtime, retimed=retimed)
        for old in dropped:
            what = f"{runtime.ref} to {runtime.backend}; draining the reference towers" if retimed else (
                f"{old.ref} -> {runtime.ref}; draining the old version")  # fmt: skip
            log.info("swapped %s", what)
        self.release(dropped)

    def export_split(self) -> None:
        """The canary weight and shadow fraction this server applies, as gauges."""
        for version in self._split_exported:
            self.metrics.clear_split(self.ref, version)
        self._split_exported.clear()
        view = self.view()
        entry, canary, shadow = view.alias, view.canary, view.shadow
        if entry is None:
            return
        if canary is not None and entry.canary is not None and entry.canary.version == canary.version:
            self.metrics.set_split(self.ref, canary.version, weight=entry.canary.weight)
            self._split_exported.add(canary.version)
        if shadow is not None and entry.shadow is not None and entry.shadow.version == shadow.version:
            self.metrics.set_split(self.ref, shadow.version, fraction=entry.shadow.fraction)
            self._split_exported.add(shadow.version)

    def release(self, runtimes: list[ModelRuntime]) -> None:
        """Drain and stop each of ``runtimes`` that no role holds."""
        for runtime in runtimes:
            if self.table.held(runtime.version) is not runtime:
                self.drain.add(runtime)

    def _forget(self, version: str) -> None:
        if self.table.held(version) is None:  # not loaded again meanwhile: its series and totals go
            self.metrics.forget_version(self.ref, version)
            self.shadows.forget(version)

    # ------------------------------------------------------------------ re-timing
    async def retime_attempt(self, serving: ModelRuntime, interrupted: Interrupted, pace: Pace | None) -> Result:
        """One re-timing of the serving primary by the version loader (``retime.attempt_copy``)."""
        return await attempt_copy(
            self.loader, self.store, serving, interrupted, pace, serving_now=lambda: self.table.primary,
            install=lambda runtime: self.install(runtime, initial=False, retimed=True),
        )  # fmt: skip
