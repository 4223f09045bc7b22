"""The served set: every model ref of ``CLIP_MODEL``, each served by a ``ModelManager`` of its own.

``CLIP_MODEL=default@production,default@v5,other`` serves three entries. Each is loaded, warmed,
watched and hot-swapped on its own (a version one of them refuses touches none of the others),
and each loaded version has its own batchers, model thread and cache keys (``name@version``).
The first entry is the default: it answers requests that name no model, and ``/readyz`` is ready
once it serves.

A request's ``model`` picks the entry (``resolve``), and within it the caller's key picks the
version (the entry's canary for the callers its alias routes there, else its primary; each entry
has its own canary, shadow and shadow runner, ``service.runtime.lifecycle``):

* ``name``: the first entry of that model name;
* ``name@selector``: the entry configured with that selector (``name@production`` for the entry
  ``name@production``, or ``name`` which means the same), else an entry of that name now serving
  version ``selector`` as its primary or as its loaded canary: that version answers the request,
  whatever the caller's key (``Selection.version``);
* anything else is ``unknown_model``, whose message lists the set.

Memory budget (``max_loaded_models``: loaded versions, every role counted; ``max_loaded_bytes``:
their weights' bytes; 0 = none; ``service.runtime.budget``): the first entries load at start, the
others on their first request (and again on a request after an unload). That request waits for
the load, within the request's time budget, else it gets 503 with Retry-After while the load goes
on.

Only a load that succeeded makes room, and only by unloading an idle model: the new version is
loaded first, beside the models already in memory, and once it serves, the least recently used
entry with no request in flight (on its primary, canary or shadow), none waiting for it to load
and no load in progress is unloaded with its canary, shadow and shadow runner; the default entry
never is. So a load that fails (a corrupt version) unloads nothing: callers of the healthy models
never pay for it. The price is memory: while a load on request runs, the budget's models and the
one loading are in memory, which is what a hot swap of any entry (the new version loaded beside
the old) costs too. It stays bounded: a load beyond the budget starts only while no other one
runs (loads within the budget, when a model was unloaded or failed, start at once), and only when
an idle model is there to make room for it; otherwise the request waits for one. Once loaded,
the set is over budget until a model is idle, and the first one that is (least recently used
first) is unloaded. (Unloading first, then loading, would keep to the budget during the load,
but a load that then fails has already thrown out a healthy model: a caller could empty the set
of its loaded models by naming a broken one every few seconds.)

A failed load on request quarantines its entry (``policy.Quarantine``): requests for it get
503 at once with Retry-After and the reason, nothing is loaded, until its backoff ends (or, for a
refused version, its alias names another version). Loads on request are also bounded in rate,
all entries together (``max_loads_per_minute``): past it, 503 with Retry-After instead of a load.
Each entry has at most one load in progress (its own task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

from clipcore.errors import ClipError, ErrorCode
from model_store import ModelStore
from service.config import Settings
from service.runtime.budget import MemoryBudget
from service.runtime.lifecycle import ModelManager, ModelState, Neighbours
from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime
from service.runtime.pipeline import REQUEST_STAGES
from service.runtime.policy import Quarantine

__all__ = ["EntryStatus", "Selection", "ServedModels", "shown_name"]

log = logging.getLogger("service.served")

# A requested name is echoed in an error at most this long: a 100 KB name made a 100 KB 404.
SHOWN_NAME_CHARS = 200
WAKE_S = 1.0  # a waiting request looks again at least this often, whatever it was told
RATE_WINDOW_S = 60.0  # max_loads_per_minute counts the loads started in this window


@dataclass(frozen=True)
class EntryStatus:
    """What one entry of the set serves, for /readyz, /models and /v1/models."""

    ref: str  # as configured: "default@production", "other@v3", "other"
    name: str
    serving: str | None  # the name@version it answers with; None while not loaded
    state: ModelState
    default: bool
    store_ok: bool  # whether its alias could be read on the last poll
    created_at: str | None  # when the serving version was published
    canary: str | None = None  # the name@version of its loaded canary, if any
    canary_created_at: str | None = None
    # The name@version that answers the caller ``status`` was asked for, when it names this entry:
    # None while not loaded, or while a canary splits and the caller has no key (random per request).
    answers: str | None = None
    quarantine: Quarantine | None = None  # while quarantined: why, and until when


@dataclass(frozen=True)
class Selection:
    """What a request's ``model`` picks: an entry, and a version of it when the ``model`` names one
    (its primary's or its canary's: that version answers, whatever the caller's key)."""

    entry: ModelManager
    version: str | None = None


class ServedModels:
    def __init__(self, settings: Settings, store: ModelStore, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.budget = MemoryBudget(settings)
        # One server: a request for any model stops every entry's re-timing, and one re-times at a time.
        neighbours = Neighbours()
        self.entries = [
            ModelManager(
                settings, store, metrics, ref, on_change=self._wake, neighbours=neighbours, budget=self._side_refusal
            )  # fmt: skip
            for ref in settings.served_refs()
        ]
        self.metrics = metrics
        self._waiters: set[asyncio.Future[None]] = set()
        self._stopping: set[asyncio.Task[None]] = set()  # versions being stopped after an unload
        self._load_starts: deque[float] = deque()  # monotonic starts of the loads on request in the window
        self._enforcing = False
        self._alias_reads: list[asyncio.Task[None]] = []
        if self.on_demand:
            at_start = self.budget.at_start(len(self.entries))
            for entry in self.entries[at_start:]:  # the default entry loads at start and retries until it serves
                entry.loads_on_request = True
                metrics.set_quarantined(False, model=entry.ref)

    @property
    def default(self) -> ModelManager:
        return self.entries[0]

    @property
    def on_demand(self) -> bool:
        """Whether some entries load on their first request (not at start)."""
        return self.budget.at_start(len(self.entries)) < len(self.entries)

    async def start(self) -> None:
        at_start = self.budget.at_start(len(self.entries))
        for entry in self.entries[:at_start]:
            entry.launch()
        if self.on_demand:
            later = ", ".join(e.ref for e in self.entries[at_start:])
            log.info("%s: %s load on their first request", self.budget.describe(), later)
            self._alias_reads = [asyncio.create_task(_learn_alias(e)) for e in self.entries[at_start:]]

    def _side_refusal(self, entry: ModelManager, versions: int, size: int, extra: list[ModelRuntime]) -> str | None:
        return self.budget.side_refusal(entry, self.default, versions, size, extra)

    async def close(self) -> None:
        for read in self._alias_reads:
            read.cancel()
        # Each entry closes even if one before it fails.
        for entry in self.entries:
            try:
                await entry.close()
            except Exception:
                log.exception("closing %s failed", entry.ref)
        await asyncio.gather(*self._stopping, return_exceptions=True)

    # ------------------------------------------------------------------ routing
    def resolve(self, requested: str | None) -> Selection:
        """The entry a request's ``model`` names (the default entry for None), with the version it
        pins if it names one its entry serves (as primary or canary; an entry unloaded under the
        memory budget serves what its alias named when it was unloaded, one not loaded yet what its
        alias named at start, and loads for it);
        unknown_model else."""
        if requested is None:
            return Selection(self.default)
        name, at, selector = requested.partition("@")
        found: Selection | None = None
        if not at:
            found = next((Selection(e) for e in self.entries if e.name == name), None)
        else:
            found = next((Selection(e) for e in self.entries if (e.name, e.selector) == (name, selector)), None)
            # A version: the entry that answers with it now, as its primary (first) or its canary,
            # else one whose alias names it while the entry is not loaded.
            tests = (lambda e: e.serves(selector), lambda e: e.serves(selector, "canary"), lambda e: e.pins(selector))
            for serves in tests:
                if found is None:
                    found = next((Selection(e, selector) for e in self.entries if e.name == name and serves(e)), None)
        if found is None:
            raise ClipError(
                ErrorCode.unknown_model,
                f"model {shown_name(requested)} is not served here; this server serves {self.describe()}",
                "model",
            )
        return found

    def describe(self) -> str:
        """The set in words: ``default@production (default@v6), other@v3, big (not loaded)``."""
        parts = []
        for entry in self.entries:
            view = entry.view()
            current, canary = view.primary, view.canary
            if current is None:
                parts.append(f"{entry.ref} (not loaded)")
            elif current.ref != entry.ref or canary is not None:
                serving = current.ref if canary is None else f"{current.ref}, canary {canary.ref}"
                parts.append(f"{entry.ref} ({serving})")
            else:
                parts.append(entry.ref)
        return ", ".join(parts)

    def status(self, key: str | bytes | None = None) -> list[EntryStatus]:
        """Each entry's state, and which of its versions answers the caller ``key``."""
        out = []
        for entry in self.entries:
            view = entry.view()
            current, canary = view.primary, view.canary
            out.append(
                EntryStatus(
                    ref=entry.ref,
                    name=entry.name,
                    serving=current.ref if current is not None else None,
                    state=entry.state,
                    default=entry is self.default,
                    store_ok=entry.watch_error is None,
                    created_at=current.bundle.manifest.created_at if current is not None else None,
                    canary=canary.ref if canary is not None else None,
                    canary_created_at=canary.bundle.manifest.created_at if canary is not None else None,
                    answers=entry.answers(key),
                    quarantine=entry.quarantine if current is None else None,
                )
            )
        return out

    def acquire(
        self, requested: str | None, key: str | bytes | None = None
    ) -> contextlib.AbstractAsyncContextManager[ModelRuntime]:
        """The runtime of the entry ``requested`` names that answers the caller ``key`` (its canary
        or its primary, ``ModelManager.acquire``; the version ``requested`` names, if it names
        one), held for the whole request. Under a memory budget, a model that is not loaded is
        loaded first (the request waits)."""
        return self.lease(self.resolve(requested), key)

    def lease(
        self, selection: Selection, key: str | bytes | None = None
    ) -> contextlib.AbstractAsyncContextManager[ModelRuntime]:
        """``acquire`` for a ``model`` already resolved: loaded if need be, routed, held."""
        entry = selection.entry
        # A model not loaded yet is waited for within the request's time budget: under a memory
        # budget it is loaded on request; otherwise it may still be loading at start (the server
        # is ready once its default model is). A failed load answers 503 at once.
        if entry.current is None and entry is not self.default and (self.budget.limited or entry.state == "loading"):
            return self._lease_once_loaded(entry, selection, key)
        # Loaded (every request but the first ones of a version): the entry's own lease, with no
        # generator of this method's around it. Callers enter it at once (``async with``).
        return entry.acquire(key, selection.version)

    @contextlib.asynccontextmanager
    async def _lease_once_loaded(
        self, entry: ModelManager, selection: Selection, key: str | bytes | None
    ) -> AsyncIterator[ModelRuntime]:
        await self._load_on_demand(entry)
        async with entry.acquire(key, selection.version) as runtime:  # no await between the load and this
            yield runtime

    # ------------------------------------------------------------------ memory budget
    async def _load_on_demand(self, entry: ModelManager) -> None:
        loop = asyncio.get_running_loop()
        budget_s = self.settings.batching.request_timeout_s
        # The wait for the load counts against the request's own time budget, like its encodes.
        stages = REQUEST_STAGES.get()
        if stages is not None and stages.deadline is None:
            stages.deadline = loop.time() + budget_s
        deadline = stages.deadline if stages is not None and stages.deadline is not None else loop.time() + budget_s
        entry.last_used = time.monotonic()  # once loaded, it is the most recently used
        entry.waiting += 1  # not unloaded meanwhile, nor before this request holds it
        try:
            await self._wait_for_load(entry, deadline)
        finally:
            entry.waiting -= 1

    async def _wait_for_load(self, entry: ModelManager, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        waited_for_room = False
        saw_load = False  # whether this request waited for a load (its failure, not a skip, answers then)
        while entry.current is None:
            if not entry.started:
                if not self.budget.limited:  # every model loads at start; this one stopped (shutting down)
                    raise ClipError(ErrorCode.not_ready, entry.not_ready_message(), retry_after=1)
                quarantine = await entry.check_quarantine()  # may read a refused entry's alias
                if quarantine is not None:
                    if not saw_load:
                        self.metrics.model_load_skipped(entry.ref, "quarantined")
                    raise ClipError(ErrorCode.not_ready, quarantine.describe(entry.ref),
                                    retry_after=quarantine.left_s())  # fmt: skip
                if entry.started or entry.current is not None:
                    continue  # launched by another request during that read
                if self._room_for_load():
                    self._launch_on_request(entry)
                else:
                    waited_for_room = True
            elif entry.state == "failed":
                # The load failed and is retried in the background: no point holding the request.
                raise ClipError(ErrorCode.not_ready, entry.not_ready_message(), retry_after=1)
            saw_load = saw_load or entry.started
            left = deadline - loop.time()
            if left <= 0:
                raise ClipError(
                    ErrorCode.not_ready, self._not_loaded_message(entry, waited_for_room), retry_after=self._eta(entry)
                )
            await self._wait(min(left, WAKE_S))

    def _launch_on_request(self, entry: ModelManager) -> None:
        """Start loading ``entry`` for a request, unless ``max_loads_per_minute`` loads on request
        started within the last minute (503 with Retry-After then)."""
        limit = self.settings.max_loads_per_minute
        now = time.monotonic()
        while self._load_starts and now - self._load_starts[0] >= RATE_WINDOW_S:
            self._load_starts.popleft()
        if limit and len(self._load_starts) >= limit:
            self.metrics.model_load_skipped(entry.ref, "rate_limited")
            wait_s = RATE_WINDOW_S - (now - self._load_starts[0])
            raise ClipError(
                ErrorCode.not_ready,
                f"model {entry.ref} is not loaded, and {len(self._load_starts)} models were loaded on request in the "
                f"last minute (max_loads_per_minute={limit}); retry later",
                retry_after=wait_s,
            )
        self._load_starts.append(now)
        log.info("loading %s on request (%s)", entry.ref, self.budget.describe())
        entry.launch()

    def _room_for_load(self) -> bool:
        """Whether one more model may start loading (``MemoryBudget.room_for_load``)."""
        return self.budget.room_for_load(self.entries, self.default)

    def _enforce_budget(self) -> None:
        """While more is loaded than the budget holds (a load on request succeeded, a canary
        loaded), unload the least recently used idle model (never the default); none idle: again
        at the next change."""
        if not self.budget.limited or self._enforcing:
            return
        self._enforcing = True  # unload() reports a change itself
        try:
            while self.budget.over(self.entries):
                loaded = [e for e in self.entries if e.current is not None]
                idle = [e for e in loaded if e is not self.default and e.evictable]
                if not idle:
                    return
                # Among models equally idle (none used yet, as at start) the later entries of the set go first.
                victim = min(idle, key=lambda e: (e.last_used, -self.entries.index(e)))
                log.info("unloading %s, the least recently used idle model, to make room", victim.ref)
                self._track(victim.unload())  # lets go of its version now; stops it in the background
        finally:
            self._enforcing = False

    def _track(self, stopping: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(stopping)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _eta(self, entry: ModelManager) -> float:
        """Seconds until ``entry`` is likely loaded, from what its (or any) last load took."""
        took = entry.last_load_s or max((e.last_load_s or 0.0 for e in self.entries), default=0.0)
        started = entry.load_started
        left = took - (time.monotonic() - started) if started is not None else took
        return float(max(1, math.ceil(left)))

    def _not_loaded_message(self, entry: ModelManager, waited_for_room: bool) -> str:
        budget_s = self.settings.batching.request_timeout_s
        if waited_for_room and not entry.started:
            why = (
                f"every loaded model has requests in flight, or another model is loading beyond the budget "
                f"({self.budget.describe()})"
            )
            return f"model {entry.ref} is not loaded and {why}; retry"
        return f"model {entry.ref} is still loading (it was not in memory); not ready within {budget_s:g}s, retry"

    def _wake(self) -> None:
        self._enforce_budget()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self, timeout_s: float) -> None:
        """Until an entry changes (loaded, failed, unloaded, idle) or ``timeout_s`` passes."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)


def shown_name(name: str) -> str:
    """``name`` quoted for an error message, cut to ``SHOWN_NAME_CHARS`` with how much was left out."""
    if len(name) <= SHOWN_NAME_CHARS:
        return repr(name)
    return f"{name[:SHOWN_NAME_CHARS]!r}... ({len(name):,} characters)"


async def _learn_alias(entry: ModelManager) -> None:
    """Read once what the alias of an entry that loads on request names, so that a request pinning
    that version (``beta@v5`` for ``beta@production`` -> v5) finds the entry before its first load
    (``RoleTable.pins``). A store that cannot be read now is left to the entry's own load."""
    try:
        alias = (await asyncio.to_thread(entry.store.alias_entries, entry.name)).get(entry.selector)
    except Exception as exc:  # noqa: BLE001 - the first load reports it with its reason
        log.debug("the alias of %s could not be read at start: %s", entry.ref, exc)
        return
    if alias is not None and entry.table.known is None:
        entry.table.known = alias
