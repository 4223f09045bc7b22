"""The served set: every model ref of ``CLIP_MODEL``, each served by a ``ModelManager`` of its own.

``CLIP_MODEL=default@production,default@v5,other`` serves three entries. Each is loaded, warmed,
watched and hot-swapped on its own (a version one of them refuses touches none of the others),
and each loaded version has its own batchers, model thread and cache keys (``name@version``).
The first entry is the default: it answers requests that name no model, and ``/readyz`` is ready
once it serves.

A request's ``model`` picks the entry (``resolve``):

* ``name``: the first entry of that model name;
* ``name@selector``: the entry configured with that selector (``name@production`` for the entry
  ``name@production``, or ``name`` which means the same), else an entry of that name now serving
  version ``selector``;
* anything else is ``unknown_model``, whose message lists the set.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from clipcore.errors import ClipError, ErrorCode
from model_store import ModelStore
from service.config import Settings
from service.runtime.assembly import ModelRuntime
from service.runtime.lifecycle import ModelManager, ModelState
from service.runtime.metrics import ServiceMetrics

__all__ = ["EntryStatus", "ServedModels"]

log = logging.getLogger("service.served")


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


class ServedModels:
    def __init__(self, settings: Settings, store: ModelStore, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.entries = [ModelManager(settings, store, metrics, ref) for ref in settings.served_refs()]

    @property
    def default(self) -> ModelManager:
        return self.entries[0]

    async def start(self) -> None:
        for entry in self.entries:
            entry.launch()

    async def close(self) -> None:
        # Each entry closes even if one before it fails.
        for entry in self.entries:
            try:
                await entry.close()
            except Exception:
                log.exception("closing %s failed", entry.ref)

    # ------------------------------------------------------------------ routing
    def resolve(self, requested: str | None) -> ModelManager:
        """The entry a request's ``model`` names (the default entry for None); unknown_model else."""
        if requested is None:
            return self.default
        name, at, selector = requested.partition("@")
        if not at:
            found = next((e for e in self.entries if e.name == name), None)
        else:
            found = next((e for e in self.entries if (e.name, e.selector) == (name, selector)), None)
            if found is None:  # a version: the entry that serves it now
                found = next(
                    (
                        e
                        for e in self.entries
                        if e.name == name and e.current is not None and e.current.bundle.version == selector
                    ),
                    None,
                )
        if found is None:
            raise ClipError(
                ErrorCode.unknown_model,
                f"model {requested!r} is not served here; this server serves {self.describe()}",
                "model",
            )
        return found

    def describe(self) -> str:
        """The set in words: ``default@production (default@v6), other@v3, big (not loaded)``."""
        parts = []
        for entry in self.entries:
            current = entry.current
            if current is None:
                parts.append(f"{entry.ref} (not loaded)")
            elif current.ref != entry.ref:
                parts.append(f"{entry.ref} ({current.ref})")
            else:
                parts.append(entry.ref)
        return ", ".join(parts)

    def status(self) -> list[EntryStatus]:
        out = []
        for entry in self.entries:
            current = entry.current
            out.append(
                EntryStatus(
                    ref=entry.ref,
                    name=entry.name,
                    serving=current.ref if current is not None else None,
                    state=entry.state,
                    default=entry is self.default,
                    store_ok=entry.watch_error is None,
                    created_at=current.bundle.manifest.created_at if current is not None else None,
                )
            )
        return out

    def acquire(self, requested: str | None) -> contextlib.AbstractAsyncContextManager[ModelRuntime]:
        """The runtime of the entry ``requested`` names, held for the whole request."""
        return self.acquire_entry(self.resolve(requested))

    @contextlib.asynccontextmanager
    async def acquire_entry(self, entry: ModelManager) -> AsyncIterator[ModelRuntime]:
        """``acquire`` for an entry already resolved."""
        async with entry.acquire() as runtime:
            yield runtime
