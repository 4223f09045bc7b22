"""The memory budget counts loaded versions (every role) and their bytes, without a server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from service.config import Settings
from service.runtime.budget import MemoryBudget
from service.runtime.roles import CANARY, SHADOW, RoleTable

MB = 1_000_000


@dataclass(eq=False)
class Version:
    version: str
    weight_bytes: int = 10 * MB
    role: str = ""

    @property
    def ref(self) -> str:
        return f"m@{self.version}"

    def set_role(self, role: str) -> None:
        self.role = role


@dataclass(eq=False)
class Entry:
    """What the budget reads of a served-set entry."""

    table: RoleTable[Version] = field(default_factory=lambda: RoleTable("m"))
    started: bool = False
    evictable: bool = True

    @property
    def current(self) -> Version | None:
        return self.table.primary


def entry(*versions: str, loading: bool = False, busy: bool = False) -> Any:
    e = Entry(started=bool(versions) or loading, evictable=not busy)
    if versions:
        e.table.load(Version(versions[0]))
        for role, version in zip((CANARY, SHADOW), versions[1:], strict=False):
            held = e.table.held(version)
            e.table.set_side(role, held if held is not None else Version(version))
    return cast(Any, e)


def budget(**settings: Any) -> MemoryBudget:
    return MemoryBudget(Settings(model="a,b,c", **settings))


def test_every_role_counts_and_a_version_in_two_roles_once() -> None:
    b = budget(max_loaded_models=3)
    assert not b.over([entry("v1"), entry("v1", "v2")])
    assert b.over([entry("v1"), entry("v1", "v2", "v3")])
    assert not b.over([entry("v1"), entry("v1", "v2", "v2")])  # the shadow is the canary's version


def test_bytes_count_beside_versions() -> None:
    b = budget(max_loaded_bytes=25 * MB)
    assert not b.over([entry("v1"), entry("v1")]) and b.over([entry("v1"), entry("v1"), entry("v1")])
    assert b.limited and b.at_start(3) == 1  # sizes are unknown before a load: the default alone
    assert not budget().limited and budget().at_start(3) == 3
    assert budget(max_loaded_models=2).at_start(3) == 2


def test_a_load_starts_at_once_within_the_budget_and_beyond_it_only_with_an_idle_model_to_unload() -> None:
    b = budget(max_loaded_models=3)
    default, other, new = entry("v1"), entry("v1"), entry()
    assert b.room_for_load([default, other, new], default)  # 2 + 1 fit
    full = entry("v1", "v2")
    assert b.room_for_load([default, full, new], default)  # one beyond: full is idle
    assert not b.room_for_load([default, entry("v1", "v2", busy=True), new], default)
    assert not b.room_for_load([default, full, entry(loading=True), new], default)  # one load beyond at a time


def test_a_side_role_is_refused_when_it_cannot_fit_beside_the_default() -> None:
    b = budget(max_loaded_models=2)
    default, other = entry("v1"), entry("v1")
    why = b.side_refusal(other, default, 1, 0, [])
    assert why is not None and "3 versions" in why and "max_loaded_models=2" in why
    assert budget(max_loaded_models=3).side_refusal(other, default, 1, 0, []) is None
    # At a first load the primary is not in the table yet: it counts as loaded for it.
    assert budget(max_loaded_models=2).side_refusal(entry(), default, 1, 0, [Version("v1")]) is not None
    sized = budget(max_loaded_bytes=25 * MB)
    assert sized.side_refusal(other, default, 0, 10 * MB, []) is not None  # 30 MB
    assert sized.side_refusal(default, default, 0, 10 * MB, []) is None  # 20 MB
