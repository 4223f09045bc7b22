"""Alias table (``<root>/<name>/aliases.json``, schema 2): where each alias points, and its log.

An alias points at one version (its primary), optionally with a canary taking a weighted share
of the requests and a shadow that re-runs a sample of them; readers (the service) need only
``aliases[alias]``, one small object, from the one file they poll. Writers also keep, per alias,
the versions a rollback steps back through (``previous``) and a log of every move (``history``):
when, from, to, the split, who, why, and what the evaluation gate said.

The table is pure data plus the move rules; the store reads it, holds the model lock, runs the
gate and replaces the file atomically. Schema 1 tables (``aliases`` as alias -> version,
``history`` as the list of previous versions) are migrated on read and written back as schema 2.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from model_store.errors import PreconditionFailed, StoreError
from model_store.gate import GateVerdict

ALIASES_FILE = "aliases.json"
SCHEMA_VERSION = 2
# Rollback depth: older targets are dropped so history does not pin every version forever.
HISTORY_LIMIT = 20
# Events kept per alias: the whole table is read on every poll, so the log cannot grow forever.
LOG_LIMIT = 100
MIGRATED_REASON = "recorded before schema 2: time, actor and gate unknown"
# What ``--expect`` names for an alias that points nowhere (never a valid version name).
NOWHERE = "-"

Action = Literal[
    "promote",  # the primary moves (by promote, or publish with aliases)
    "rollback",  # the primary returns to the previous target
    "canary-start",  # a canary takes a share (or replaces another canary)
    "canary-weight",  # the running canary's share changes
    "canary-promote",  # the canary ends at 100 %: it becomes the primary
    "canary-rollback",  # the canary ends at 0 %: the primary answers everything again
    "shadow-start",  # a shadow is set (or its version or fraction changes)
    "shadow-end",  # the shadow is removed
]
# Moves that take a version out of service: a rollback right after one is refused unless expected.
ROLLBACKS: frozenset[str] = frozenset({"rollback", "canary-rollback"})


class Canary(BaseModel):
    """A version answering ``weight`` percent of the alias' requests (by caller key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    weight: float = Field(gt=0, lt=100)


class Shadow(BaseModel):
    """A version re-running ``fraction`` of the alias' requests after they were answered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    fraction: float = Field(gt=0, le=1)


class AliasEntry(BaseModel):
    """What one alias serves: everything the service needs to route a request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str  # the primary: answers every request the canary does not take
    canary: Canary | None = None
    shadow: Shadow | None = None

    def weights(self) -> dict[str, float]:
        """Version -> percent of requests answered (the primary alone: 100)."""
        if self.canary is None:
            return {self.version: 100.0}
        return {self.version: 100.0 - self.canary.weight, self.canary.version: self.canary.weight}

    def versions(self) -> builtins.set[str]:
        """Every version this entry may load."""
        out = {self.version}
        out.update(part.version for part in (self.canary, self.shadow) if part is not None)
        return out


class AliasEvent(BaseModel):
    """One move of an alias, as the history keeps it."""

    # Fields added later are ignored by readers that do not know them: the log is informative.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    at: str | None  # UTC ISO-8601; None only for moves migrated from schema 1
    action: Action
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    weights: dict[str, float] | None = None  # the split after a canary move
    fraction: float | None = None  # the shadow's, after a shadow move
    reason: str | None = None
    forced: bool = False
    actor: str | None = None  # user@host when known
    gate: GateVerdict | None = None


@dataclass(frozen=True)
class Stamp:
    """Who moves an alias, when, why, and what the gate said: copied into the event."""

    at: str | None
    actor: str | None = None
    reason: str | None = None
    forced: bool = False
    gate: GateVerdict | None = None


def _unless_shadowing(shadow: Shadow | None, primary: str) -> Shadow | None:
    """The shadow kept when ``primary`` becomes the primary: none if it shadowed that very version."""
    return None if shadow is not None and shadow.version == primary else shadow


def _migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 1 table as schema 2: targets become entries, each previous-versions list becomes
    the rollback stack, and the moves it implies are logged without a time."""
    aliases = {alias: {"version": version} for alias, version in data.get("aliases", {}).items()}
    previous = {alias: list(past) for alias, past in data.get("history", {}).items() if past}
    history: dict[str, list[dict[str, Any]]] = {}
    for alias, past in previous.items():
        chain = [*past, data.get("aliases", {}).get(alias)]
        history[alias] = [
            {"at": None, "action": "promote", "from": a, "to": b, "reason": MIGRATED_REASON}
            for a, b in zip(chain, chain[1:], strict=False)
        ]
    return {"schema_version": SCHEMA_VERSION, "aliases": aliases, "previous": previous, "history": history}


class AliasTable(BaseModel):
    """Alias entries, rollback stacks (oldest first) and move logs (oldest first)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2] = 2
    aliases: dict[str, AliasEntry] = Field(default_factory=dict)
    previous: dict[str, list[str]] = Field(default_factory=dict)
    history: dict[str, list[AliasEvent]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schema_version", 1) == 1:
            return _migrate_v1(data)
        return data

    # ------------------------------------------------------------------ reading
    def target(self, alias: str) -> str | None:
        """The primary version of ``alias``."""
        entry = self.aliases.get(alias)
        return entry.version if entry else None

    def targets(self) -> dict[str, str]:
        return {alias: entry.version for alias, entry in self.aliases.items()}

    def rollback_target(self, alias: str) -> str | None:
        """Version ``rollback`` would leave answering everything: the primary while a canary runs
        (the canary ends at 0 %), else the previous target."""
        entry = self.aliases.get(alias)
        if entry is not None and entry.canary is not None:
            return entry.version
        past = self.previous.get(alias)
        return past[-1] if past else None

    def referenced(self) -> builtins.set[str]:  # this class has a method named `set`
        """Every version an alias serves, shadows, or may be rolled back to."""
        refs: set[str] = set()
        for entry in self.aliases.values():
            refs.update(entry.versions())
        for past in self.previous.values():
            refs.update(past)
        return refs

    def rollback_source(self, alias: str) -> str | None:
        """Version ``rollback`` would take out of service: the canary while one runs, else the
        primary (None when there is nothing to roll back)."""
        entry = self.aliases.get(alias)
        if entry is not None and entry.canary is not None:
            return entry.canary.version
        return entry.version if entry is not None and self.previous.get(alias) else None

    def last_move(self, alias: str) -> AliasEvent | None:
        """The alias' last move of what answers its requests (shadow moves left out)."""
        for event in reversed(self.history.get(alias, [])):
            if not event.action.startswith("shadow-"):
                return event
        return None

    def describe_move(self, alias: str) -> str:
        """``; last move: rollback v7 -> v6 by ana@host at 2025-...Z`` (empty without history)."""
        event = self.last_move(alias)
        if event is None:
            return ""
        who = f" by {event.actor}" if event.actor else ""
        when = f" at {event.at}" if event.at else ""
        return f"; last move: {event.action} {event.from_ or '-'} -> {event.to or '-'}{who}{when}"

    # ------------------------------------------------------------------ checks (raise before any gate runs)
    def check_expect(self, alias: str, expect: str | None) -> None:
        """Refuse unless ``alias``' primary is ``expect`` (``NOWHERE``: the alias points nowhere)."""
        if expect is None:
            return
        current = self.target(alias)
        if (current or NOWHERE) != expect:
            where = f"points at {current}" if current else "points nowhere"
            wanted = "nowhere" if expect == NOWHERE else expect
            raise PreconditionFailed(
                f"{alias} {where}, not {wanted} as expected: nothing moved{self.describe_move(alias)}"
            )

    def check_rollback(self, alias: str, expect: str | None) -> str:
        """The version a rollback of ``alias`` takes out of service, if it may: ``expect`` names it,
        or (without ``expect``) the alias' last move was not already a rollback: two operators
        rolling back the same incident roll back once. Raises otherwise."""
        source = self.rollback_source(alias)
        if source is None:
            raise StoreError(f"alias {alias!r} has no previous version to roll back to")
        if expect is not None and expect != source:
            raise PreconditionFailed(
                f"rollback of {alias} expected to take {expect} out of service, but {alias} serves "
                f"{self.serving(alias)}: nothing rolled back{self.describe_move(alias)}"
            )
        last = self.last_move(alias)
        if expect is None and last is not None and last.action in ROLLBACKS:
            raise PreconditionFailed(
                f"{alias} was already rolled back ({last.action} {last.from_} -> {last.to}"
                f"{f' by {last.actor}' if last.actor else ''}{f' at {last.at}' if last.at else ''}): nothing "
                f"rolled back; to roll back {source} as well: rollback --expect {source}"
            )
        return source

    def serving(self, alias: str) -> str:
        """``v6``, or ``v6 with a canary of v7``: what answers the alias' requests, for messages."""
        entry = self.aliases.get(alias)
        if entry is None:
            return "nothing"
        return entry.version + (f" with a canary of {entry.canary.version}" if entry.canary else "")

    def check_promote(self, alias: str, version: str) -> None:
        entry = self.aliases.get(alias)
        if entry is not None and entry.canary is not None and entry.canary.version != version:
            raise StoreError(
                f"a canary of {entry.canary.version} runs on {alias} ({entry.canary.weight:g} %): promote "
                f"{entry.canary.version} to end it at 100 %, or roll back to end it at 0 %, before promoting {version}"
            )

    def check_canary(self, alias: str, version: str, weight: float, replace: bool = False) -> None:
        if not 0 < weight < 100:
            raise StoreError(f"a canary's weight is a percentage strictly between 0 and 100, got {weight:g}")
        entry = self.aliases.get(alias)
        if entry is None:
            raise StoreError(f"alias {alias!r} points nowhere yet: promote a version before starting a canary")
        if entry.version == version:
            raise StoreError(f"{version} is already the primary of {alias}")
        running = entry.canary
        if running is not None and running.version != version and not replace:
            started = next((e for e in reversed(self.history.get(alias, [])) if e.to == running.version), None)
            by = f" by {started.actor}" if started is not None and started.actor else ""
            at = f" at {started.at}" if started is not None and started.at else ""
            raise PreconditionFailed(
                f"a canary of {running.version} already runs on {alias} ({running.weight:g} %, started{by}{at}): "
                f"nothing moved; end it first (promote or rollback), or replace it with {version} (--replace)"
            )

    # ------------------------------------------------------------------ moves
    def _log(self, alias: str, stamp: Stamp, action: Action, **fields: Any) -> AliasEvent:
        event = AliasEvent(
            at=stamp.at, action=action, reason=stamp.reason, forced=stamp.forced, actor=stamp.actor,
            gate=stamp.gate, **fields,
        )  # fmt: skip
        log = self.history.setdefault(alias, [])
        log.append(event)
        del log[:-LOG_LIMIT]
        return event

    def _push_previous(self, alias: str, version: str) -> None:
        past = self.previous.setdefault(alias, [])
        past.append(version)
        del past[:-HISTORY_LIMIT]

    def set(self, alias: str, version: str, stamp: Stamp) -> AliasEvent | None:
        """Point ``alias`` at ``version`` (ending a canary of it at 100 %); None when it already did.

        Re-promoting the current target is a no-op so history is not padded with duplicates that
        a rollback would then have to step through.
        """
        self.check_promote(alias, version)
        entry = self.aliases.get(alias)
        if entry is None:
            self.aliases[alias] = AliasEntry(version=version)
            return self._log(alias, stamp, "promote", from_=None, to=version)
        if entry.version == version:
            return None
        self._push_previous(alias, entry.version)
        ended_canary = entry.canary is not None
        self.aliases[alias] = AliasEntry(version=version, shadow=_unless_shadowing(entry.shadow, version))
        return self._log(alias, stamp, "canary-promote" if ended_canary else "promote", from_=entry.version, to=version)

    def start_canary(
        self, alias: str, version: str, weight: float, stamp: Stamp, replace: bool = False
    ) -> AliasEvent | None:
        """Give ``version`` ``weight`` percent of ``alias``' requests; None when that is already so.
        Another version's canary is replaced only with ``replace``."""
        self.check_canary(alias, version, weight, replace)
        entry = self.aliases[alias]
        canary = Canary(version=version, weight=weight)
        if entry.canary == canary:
            return None
        action: Action = "canary-weight" if entry.canary and entry.canary.version == version else "canary-start"
        updated = entry.model_copy(update={"canary": canary})
        self.aliases[alias] = updated
        return self._log(alias, stamp, action, from_=entry.version, to=version, weights=updated.weights())

    def rollback(self, alias: str, stamp: Stamp, expect: str | None = None) -> AliasEvent:
        """End a running canary at 0 %, or else return ``alias`` to its previous target
        (``check_rollback``: refused right after another rollback, unless ``expect`` names what it
        takes out of service)."""
        self.check_rollback(alias, expect)
        entry = self.aliases.get(alias)
        if entry is not None and entry.canary is not None:
            self.aliases[alias] = entry.model_copy(update={"canary": None})
            return self._log(alias, stamp, "canary-rollback", from_=entry.canary.version, to=entry.version)
        past = self.previous.get(alias)
        if entry is None or not past:
            raise StoreError(f"alias {alias!r} has no previous version to roll back to")
        target = past.pop()
        if not past:
            del self.previous[alias]
        self.aliases[alias] = AliasEntry(version=target, shadow=_unless_shadowing(entry.shadow, target))
        return self._log(alias, stamp, "rollback", from_=entry.version, to=target)

    def set_shadow(self, alias: str, version: str | None, fraction: float, stamp: Stamp) -> AliasEvent | None:
        """Shadow ``fraction`` of ``alias``' requests on ``version`` (None: remove the shadow)."""
        entry = self.aliases.get(alias)
        if entry is None:
            raise StoreError(f"alias {alias!r} points nowhere yet: promote a version before adding a shadow")
        old = entry.shadow
        if version is None:
            if old is None:
                return None
            self.aliases[alias] = entry.model_copy(update={"shadow": None})
            return self._log(alias, stamp, "shadow-end", from_=old.version, to=None)
        if version == entry.version:
            raise StoreError(f"{version} is the primary of {alias}: a shadow re-runs requests on another version")
        shadow = Shadow(version=version, fraction=fraction)
        if old == shadow:
            return None
        self.aliases[alias] = entry.model_copy(update={"shadow": shadow})
        return self._log(
            alias, stamp, "shadow-start", from_=old.version if old else None, to=version, fraction=fraction
        )

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, indent 2, trailing newline)."""
        return json.dumps(self.model_dump(by_alias=True), sort_keys=True, indent=2) + "\n"
