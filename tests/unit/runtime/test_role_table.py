"""The role table of one served entry, transition by transition, without HTTP or loading."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from clipcore.errors import ClipError, ErrorCode
from model_store.aliases import AliasEntry, Canary, Shadow
from model_store.routing import route
from service.runtime.policy import Quarantine
from service.runtime.roles import CANARY, PRIMARY, SHADOW, RoleTable

KEYS = [f"caller-{i}" for i in range(200)]


@dataclass(eq=False)
class Loaded:
    """A loaded version as the table sees it."""

    version: str
    role: str = "none"

    @property
    def ref(self) -> str:
        return f"m@{self.version}"

    def set_role(self, role: str) -> None:
        self.role = role


def entry(version: str, canary: tuple[str, float] | None = None, shadow: tuple[str, float] | None = None) -> AliasEntry:
    return AliasEntry(
        version=version,
        canary=Canary(version=canary[0], weight=canary[1]) if canary else None,
        shadow=Shadow(version=shadow[0], fraction=shadow[1]) if shadow else None,
    )


def serving(version: str = "v1") -> tuple[RoleTable[Loaded], Loaded]:
    table: RoleTable[Loaded] = RoleTable("m")
    primary = Loaded(version)
    table.follow(entry(version))
    assert table.load(primary) == []
    return table, primary


def with_canary(weight: float = 30.0) -> tuple[RoleTable[Loaded], Loaded, Loaded]:
    table, primary = serving()
    canary = Loaded("v2")
    table.follow(entry("v1", canary=("v2", weight)))
    assert table.set_side(CANARY, canary) == []
    return table, primary, canary


def test_load_makes_the_primary_that_answers_every_caller() -> None:
    table: RoleTable[Loaded] = RoleTable("m")
    with pytest.raises(ClipError) as nothing:
        table.route("k")
    assert nothing.value.code == ErrorCode.not_ready
    table, primary = serving()
    assert primary.role == PRIMARY and table.loaded() == [primary]
    assert {table.route(k) for k in KEYS} == {primary} and table.route(None) is primary
    assert table.answers("k") == "m@v1" and table.shadow_sample() is None


def test_a_hot_swap_gives_back_the_old_primary() -> None:
    table, old = serving()
    new = Loaded("v2")
    table.follow(entry("v2"))
    assert table.load(new) == [old]
    assert table.route("k") is new and table.loaded() == [new]


def test_a_canary_takes_its_callers_and_keeps_each_of_them() -> None:
    table, primary, canary = with_canary(30.0)
    assert canary.role == CANARY
    routed = {k: table.route(k) for k in KEYS}
    expected = {k: canary if route(entry("v1", canary=("v2", 30.0)), k) == "v2" else primary for k in KEYS}
    assert routed == expected
    assert 0 < sum(r is canary for r in routed.values()) < len(KEYS)
    assert all(table.route(k) is routed[k] for k in KEYS)  # sticky: the same key, the same version
    assert {table.answers(k) for k in KEYS} == {"m@v1", "m@v2"} and table.answers(None) is None


def test_a_canary_named_by_the_alias_but_not_loaded_sends_everyone_to_the_primary() -> None:
    table, primary = serving()
    table.follow(entry("v1", canary=("v2", 90.0)))
    assert {table.route(k) for k in KEYS} == {primary}
    assert table.answers("k") == "m@v1"


def test_a_replaced_canary_is_given_back_and_the_new_one_routes() -> None:
    table, primary, first = with_canary()
    second = Loaded("v3")
    table.follow(entry("v1", canary=("v3", 50.0)))
    assert table.set_side(CANARY, second) == [first]
    assert {table.route(k) for k in KEYS} == {primary, second}


def test_an_ended_canary_is_given_back_and_the_primary_answers_everyone() -> None:
    table, primary, canary = with_canary()
    table.follow(entry("v1"))  # a rollback of the canary: it ends at 0 %
    assert table.end_side(CANARY) == [canary]
    assert {table.route(k) for k in KEYS} == {primary}


def test_a_promoted_canary_serves_as_it_is_and_the_old_primary_goes() -> None:
    table, primary, canary = with_canary()
    table.follow(entry("v2"))
    assert table.promote("v2") == [primary]
    assert table.primary is canary and canary.role == PRIMARY and table.canary is None
    assert {table.route(k) for k in KEYS} == {canary}
    with pytest.raises(LookupError):
        table.promote("v9")


def test_a_rollback_of_the_primary_loads_the_previous_version_as_a_swap() -> None:
    table, v1 = serving()
    v2 = Loaded("v2")
    table.follow(entry("v2"))
    table.load(v2)
    back = Loaded("v1")
    table.follow(entry("v1"))
    assert table.load(back) == [v2]
    assert table.route("k") is back


def test_a_shadow_is_sampled_not_routed_and_ends_like_a_canary() -> None:
    table, primary = serving()
    shadow = Loaded("v3")
    table.follow(entry("v1", shadow=("v3", 1.0)))
    assert table.set_side(SHADOW, shadow) == []
    assert shadow.role == SHADOW
    assert {table.route(k) for k in KEYS} == {primary}
    assert table.shadow_sample() == "v3" and table.shadow_of("v3") is shadow and table.shadow_of("v1") is None
    table.follow(entry("v1"))
    assert table.shadow_sample() is None  # the alias ended it: nothing sampled even before the table drops it
    assert table.end_side(SHADOW) == [shadow]
    assert table.shadow_of("v3") is None


def test_a_version_in_two_roles_is_given_back_only_when_it_holds_none() -> None:
    table, primary, canary = with_canary()
    table.follow(entry("v1", canary=("v2", 30.0), shadow=("v2", 0.5)))
    assert table.set_side(SHADOW, canary) == []
    assert canary.role == CANARY and table.loaded() == [primary, canary]  # each once
    assert table.end_side(CANARY) == []  # still the shadow
    assert canary.role == SHADOW
    assert table.end_side(SHADOW) == [canary]


def test_side_roles_need_a_primary_and_a_side_name() -> None:
    table: RoleTable[Loaded] = RoleTable("m")
    with pytest.raises(LookupError):
        table.set_side(CANARY, Loaded("v2"))
    table, _ = serving()
    with pytest.raises(ValueError, match="not a side role"):
        table.set_side(PRIMARY, Loaded("v2"))


def test_evict_empties_every_role_at_once_and_keeps_what_the_alias_named() -> None:
    table, primary, canary = with_canary()
    assert set(table.evict()) == {primary, canary}
    assert table.loaded() == [] and table.primary is None and table.entry is None
    with pytest.raises(ClipError):
        table.route("k")
    assert table.pins("v1") and table.pins("v2") and not table.pins("v3")


def test_a_pinned_version_routes_while_the_alias_serves_it_and_is_unknown_after() -> None:
    table, primary, canary = with_canary()
    assert table.pins("v1") and table.pins("v2")
    assert all(table.route(k, "v2") is canary for k in KEYS[:20])  # whatever the caller's key
    assert table.route("k", "v1") is primary
    table.follow(entry("v1"))
    table.end_side(CANARY)
    with pytest.raises(ClipError) as gone:
        table.route("k", "v2")
    assert gone.value.code == ErrorCode.unknown_model and "m@v1" in gone.value.message
    assert not table.pins("v2")


def test_a_quarantine_holds_only_while_nothing_is_loaded_and_a_load_lifts_it() -> None:
    table: RoleTable[Loaded] = RoleTable("m")
    quarantine = Quarantine.after(None, "v4", ValueError("warm-up failed"), "loading failed (ValueError)", 1.0)
    assert quarantine.refused and quarantine.failures == 1
    table.quarantined(quarantine)
    assert table.quarantine is quarantine
    table.lift()
    assert table.quarantine is None
    again = Quarantine.after(None, "v4", OSError(5, "I/O"), "loading failed (OSError)", 1.0)
    twice = Quarantine.after(again, "v4", OSError(5, "I/O"), "loading failed (OSError)", 1.0)
    assert not twice.refused and twice.failures == 2 and twice.left_s() > 1.5
    table.quarantined(twice)
    table.load(Loaded("v5"))
    assert table.quarantine is None
    with pytest.raises(LookupError):
        table.quarantined(twice)
