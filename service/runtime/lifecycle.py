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
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal

from clipcore.backends.base import ServingTowers
from clipcore.errors import ClipError, ErrorCode
from clipcore.models.bundle import ModelBundle
from model_store import ChecksumMismatch, ModelNotFound, ModelStore, parse_ref
from model_store.location import missing_directory
from service.config import Settings
from service.runtime.assembly import ModelRuntime, build_runtime, resolve_device, serving_towers, warm_up
from service.runtime.metrics import ServiceMetrics

__all__ = ["ModelManager", "ModelRuntime", "ModelState"]

log = logging.getLogger("service.lifecycle")

STORE_SETTING = "CLIP_STORE / --store"
# Load failures that may pass: the version is tried again later rather than refused.
TRANSIENT_LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, MemoryError, ModelNotFound)
MAX_BACKOFF_S = 300.0
LOG_REPEAT_S = 60.0  # the same error again is logged once a minute at most
ModelState = Literal["ready", "loading", "failed", "unloaded"]


def may_pass(exc: BaseException) -> bool:
    """Whether a version that failed to load may load later as it is: its files could not be read
    (a flaky mount), were not there yet, or memory ran out. Wrong checksums, an invalid manifest, a
    failed warm-up or parity gate stay true of an immutable version: it is refused instead."""
    if isinstance(exc, ChecksumMismatch):
        return all(why == "missing" or why.startswith("unreadable") for why in exc.problems.values())
    return isinstance(exc, TRANSIENT_LOAD_ERRORS)


def release_freed_memory() -> None:
    """Give the pages of freed memory back to the system. glibc's allocator keeps what an
    unloaded model freed for its own reuse: without this the process's RSS stays as high as if the
    model were still loaded (no effect, and no error, with another C library)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
        self.device = resolve_device(settings.device)
        self.current: ModelRuntime | None = None
        self.alias: str | None = None  # set once we know the selector names an alias
        self.last_error: str | None = None
        # Why nothing serves yet, in words safe for unauthenticated callers (no paths): the 503s say it.
        self.not_ready_reason: str | None = None
        # Why the alias could not be read on the last poll (None: it could). The serving version
        # keeps serving meanwhile; /readyz and the store_watch_ok gauge report it.
        self.watch_error: str | None = None
        self._watch_logged = 0.0
        self._refused: str | None = None
        # A target whose load failed for a reason that may pass: tried again at _retry_at.
        self._retry: tuple[str, int] | None = None  # (version, failures in a row)
        self._retry_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._retiring: dict[asyncio.Task[None], ModelRuntime] = {}
        metrics.set_store_watch(ok=True, model=self.ref)

    async def start(self) -> None:
        self.launch()

    def launch(self) -> None:
        """Start loading (and then watching) unless already started; returns at once."""
        if not self.started:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"model-manager {self.ref}")

    @property
    def started(self) -> bool:
        """Whether this entry holds (or is loading) a version: what a memory budget counts."""
        return self.current is not None or (self._task is not None and not self._task.done())

    @property
    def state(self) -> ModelState:
        """``ready`` (serving), ``loading``, ``failed`` (no version loaded; retrying, the log says
        why) or ``unloaded`` (not loaded: past the memory budget, until a request names it)."""
        if self.current is not None:
            return "ready"
        if self._task is None or self._task.done():
            return "unloaded"
        return "failed" if self.last_error is not None else "loading"

    @property
    def evictable(self) -> bool:
        """No request in flight on any of its versions and no load in progress: unloading it now
        fails nothing."""
        if self._loading:
            return False
        runtimes = [*self._retiring.values(), *([self.current] if self.current is not None else [])]
        return all(runtime.active == 0 for runtime in runtimes)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def unload(self) -> Coroutine[Any, Any, None]:
        """Stop watching and stop the serving version, to make room under a memory budget; the
        next ``launch`` loads the ref again (the alias may have moved meanwhile). The caller checks
        ``evictable`` first. The entry lets go of its version now, before this returns, so no
        request can acquire it after the check; await the returned coroutine to stop the version
        (its batchers and model thread)."""
        task, self._task = self._task, None
        current, self.current = self.current, None
        self.last_error = self.watch_error = None
        self._refused, self._retry = None, None
        self.not_ready_reason = "unloaded to make room for other models; the next request loads it"
        self.metrics.clear_model(self.ref)
        self.metrics.set_store_watch(ok=True, model=self.ref)
        if current is not None:
            self.metrics.model_unloaded(self.ref)
        self._changed()
        return self._stop_unloaded(task, current)

    async def _stop_unloaded(self, task: asyncio.Task[None] | None, runtime: ModelRuntime | None) -> None:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if runtime is not None:
            version = runtime.ref
            await runtime.stop()
            del runtime  # the last reference: the version's weights are freed here
            await asyncio.to_thread(release_freed_memory)
            log.info("unloaded %s (%s) to make room for other models", version, self.ref)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # a watcher that died must not stop the rest of the shutdown
                log.exception("the model watcher had failed")
        # Versions still draining are stopped now: uvicorn has already let the requests finish,
        # and a runtime left running keeps its model thread (the interpreter waits for it at exit).
        retiring = list(self._retiring.items())
        for task, _ in retiring:
            task.cancel()
        await asyncio.gather(*(task for task, _ in retiring), return_exceptions=True)
        current, self.current = self.current, None
        for runtime in [*(r for _, r in retiring), *([current] if current is not None else [])]:
            try:
                await runtime.stop()
            except Exception:
                log.exception("stopping %s failed", runtime.ref)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[ModelRuntime]:
        """The serving runtime, held for the whole request (no await between read and count)."""
        runtime = self.current
        if runtime is None:
            raise ClipError(ErrorCode.not_ready, self.not_ready_message(), retry_after=1)
        runtime.active += 1
        runtime.idle.clear()
        self.last_used = time.monotonic()
        try:
            yield runtime
        finally:
            runtime.active -= 1
            self.last_used = time.monotonic()
            if runtime.active == 0:
                runtime.idle.set()
                self._changed()  # an idle model may now be unloaded for one a request waits for

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

    # ------------------------------------------------------------------ loading
    async def _run(self) -> None:
        last_logged = 0.0
        while self.current is None:
            try:
                name, version = await asyncio.to_thread(self.store.resolve, self.ref)
                aliases = await asyncio.to_thread(self.store.aliases, name)
                runtime = await self._load(name, version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep retrying: the store may be mounted or filled later
                error = f"{type(exc).__name__}: {exc}"
                if self.store_missing():
                    error = f"the model store directory {self.settings.store!r} ({STORE_SETTING}) does not exist"
                elif isinstance(exc, ModelNotFound):
                    error += f"; {await asyncio.to_thread(self._store_contents)}"
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
            target = await asyncio.to_thread(self.store.alias_target, self.name, self.alias)
        except Exception as exc:  # unreadable, half-written, missing: report, keep serving, retry
            self._watch_failed(f"{type(exc).__name__}: {exc}")
            return
        if self.watch_error is not None:
            log.info("alias %s@%s readable again", self.name, self.alias)
            self.watch_error = None
            self.metrics.set_store_watch(ok=True, model=self.ref)
        if target is None or target == self.current.bundle.version or target == self._refused:
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
            towers, backend = serving_towers(bundle, self.settings, self.device)
            return bundle, towers, backend

        bundle, towers, backend = await asyncio.to_thread(load_and_warm)
        runtime = build_runtime(bundle, self.settings, self.metrics, towers, backend, model=self.ref)
        if runtime.auto is not None:
            decision = runtime.auto
            self.metrics.backend_auto(decision.outcome, decision.margin, decision.spread)
        await runtime.start()
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

    def _install(self, runtime: ModelRuntime, initial: bool) -> None:
        old, self.current = self.current, runtime  # one assignment: requests see old or new
        self.last_error = None
        self._refused = None
        self._retry = None
        bundle = runtime.bundle
        self.metrics.set_serving_model(bundle.name, bundle.version, sorted(runtime.text_batchers), model=self.ref)
        if not initial:
            self.metrics.model_swap("ok", model=self.ref)
        self._changed()
        if old is not None:
            log.info("swapped %s -> %s; draining the old version", old.ref, runtime.ref)
            task = asyncio.get_running_loop().create_task(self._retire(old))
            self._retiring[task] = old
            task.add_done_callback(lambda done: self._retiring.pop(done, None))

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
