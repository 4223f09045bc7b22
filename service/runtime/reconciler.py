"""Drives one served entry toward what its store says: loads, hot swaps, canaries and shadows.

The first load resolves the entry's ref, loads that version and, for an alias, the canary and
shadow its entry names, and only then installs them together: a caller the alias routes to the
canary is never answered by the primary because the canary had not loaded yet (at start, or when
an entry unloaded under a memory budget loads again). Then, for ``name@alias`` refs, it polls the
alias every ``watch_interval_s``: a new primary is loaded beside the serving one and swapped in
(a version loaded already as canary or shadow is promoted as it is), and each side role is loaded,
replaced or ended. Every failed load follows one policy (``service.runtime.policy``): refused, or
tried again after a backoff; a first load on request that fails quarantines the entry instead of
retrying in the background. A canary or shadow that does not fit the memory budget, or a shadow of
another embedding width than its primary, is refused when the move is read (logged, counted in
``clip_side_loads_total``, shown in /models), and the primary answers meanwhile. The loop
outlives any error: it logs it (once a minute at most when it repeats), waits longer after each
failure in a row, and polls on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from model_store import ModelNotFound
from model_store.aliases import AliasEntry
from model_store.location import missing_directory
from service.runtime.model_runtime import ModelRuntime
from service.runtime.policy import LoadAttempts, Quarantine, backoff_s, failure_reason
from service.runtime.roles import CANARY, PRIMARY, ROLES, SHADOW, SIDES

if TYPE_CHECKING:
    from service.runtime.lifecycle import ModelManager

__all__ = ["Reconciler"]

log = logging.getLogger("service.lifecycle")

STORE_SETTING = "CLIP_STORE / --store"
LOG_REPEAT_S = 60.0  # the same error again is logged once a minute at most


class Reconciler:
    """The load-and-watch loop of one ``ModelManager`` (``run``, its task)."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.settings, self.store, self.metrics = manager.settings, manager.store, manager.metrics
        self.attempts = {role: LoadAttempts() for role in ROLES}  # one policy, per role
        # Why a side role's version is not loaded although the alias names it (over budget, another
        # width, refused, retrying): /models shows it; None once it loads or the role ends.
        self.side_problems: dict[str, str | None] = {CANARY: None, SHADOW: None}
        self.last_error: str | None = None
        # Why nothing serves yet, in words safe for unauthenticated callers (no paths): the 503s say it.
        self.not_ready_reason: str | None = None
        # Why the alias could not be read on the last poll (None: it could). The serving version
        # keeps serving meanwhile; /readyz and the clip_store_watch_ok gauge report it.
        self.watch_error: str | None = None
        self._watch_logged = 0.0
        self.alias: str | None = None  # set once we know the selector names an alias
        self._recheck = asyncio.Lock()  # one read of a refused entry's alias at a time

    @property
    def name(self) -> str:
        return self.manager.name

    def reset(self) -> None:
        """The entry was unloaded: the next launch starts from nothing (the alias may have moved)."""
        self.attempts = {role: LoadAttempts() for role in ROLES}
        self.side_problems = {CANARY: None, SHADOW: None}
        self.last_error = self.watch_error = None

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        manager = self.manager
        last_logged = 0.0
        while manager.table.primary is None:
            target: str | None = None  # the version tried, once the ref is resolved
            try:
                name, version = await asyncio.to_thread(self.store.resolve, manager.ref)
                target = version
                aliases = await asyncio.to_thread(self.store.aliases, name)
                entry = None
                if manager.selector in aliases:
                    entry = await asyncio.to_thread(self.store.alias_entry, name, manager.selector)
                    version = target = entry.version if entry is not None else version
                runtime = await manager.loader.load(name, version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep retrying: the store may be mounted or filled later
                self.metrics.model_load_failed(manager.ref, failure_reason(exc))
                error = await self._described(exc)
                if manager.loads_on_request:  # no retry in the background: quarantined until a request
                    self._quarantine(target, exc, error)
                    return
                # A new problem is an error; the same one again is repeated once a minute at most.
                if error != self.last_error or time.monotonic() - last_logged >= LOG_REPEAT_S:
                    log.error("cannot load %s from the store %r (%s); retrying every %.1fs", manager.ref,
                              self.settings.store, error, self.settings.watch_interval_s)  # fmt: skip
                    last_logged = time.monotonic()
                self.last_error = error
                self.not_ready_reason = self._not_ready_reason(exc)
                manager.changed()
                await asyncio.sleep(self.settings.watch_interval_s)
                continue
            self.alias = manager.selector if entry is not None or manager.selector in aliases else None
            # The canary and shadow load before the entry serves: every caller gets its version at once.
            sides: dict[str, ModelRuntime] = {}
            try:
                if entry is not None:
                    await self._load_sides(entry, runtime, sides)
            except asyncio.CancelledError:  # shut down meanwhile: these versions never served
                for loaded in {id(r): r for r in (runtime, *sides.values())}.values():
                    await loaded.stop()
                raise
            manager.table.follow(entry)
            manager.install(runtime, initial=True)
            for role, side in sides.items():
                self._set_side(role, side)
            if sides:
                manager.changed()  # the budget counts them: an idle model may have to make room
            manager.export_split()
            self.metrics.model_loaded(manager.ref)
            # The watcher below runs in this frame for good: it must not keep the first version
            # alive after a swap (that held ~190 MB per swap for ViT-sized models).
            del runtime, sides
        if self.alias is None:
            log.info("serving %s pinned (not an alias): no hot swap", manager.table.primary.ref)
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
                    log.exception("watching %s@%s failed (%d in a row); retrying in %.1fs", self.name, self.alias,
                                  failures, backoff_s(self.settings.watch_interval_s, failures))  # fmt: skip
                    last_logged = time.monotonic()

    async def poll_once(self) -> None:
        table = self.manager.table
        assert self.alias is not None and table.primary is not None
        try:
            entry = await asyncio.to_thread(self.store.alias_entry, self.name, self.alias)
        except Exception as exc:  # unreadable, half-written, missing: report, keep serving, retry
            self._watch_failed(f"{type(exc).__name__}: {exc}")
            return
        if self.watch_error is not None:
            log.info("alias %s@%s readable again", self.name, self.alias)
            self.watch_error = None
            self.metrics.set_store_watch(ok=True, model=self.manager.ref)
        if entry is None:
            return
        table.follow(entry)  # requests are routed by it from now on (a new weight applies at once)
        await self._follow_primary(entry.version)
        for role in SIDES:
            await self._follow_side(role, entry)
        self.manager.export_split()

    # ------------------------------------------------------------------ primary
    async def _follow_primary(self, target: str) -> None:
        manager, table = self.manager, self.manager.table
        serving = table.primary
        assert serving is not None
        if target == serving.version or self.attempts[PRIMARY].waits(target):
            return
        loaded = table.held(target)
        if loaded is not None:  # a canary promoted (or a shadow): it answers everything as it is
            log.info("alias %s@%s moved to %s, already loaded as its %s", self.name, self.alias, target, loaded.role)
            manager.install(loaded, initial=False)
            return
        log.info("alias %s@%s moved to %s; loading beside %s", self.name, self.alias, target, serving.ref)
        runtime = await self._load(PRIMARY, target)
        if runtime is not None:
            manager.install(runtime, initial=False)

    # ------------------------------------------------------------------ canary and shadow
    async def _follow_side(self, role: str, entry: AliasEntry) -> None:
        """Load, keep or drop the version ``role`` (canary or shadow) names; while it is not loaded
        the primary answers every request (a canary's share included) and nothing is shadowed."""
        table = self.manager.table
        primary = table.primary
        assert primary is not None
        want = self._wanted(role, entry, primary.version)
        have = table.sides[role]
        if have is not None and have.version == want:
            return
        if have is not None:  # its callers are routed by the new entry already: it has none left
            log.info("%s %s ended beside %s", role, have.ref, primary.ref)
            self.manager.release(table.end_side(role))
        if want is None:
            self.side_problems[role] = None
            return
        runtime = table.held(want) or await self._load_side(role, want, primary)
        if runtime is not None and table.primary is primary:
            self._set_side(role, runtime)
        elif runtime is not None and table.held(runtime.version) is None:  # the primary moved meanwhile
            self.manager.release([runtime])

    @staticmethod
    def _wanted(role: str, entry: AliasEntry | None, primary: str) -> str | None:
        part = None if entry is None else entry.canary if role == CANARY else entry.shadow
        want = part.version if part is not None else None
        return None if want == primary else want  # nothing runs beside the primary as itself

    async def _load_sides(self, entry: AliasEntry, primary: ModelRuntime, sides: dict[str, ModelRuntime]) -> None:
        """The canary and shadow ``entry`` names, loaded into ``sides`` for a first load of ``primary``."""
        for role in SIDES:
            want = self._wanted(role, entry, primary.version)
            if want is None:
                continue
            held = next((r for r in (primary, *sides.values()) if r.version == want), None)
            runtime = held or await self._load_side(role, want, primary, extra=[primary, *sides.values()])
            if runtime is not None:
                sides[role] = runtime

    def _set_side(self, role: str, runtime: ModelRuntime) -> None:
        table = self.manager.table
        self.manager.release(table.set_side(role, runtime))
        self.side_problems[role] = None
        if role == SHADOW:  # a new shadow period: its summary starts from nothing
            self.manager.shadows.forget(runtime.version)
        assert table.primary is not None
        log.info("%s %s loaded beside %s", role, runtime.ref, table.primary.ref)

    async def _load_side(
        self, role: str, version: str, primary: ModelRuntime, extra: list[ModelRuntime] | None = None
    ) -> ModelRuntime | None:
        """``version`` loaded for ``role`` beside ``primary``, or None: refused (over the budget,
        another width, failed) or backing off."""
        if self.attempts[role].waits(version):
            return None
        over = self.manager.over_budget(1, 0, extra or [])
        if over is not None:
            self._refuse_side(role, version, "over_budget", over)
            return None
        log.info("alias %s@%s has a %s %s; loading it beside %s", self.name, self.alias, role, version, primary.ref)
        runtime = await self._load(role, version)
        if runtime is None:
            return None
        problem = None
        if role == SHADOW and runtime.bundle.embed_dim != primary.bundle.embed_dim:
            problem = ("width", f"its embeddings are {runtime.bundle.embed_dim} wide, the primary's "
                       f"{primary.bundle.embed_dim}: no comparison could be made")  # fmt: skip
        elif (over := self.manager.over_budget(0, runtime.weight_bytes, extra or [])) is not None:
            problem = ("over_budget", over)
        if problem is not None:
            self.manager.release([runtime])  # held by no role: stopped at once
            self._refuse_side(role, version, *problem)
            return None
        self.metrics.side_load(role, "ok", model=self.manager.ref)
        return runtime

    def _refuse_side(self, role: str, version: str, result: str, why: str) -> None:
        self.attempts[role].refused = version  # until the alias names another version
        self.side_problems[role] = f"{version} refused: {why}"
        self.metrics.side_load(role, result, model=self.manager.ref)
        primary = self.manager.table.primary
        log.error("refusing %s %s@%s (%s); %s answers every request", role, self.name, version, why,
                  primary.ref if primary is not None else "the primary")  # fmt: skip

    # ------------------------------------------------------------------ one load, one policy
    async def _load(self, role: str, version: str) -> ModelRuntime | None:
        """``version`` loaded for ``role`` (hot swap or side load), or None after a failure the
        policy refuses or backs off (logged and counted); the serving versions answer meanwhile."""
        manager = self.manager
        attempts = attempts_before = self.attempts[role]
        try:
            runtime = await manager.loader.load(self.name, version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if attempts is not self.attempts[role]:  # unloaded meanwhile: nothing to record
                return None
            delay = attempts.failed(version, exc, self.settings.watch_interval_s)
            result = "refused" if delay is None else "retrying"
            serving = manager.table.primary.ref if manager.table.primary is not None else "nothing"
            if role == PRIMARY:
                self.metrics.model_swap(result, model=manager.ref)
            else:
                self.metrics.side_load(role, result, model=manager.ref)
                self.side_problems[role] = f"{version} {result}: {type(exc).__name__}"
            what = f"{self.name}@{version}" if role == PRIMARY else f"{role} {self.name}@{version}"
            if delay is None:
                log.error("refusing %s (%s: %s); %s keeps serving", what, type(exc).__name__, exc, serving)
            else:
                log.warning("cannot load %s yet (%s: %s); %s keeps serving, retrying in %.1fs", what,
                            type(exc).__name__, exc, serving, delay)  # fmt: skip
            return None
        del attempts_before
        self.attempts[role].loaded()
        return runtime

    def _watch_failed(self, error: str) -> None:
        # A new error is logged at once; the same one again once a minute at most.
        if error != self.watch_error or time.monotonic() - self._watch_logged >= LOG_REPEAT_S:
            primary = self.manager.table.primary
            log.warning("cannot read alias %s@%s (%s); %s keeps serving, retrying every %.1fs", self.name,
                        self.alias, error, primary.ref if primary else "nothing",
                        self.settings.watch_interval_s)  # fmt: skip
            self._watch_logged = time.monotonic()
        self.watch_error = error
        self.metrics.set_store_watch(ok=False, model=self.manager.ref)

    # ------------------------------------------------------------------ quarantine
    def _quarantine(self, version: str | None, exc: BaseException, error: str) -> None:
        """A first load on request failed: the launch ends (the entry holds nothing) and no request
        tries again before the quarantine ends (the policy of ``LoadAttempts``)."""
        manager = self.manager
        reason = self.not_ready_reason = self._not_ready_reason(exc)
        quarantine = Quarantine.after(manager.table.quarantine, version, exc, reason, self.settings.watch_interval_s)
        manager.set_quarantine(quarantine)
        self.last_error = None  # the entry is not retrying in the background: its state says quarantined
        manager.launch_ended()  # this launch ends here (the caller returns): the entry holds no slot
        if quarantine.refused:
            log.error("cannot load %s on request (%s); %s@%s is refused until the alias names another version",
                      manager.ref, error, self.name, version)  # fmt: skip
        else:
            log.error("cannot load %s on request (%s); quarantined for %.1fs (failure %d in a row)",
                      manager.ref, error, quarantine.left_s(), quarantine.failures)  # fmt: skip
        manager.changed()

    async def check_quarantine(self) -> Quarantine | None:
        """The quarantine a request for this entry must respect now (it answers 503), or None when
        the request may load it: no quarantine, its backoff is over, or (refused) its alias names
        another version now. A refused entry's alias is read at most once per watch interval,
        whatever the number of requests."""
        manager = self.manager
        quarantine = manager.table.quarantine
        if quarantine is None or time.monotonic() < quarantine.until:
            return quarantine
        if not quarantine.refused:
            return None  # kept until a load succeeds: the next failure doubles the backoff
        async with self._recheck:
            quarantine = manager.table.quarantine
            if quarantine is None or time.monotonic() < quarantine.until:
                return quarantine  # read meanwhile by another request
            version: str | None
            try:
                _, version = await asyncio.to_thread(self.store.resolve, manager.ref)
            except Exception as exc:  # the store cannot be read now: the version stays refused
                log.warning("cannot read %s to see whether it moved (%s: %s)", manager.ref, type(exc).__name__, exc)
                version = quarantine.version
            if version == quarantine.version and manager.table.quarantine is quarantine:
                renewed = dataclasses.replace(quarantine, until=time.monotonic() + self.settings.watch_interval_s)
                manager.set_quarantine(renewed)
                return renewed
            if manager.table.quarantine is quarantine:
                log.info("%s now names %s@%s, not the refused %s: the next request loads it", manager.ref, self.name,
                         version, quarantine.version)  # fmt: skip
                manager.set_quarantine(None)
                manager.changed()
            return manager.table.quarantine

    # ------------------------------------------------------------------ diagnostics
    async def _described(self, exc: BaseException) -> str:
        error = f"{type(exc).__name__}: {exc}"
        if missing_directory(self.settings.store):
            return f"the model store directory {self.settings.store!r} ({STORE_SETTING}) does not exist"
        if isinstance(exc, ModelNotFound):
            error += f"; {await asyncio.to_thread(self._store_contents)}"
        return error

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
        if missing_directory(self.settings.store):
            return f"the model store set by {STORE_SETTING} does not exist"
        if isinstance(exc, ModelNotFound):  # names models and versions only
            return f"{exc} in the model store set by {STORE_SETTING}"
        return f"loading failed ({type(exc).__name__})"
