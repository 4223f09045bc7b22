"""The memory budget of the served set: loaded versions (primary, canary, shadow) and their bytes.

``max_loaded_models`` bounds the versions loaded at once, every role counted (a shadow of the
canary's version once); ``max_loaded_bytes`` the bytes of their weights (``ModelRuntime.weight_bytes``,
measured at load). 0 is no bound. The served set (``service.runtime.served``) asks it whether a
load on request may start (``room_for_load``) and, after each change, which idle model to unload
(``over``); the reconciler asks it whether a canary or shadow fits (``side_refusal``) before the
move is applied: one that would not fit even with every other model but the default unloaded is
refused, logged and shown in /models, instead of failing at serve time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.config import Settings
from service.runtime.model_runtime import ModelRuntime

if TYPE_CHECKING:
    from service.runtime.lifecycle import ModelManager

__all__ = ["MemoryBudget"]

MiB = 1024 * 1024


def versions_of(entry: ModelManager) -> int:
    return len(entry.table.loaded())


def bytes_of(entry: ModelManager) -> int:
    return sum(runtime.weight_bytes for runtime in entry.table.loaded())


class MemoryBudget:
    def __init__(self, settings: Settings) -> None:
        self.versions = settings.max_loaded_models
        self.bytes = settings.max_loaded_bytes

    @property
    def limited(self) -> bool:
        return self.versions > 0 or self.bytes > 0

    def at_start(self, entries: int) -> int:
        """How many entries (the first ones) load at start: as many as the budget has versions, or
        the default alone under a bound on bytes only (no version's size is known before its load)."""
        if self.versions:
            return min(self.versions, entries)
        return 1 if self.bytes else entries

    def describe(self) -> str:
        parts = [f"max_loaded_models={self.versions}"] if self.versions else []
        if self.bytes:
            parts.append(f"max_loaded_bytes={self.bytes}")
        return ", ".join(parts)

    def over(self, entries: list[ModelManager]) -> bool:
        """Whether the loaded versions exceed the budget (an idle model is then unloaded)."""
        versions = sum(versions_of(e) for e in entries)
        size = sum(bytes_of(e) for e in entries)
        return bool((self.versions and versions > self.versions) or (self.bytes and size > self.bytes))

    def room_for_load(self, entries: list[ModelManager], default: ModelManager) -> bool:
        """Whether one more model may start loading: at once while it fits beside what is loaded
        and loading (each load counted as one version, its size unknown); one beyond while no
        other load runs and an idle model is there to be unloaded once it has loaded; else False."""
        loading = [e for e in entries if e.started and e.current is None]
        versions = sum(versions_of(e) for e in entries) + len(loading) + 1
        size = sum(bytes_of(e) for e in entries)
        if not ((self.versions and versions > self.versions) or (self.bytes and size >= self.bytes)):
            return True
        if loading:
            return False  # a load beyond the budget runs, or its model waits for another to be idle
        return any(e is not default and e.current is not None and e.evictable for e in entries)

    def side_refusal(
        self, entry: ModelManager, default: ModelManager, versions: int, size: int, extra: list[ModelRuntime]
    ) -> str | None:
        """Why ``versions`` more versions of ``size`` bytes for ``entry`` (beside ``extra``, loaded for
        it and not in its table yet) would not fit, even with every model but the default and this
        one unloaded; None when they fit."""
        fixed = [entry] if entry is default else [entry, default]
        held = {id(r): r for e in fixed for r in e.table.loaded()} | {id(r): r for r in extra}
        count = len(held) + versions
        total = sum(r.weight_bytes for r in held.values()) + size
        if self.versions and count > self.versions:
            return f"{count} versions would be loaded with the default model's, max_loaded_models={self.versions}"
        if self.bytes and total > self.bytes:
            return (
                f"{total / MiB:.0f} MiB of weights would be loaded with the default model's, "
                f"max_loaded_bytes={self.bytes / MiB:.0f} MiB"
            )
        return None
