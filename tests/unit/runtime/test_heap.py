"""The heap policy: objects alive at a settle are skipped by later collections; a full settle
still collects cycles among them (an unloaded version's)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.runtime.heap import YOUNG_THRESHOLD, collect_young_less_often, settle


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_settle_freezes_what_is_alive() -> None:
    gc.unfreeze()
    settle()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    kept = Node()
    settle()
    assert gc.get_freeze_count() > frozen
    assert kept.other is None


def test_a_frozen_cycle_waits_for_a_full_settle() -> None:
    gone = cycle()
    settle()  # the cycle is garbage already: collected before the freeze
    assert gone() is None

    held = [cycle()]
    a = held[0]()
    assert a is not None
    settle()  # alive now: frozen with its cycle
    del a
    gc.collect()
    assert held[0]() is not None, "an ordinary collection skips frozen objects"
    settle(full=True)
    assert held[0]() is None, "a full settle thaws and collects the cycle"


def test_young_collections_come_less_often_and_the_older_ones_as_they_were() -> None:
    before = gc.get_threshold()
    try:
        # From Python's default: an application started earlier in this process (another test's
        # in-thread server) has already raised it.
        gc.set_threshold(700, *before[1:])
        collect_young_less_often()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert YOUNG_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)
