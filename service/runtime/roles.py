"""The role table of one served entry: which loaded version is its primary, canary and shadow.

Pure bookkeeping, no loading and no I/O: the reconciler (``service.runtime.reconciler``) loads
versions and applies each move here; requests are routed here (``route``). Every transition
returns the versions no role holds any more, for the caller to drain and stop; a version may
hold two roles (a shadow of the canary's version) and is only given back once it holds none.

States of one entry (``docs/design.md``, "Model roles")::

    unloaded --load--> serving(primary) --evict--> unloaded
       |  ^                 |  canary set/replaced/ended, shadow set/ended, promote, rollback
       |  +--lift-----+     |  (a new primary loaded: hot swap, re-timing)
       +--quarantine--> quarantined

Routing: a request that names a version (``name@v5``) gets that version while the alias serves it
as primary or canary, else ``unknown_model``; any other request gets the canary when the alias
routes its caller's key there (``model_store.routing.route``, a stable hash: one caller stays on
one version) and the canary is loaded, else the primary.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from clipcore.errors import ClipError, ErrorCode
from model_store.aliases import AliasEntry
from model_store.routing import route, shadow_target
from service.runtime.policy import Quarantine

__all__ = ["CANARY", "PRIMARY", "ROLES", "SHADOW", "SIDES", "RoleTable", "Versioned"]

# What a loaded version does for its alias: answers every request the canary does not take, a
# weighted share of the callers, or re-runs a sample of the requests after they were answered.
PRIMARY, CANARY, SHADOW = "primary", "canary", "shadow"
SIDES = (CANARY, SHADOW)
ROLES = (PRIMARY, CANARY, SHADOW)


class Versioned(Protocol):
    """What the table needs of a loaded version (``ModelRuntime``; a plain object in unit tests)."""

    @property
    def version(self) -> str: ...

    @property
    def ref(self) -> str: ...

    def set_role(self, role: str) -> None: ...


R = TypeVar("R", bound=Versioned)


class RoleTable(Generic[R]):
    """Primary, canary and shadow of one entry ``name``, the alias entry requests are routed by,
    and the entry's quarantine while it holds nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.primary: R | None = None
        self.sides: dict[str, R | None] = {CANARY: None, SHADOW: None}
        # The alias entry of the last read (None: pinned, or not read yet): requests are routed by it.
        self.entry: AliasEntry | None = None
        # The last alias entry read, kept while unloaded: which versions the alias serves (pins).
        self.known: AliasEntry | None = None
        self.quarantine: Quarantine | None = None

    # ------------------------------------------------------------------ queries
    @property
    def canary(self) -> R | None:
        return self.sides[CANARY] if self.primary is not None else None

    @property
    def shadow(self) -> R | None:
        return self.sides[SHADOW] if self.primary is not None else None

    def loaded(self) -> list[R]:
        """Every loaded version, each once (a shadow may be the canary's version)."""
        held = {id(r): r for r in (self.primary, *self.sides.values()) if r is not None}
        return list(held.values())

    def held(self, version: str) -> R | None:
        """The loaded runtime of ``version`` in any role, if any."""
        return next((r for r in (self.primary, *self.sides.values()) if r is not None and r.version == version), None)

    def serves(self, version: str, role: str = PRIMARY) -> bool:
        """Whether ``version`` is loaded here as the primary (``role`` primary) or the canary."""
        runtime = self.primary if role == PRIMARY else self.canary
        return runtime is not None and runtime.version == version

    def pins(self, version: str) -> bool:
        """Whether a request naming ``version`` belongs here: it is loaded as the primary or
        canary, or (loaded or not) the alias last read names it as its primary or canary."""
        if self.serves(version) or self.serves(version, CANARY):
            return True
        entry = self.entry or self.known
        return entry is not None and version in {entry.version, entry.canary.version if entry.canary else None}

    def route(self, key: str | bytes | None = None, version: str | None = None, ref: str | None = None) -> R:
        """The runtime that answers a request from the caller ``key``: the canary for the callers
        the alias routes to it, else the primary; or, when the request named a ``version``, that
        version if it is the primary or the canary (``unknown_model`` once it is neither: a request
        never gets another version than the one it named). Raises ``not_ready`` while nothing is
        loaded (the caller loads first)."""
        primary, canary = self.primary, self.canary
        if primary is None:
            raise ClipError(ErrorCode.not_ready, f"model {ref or self.name} is not loaded; retry", retry_after=1)
        if version is not None:
            if primary.version == version:
                return primary
            if canary is not None and canary.version == version:
                return canary
            raise ClipError(
                ErrorCode.unknown_model,
                f"model {self.name}@{version} is not served here any more; {ref or self.name} serves {primary.ref}",
                "model",
            )
        if canary is not None and self.entry is not None and route(self.entry, key) == canary.version:
            return canary
        return primary

    def answers(self, key: str | bytes | None) -> str | None:
        """The ``name@version`` that answers the caller ``key`` now; None while nothing is loaded,
        or while a canary splits the callers and ``key`` is None (each request is drawn at random)."""
        primary, canary = self.primary, self.canary
        if primary is None or canary is None or self.entry is None or self.entry.canary is None:
            return primary.ref if primary is not None else None
        if key is None:
            return None
        return canary.ref if route(self.entry, key) == canary.version else primary.ref

    def shadow_sample(self) -> str | None:
        """The shadow version to re-run a request on after answering it (sampled at the shadow's
        fraction), or None; only a loaded shadow is sampled for."""
        shadow = self.shadow
        if shadow is None or self.entry is None:
            return None
        version = shadow_target(self.entry)
        return version if version == shadow.version else None

    def shadow_of(self, version: str) -> R | None:
        """The loaded shadow if it is ``version`` (a shadow run queued for an ended shadow is dropped)."""
        shadow = self.shadow
        return shadow if shadow is not None and shadow.version == version else None

    # ------------------------------------------------------------------ transitions
    def follow(self, entry: AliasEntry | None) -> None:
        """The alias was read: requests are routed by ``entry`` from now on (a new canary weight
        applies at once; a canary the entry no longer names is ended by the next ``end_side``)."""
        self.entry = entry
        if entry is not None:
            self.known = entry

    def load(self, runtime: R) -> list[R]:
        """``runtime`` becomes the primary: the first load, a hot swap, a rollback, a re-timed copy
        of the same version, or a promotion (a loaded canary or shadow: it leaves its side role and
        answers everything as it is). Ends the quarantine."""
        old = self.primary
        for role, side in self.sides.items():
            if side is runtime:
                self.sides[role] = None
        self.primary = runtime
        self.quarantine = None
        return self._relabel([old] if old is not None else [])

    def promote(self, version: str) -> list[R]:
        """The alias moved its primary to ``version``, loaded here as a side role: it serves as it is."""
        runtime = self.held(version)
        if runtime is None or runtime is self.primary:
            raise LookupError(f"{self.name}@{version} is not loaded beside the primary")
        return self.load(runtime)

    def set_side(self, role: str, runtime: R) -> list[R]:
        """``runtime`` becomes the canary or shadow (set, or replacing another version)."""
        if role not in SIDES:
            raise ValueError(f"not a side role: {role}")
        if self.primary is None:
            raise LookupError(f"{self.name} has no primary: a {role} runs beside one")
        old = self.sides[role]
        self.sides[role] = runtime
        return self._relabel([old] if old is not None and old is not runtime else [])

    def end_side(self, role: str) -> list[R]:
        """The alias no longer names a ``role`` (or names another): its version leaves the role."""
        old, self.sides[role] = self.sides[role], None
        return self._relabel([old] if old is not None else [])

    def evict(self) -> list[R]:
        """Unloaded (under a memory budget, or at shutdown): every role empties at once, so no
        request acquires a version after this; the alias last read is kept (``pins``)."""
        runtimes = self.loaded()
        self.primary = None
        self.sides = {CANARY: None, SHADOW: None}
        self.entry = None
        return runtimes

    def quarantined(self, quarantine: Quarantine) -> None:
        """A load of an entry that holds nothing failed: requests get 503 until it ends."""
        if self.primary is not None:
            raise LookupError(f"{self.name} serves {self.primary.ref}: only an entry holding nothing is quarantined")
        self.quarantine = quarantine

    def lift(self) -> None:
        """The quarantine ends (its alias names another version, or a load succeeded)."""
        self.quarantine = None

    def _relabel(self, dropped: list[R]) -> list[R]:
        """Each loaded runtime takes its foremost role; returns those of ``dropped`` no role holds."""
        for role in (SHADOW, CANARY):
            side = self.sides[role]
            if side is not None:
                side.set_role(role)
        if self.primary is not None:
            self.primary.set_role(PRIMARY)
        held = {id(r) for r in self.loaded()}
        return [r for r in dropped if id(r) not in held]
