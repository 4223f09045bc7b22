"""Alias table (``<root>/<name>/aliases.json``): alias -> version, with per-alias history.

The table is pure data plus the promote/rollback rules; the store is responsible
for reading it, holding the model lock and replacing the file atomically. Keeping
the history lets an operator undo a bad promotion without remembering what was
live before, and tells garbage collection which versions must survive.
"""

from __future__ import annotations

import builtins
import json

from pydantic import BaseModel, ConfigDict, Field

from model_store.errors import StoreError

ALIASES_FILE = "aliases.json"
# Older entries are dropped so history does not pin every version forever.
HISTORY_LIMIT = 20


class AliasTable(BaseModel):
    """Current alias targets and, per alias, the previous targets (oldest first)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    aliases: dict[str, str] = Field(default_factory=dict)
    history: dict[str, list[str]] = Field(default_factory=dict)

    def set(self, alias: str, version: str) -> str | None:
        """Point ``alias`` at ``version``; return the previous target.

        Re-promoting the current target is a no-op so history is not padded with
        duplicates that a rollback would then have to step through.
        """
        previous = self.aliases.get(alias)
        if previous == version:
            return previous
        if previous is not None:
            past = self.history.setdefault(alias, [])
            past.append(previous)
            del past[:-HISTORY_LIMIT]
        self.aliases[alias] = version
        return previous

    def previous(self, alias: str) -> str | None:
        """Version a rollback of ``alias`` would return to, if any."""
        past = self.history.get(alias)
        return past[-1] if past else None

    def rollback(self, alias: str) -> str:
        """Return ``alias`` to its previous target, dropping the current one; return the new target."""
        past = self.history.get(alias)
        if not past:
            raise StoreError(f"alias {alias!r} has no previous version to roll back to")
        target = past.pop()
        if not past:
            del self.history[alias]
        self.aliases[alias] = target
        return target

    def referenced(self) -> builtins.set[str]:  # this class has a method named `set`
        """Every version an alias points to now or may be rolled back to."""
        refs = set(self.aliases.values())
        for past in self.history.values():
            refs.update(past)
        return refs

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, indent 2, trailing newline)."""
        return json.dumps(self.model_dump(), sort_keys=True, indent=2) + "\n"
